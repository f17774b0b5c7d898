"""The SmolLM2 example's general evaluation set (issue 56 §2): the MT-bench file kept in the repository, the checks that leave candidates out, and, with the `real-target`
extra installed, the real set against every training prompt and the chat set's twin marks (skipped, saying
why, without it: building the training prompts takes ~20 s, once for the module)."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import pytest

from examples.smollm2 import general_eval, general_prompts, prompt_sets, sources
from examples.smollm2.general_eval import Candidate, select
from examples.smollm2.skeleton import Skeletons, skeleton

# ---------------------------------------------------------------- MT-bench, kept in the repository


def test_mt_bench_is_the_published_file_and_gives_80_first_turns() -> None:
    data = general_eval.MT_BENCH_FILE.read_bytes()
    assert hashlib.sha256(data).hexdigest() == general_eval.MT_BENCH_SHA256 and len(data) == 48_929
    questions = general_eval.mt_bench()
    assert len(questions) == 80 and len({q.id for q in questions}) == 80
    assert Counter(q.kind for q in questions) == {
        kind: 10
        for kind in ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
    }
    assert questions[0].id == "mt-bench/081" and questions[0].text.startswith(
        "Compose an engaging travel blog"
    )
    assert all(q.text.strip() and len(q.text) < 2000 for q in questions)


def test_an_edited_mt_bench_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    edited = tmp_path / "question.jsonl"
    edited.write_bytes(general_eval.MT_BENCH_FILE.read_bytes().replace(b"Hawaii", b"Hawai'i"))
    monkeypatch.setattr(general_eval, "MT_BENCH_FILE", edited)
    with pytest.raises(ValueError, match="not the published MT-bench file"):
        general_eval.mt_bench(edited)


def test_chatterbot_trivia_takes_the_first_line_of_each_conversation_that_asks(tmp_path: Path) -> None:
    pytest.importorskip(
        "yaml", reason="PyYAML (the real-target extra's accelerate requires it) reads the file"
    )
    path = tmp_path / "trivia.yml"
    path.write_text(
        "categories:\n- trivia\nconversations:\n"
        "- - Who was the 37th President of the United States?\n  - Richard Nixon\n"
        "- - Dolphins use a sense, similar to sonar, to find things.\n  - Echolocation\n"
        "- The space race was between what two rivals,\n    for supremacy in spaceflight?\n"
        "- - What year was it?\n  - '1963'\n",
        encoding="utf-8",
    )
    found = general_eval.chatterbot_trivia(path)
    assert [(c.id, c.kind) for c in found] == [
        ("chatterbot/trivia/000", "trivia"),
        ("chatterbot/trivia/002", "trivia"),
        ("chatterbot/trivia/003", "trivia"),
    ]
    assert found[1].text == "The space race was between what two rivals, for supremacy in spaceflight?"


# ---------------------------------------------------------------- what leaves a candidate out


def test_select_leaves_out_duplicates_blocked_twins_and_near_training_prompts() -> None:
    found = [
        Candidate("mt-bench/001", "math", "What is 17 + 25?"),  # twin: the training set asks 3 + 4
        Candidate("chatterbot/trivia/000", "trivia", "What is the name of the nearest major galaxy?"),
        Candidate("chatterbot/trivia/001", "trivia", "what is the name of the nearest  major galaxy?"),
        Candidate("chatterbot/trivia/002", "trivia", "In which city did the poet commit suicide?"),
        Candidate("mt-bench/002", "roleplay", "Pretend you are a hired killer of bugs in a garden."),
        Candidate(
            "mt-bench/003",
            "writing",
            "Write a descriptive paragraph about a bustling marketplace full of smells and sounds.",
        ),  # near: a training prompt holds it, wording changed at its end
        Candidate(
            "mt-bench/004",
            "extraction",
            "Evaluate the following movie reviews on a scale of 1 to 5, with 1 being very negative.",
        ),  # not near: the training prompt "On a scale of 1 to 10?" is a fragment of it, not the other way
    ]
    training = [
        "What is 3 + 4?",
        "Please write a descriptive paragraph about a bustling marketplace full of smells and colours.",
        "On a scale of 1 to 10?",
    ]
    chosen = select(found, training)
    assert [c.id for c in chosen.prompts] == ["chatterbot/trivia/000", "mt-bench/002", "mt-bench/004"]
    assert chosen.dropped == {
        "duplicate": ["chatterbot/trivia/001"],
        "blocked": ["chatterbot/trivia/002"],  # MT-bench is not screened: its "killer" stays
        "twin": ["mt-bench/001"],
        "near": ["mt-bench/003"],
    }
    assert chosen.candidates == 7 and chosen.by_kind == {"extraction": 1, "roleplay": 1, "trivia": 1}
    assert chosen.by_source == {"chatterbot": 1, "mt-bench": 2}
    assert Candidate("x/1", "math", "Hi?").record() == {
        "id": "x/1",
        "kind": "math",
        "twin": False,
        "prompt": "Hi?",
    }


# ---------------------------------------------------------------- the real sets (the real-target extra)


@pytest.fixture(scope="module")
def real() -> dict[str, object]:
    """The training prompts built as prepare.py builds them (all of them, before any --limit), the chat set,
    and the general set's candidates, from the installed extra."""
    if missing := sources.missing_modules():
        pytest.skip(f"needs the real-target extra (missing: {', '.join(missing)})")
    problems = prompt_sets.read_humaneval(sources.humaneval_file())
    general = general_prompts.split(general_prompts.load_material(sources.mimesis_datasets()))
    training = prompt_sets.training_prompts(problems, general=general)
    texts = [p.text for p in training.uncut]
    return {
        "general": general,
        "texts": texts,
        "twins": Skeletons(texts),
        "candidates": general_eval.candidates(),
    }


def test_the_real_general_set_has_no_twin_in_the_training_prompts(real: dict[str, object]) -> None:
    twins = real["twins"]
    assert isinstance(twins, Skeletons)
    chosen = select(real["candidates"], real["texts"], twins)  # type: ignore[arg-type]
    prompts = chosen.prompts
    assert len(prompts) >= 100 and len({p.id for p in prompts}) == len(prompts)
    assert all(p.kind and p.kind.strip() == p.kind and p.text.strip() for p in prompts)
    assert not [p.id for p in prompts if twins.twin(p.text)]
    skeletons = {skeleton(t) for t in real["texts"]}  # type: ignore[attr-defined]
    assert not {skeleton(p.text) for p in prompts} & skeletons
    assert chosen.by_source == {"chatterbot": 256, "mt-bench": 80}  # the pinned versions' counts
    assert {reason: len(ids) for reason, ids in chosen.dropped.items()} == {
        "duplicate": 0,
        "blocked": 2,
        "twin": 0,
        "near": 0,
    }


def test_the_chat_sets_template_twins_are_marked(real: dict[str, object]) -> None:
    records = prompt_sets.chat_eval_records(real["general"], real["twins"])  # type: ignore[arg-type]
    assert all(list(r) == ["id", "kind", "twin", "messages"] for r in records)
    twins = Counter(str(r["kind"]) for r in records if r["twin"])
    # issue 56's 35 (every writing and arithmetic prompt), and the word and other-code prompts, whose only
    # slot is a quoted string; two translations whose sentences differ from a training one's in a name
    assert twins == {"writing": 20, "arithmetic": 15, "other-code": 15, "word": 10, "translate": 2}
    assert not [r["id"] for r in records if r["kind"] == "question" and r["twin"]]
