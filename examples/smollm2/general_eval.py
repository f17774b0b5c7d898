"""The general evaluation set for the SmolLM2 example: general prompts from sources the training prompts never
use, none a template twin of a training prompt (issue 56 §2: the chat set's 35 template twins measured
memorised wording, not general chat).

- MT-bench's 80 questions (LMSYS FastChat, Apache-2.0), first turns only, in its eight categories (writing,
  roleplay, reasoning, math, coding, extraction, stem, humanities): the file is kept in this repository,
  `data/mt_bench_question.jsonl` (data/README.md says where from, and why not installed).
- The English trivia questions of chatterbot-corpus 1.3.3 (BSD-3-Clause, a `real-target` extra package,
  read as YAML data: nothing of it runs): the first line of each conversation, where it is a question.

A candidate is left out, and counted by reason, when it is the same text as an earlier one (`duplicate`), is
about what `general_prompts.BLOCKED` keeps out of the chat prompts (`blocked`, chatterbot's questions only), has the skeleton of a
training prompt (`twin`: skeleton.py, numbers, names and quoted strings masked), or is the same as or nearly
the same as a training prompt (`near`: a training prompt holds half of its word 6-grams, overlap.py). The training prompts are the whole
set `prompt_sets.training_prompts` builds, before any `--limit` cut, so the evaluation set does not depend
on it. Standard library (and PyYAML, which the extra's accelerate requires, for chatterbot's files) only.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from examples.smollm2.general_prompts import BLOCKED, package_folder
from examples.smollm2.overlap import NearDuplicates, normalised
from examples.smollm2.skeleton import Skeletons

MT_BENCH_FILE = Path(__file__).resolve().parent / "data" / "mt_bench_question.jsonl"
MT_BENCH_SHA256 = "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7"
CHATTERBOT_PACKAGE, CHATTERBOT_TRIVIA = "chatterbot_corpus", "data/english/trivia.yml"
REASONS = ("duplicate", "blocked", "twin", "near")
# the sources BLOCKED screens: chatterbot's user-contributed questions, as the chat prompts' Quora questions
# are; MT-bench is a curated set, and the list's "kill\w*" would drop its "killer camera" review
SCREENED = ("chatterbot",)


@dataclass(frozen=True)
class Candidate:
    """One prompt of a source, before the checks: id (`<source>/...`), the source's category, the text."""

    id: str
    kind: str
    text: str

    def record(self) -> dict[str, object]:
        """`eval --prompts` reads `prompt` as one user turn; `twin` is false by construction (module docstring)."""
        return {"id": self.id, "kind": self.kind, "twin": False, "prompt": self.text}


@dataclass
class GeneralEval:
    prompts: list[Candidate]
    dropped: dict[str, list[str]] = field(default_factory=dict)  # reason -> the ids left out for it
    candidates: int = 0

    @property
    def by_kind(self) -> dict[str, int]:
        return dict(sorted(Counter(p.kind for p in self.prompts).items()))

    @property
    def by_source(self) -> dict[str, int]:
        return dict(sorted(Counter(p.id.split("/", 1)[0] for p in self.prompts).items()))


def mt_bench(path: Path = MT_BENCH_FILE) -> list[Candidate]:
    """MT-bench's questions, first turns, in file order; the file must be the published one (its sha256)."""
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if path == MT_BENCH_FILE and digest != MT_BENCH_SHA256:
        raise ValueError(f"{path}: sha256 {digest}, not the published MT-bench file's {MT_BENCH_SHA256}")
    found = []
    for line in data.decode("utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            turns = row["turns"]
            if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
                raise ValueError(f"{path}: question {row.get('question_id')} has no first turn")
            found.append(Candidate(f"mt-bench/{int(row['question_id']):03d}", str(row["category"]), turns[0]))
    return found


def chatterbot_trivia_file() -> Path | None:
    """chatterbot-corpus' English trivia file (None when the package is not installed)."""
    folder = package_folder(CHATTERBOT_PACKAGE)
    return None if folder is None else folder / CHATTERBOT_TRIVIA


def chatterbot_trivia(path: Path) -> list[Candidate]:
    """The first line of each conversation of a chatterbot-corpus file, where it is a question (ends with
    "?"), kind "trivia"; its id is the conversation's index in the file."""
    import yaml  # a requirement of accelerate (the real-target extra); only this source needs it

    with open(path, encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    conversations = data.get("conversations") if isinstance(data, dict) else None
    if not isinstance(conversations, list):
        raise ValueError(f"{path}: no conversations list")
    found = []
    for n, conversation in enumerate(conversations):
        first = conversation[0] if isinstance(conversation, list) and conversation else conversation
        if isinstance(first, str) and " ".join(first.split()).endswith("?"):
            found.append(Candidate(f"chatterbot/trivia/{n:03d}", "trivia", " ".join(first.split())))
    return found


def candidates() -> list[Candidate]:
    """Every candidate of both sources, MT-bench first (chatterbot's when the package is installed)."""
    trivia = chatterbot_trivia_file()
    if trivia is None:
        raise FileNotFoundError("chatterbot-corpus is not installed")
    return [*mt_bench(), *chatterbot_trivia(trivia)]


def select(
    found: Iterable[Candidate],
    training: Iterable[str],
    twins: Skeletons | None = None,
    screened: tuple[str, ...] = SCREENED,
) -> GeneralEval:
    """The candidates less those left out (module docstring), in their order, each reason's ids counted.
    `twins`: the training prompts' skeletons, when the caller has them already; `screened`: the sources
    whose text the BLOCKED word list is applied to."""
    found = list(found)
    training = list(training)
    twins = Skeletons(training) if twins is None else twins
    dropped: dict[str, list[str]] = {reason: [] for reason in REASONS}
    kept: list[Candidate] = []
    seen: set[str] = set()
    for candidate in found:
        key = normalised(candidate.text)
        if key in seen:
            dropped["duplicate"].append(candidate.id)
        elif candidate.id.split("/", 1)[0] in screened and BLOCKED.search(candidate.text):
            dropped["blocked"].append(candidate.id)
        else:
            kept.append(candidate)
        seen.add(key)
    near_index = NearDuplicates([c.text for c in kept])
    near = {i for text in training for i in near_index.matching(text, share_of_indexed=True)}
    out = []
    for index, candidate in enumerate(kept):
        if twins.twin(candidate.text):
            dropped["twin"].append(candidate.id)
        elif index in near:
            dropped["near"].append(candidate.id)
        else:
            out.append(candidate)
    return GeneralEval(out, dropped, len(found))


def jsonl(prompts: Iterable[Candidate]) -> str:
    return "".join(json.dumps(p.record(), ensure_ascii=False) + "\n" for p in prompts)
