"""The SmolLM2 example's general-chat prompts: the package readers on small fixtures, the split by item into
training and the chat evaluation set, the n-gram rule that keeps them apart, the dedup across sources and
the shuffle's mix. The real set (>= 50,000 prompts, >= 1/3 not about Python) is the slow test at the end."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from examples.smollm2 import general_prompts as gp
from examples.smollm2 import prompt_sets
from examples.smollm2.general_prompts import GeneralPrompt, GeneralSet, Material
from examples.smollm2.overlap import NGRAM, NearDuplicates, ngrams, normalised, template_ngrams
from examples.smollm2.prompt_sets import HumanEvalProblem, training_prompts

HUMANEVAL = HumanEvalProblem(
    "HumanEval/0", 'def add(a: int, b: int) -> int:\n    """Add two numbers a and b."""\n', "add"
)


def _held(prefix: str, want: bool, count: int, item: str = "{}") -> list[str]:
    """`count` names that are (want=True) or are not held apart, found by trying `prefix_0`, `prefix_1`...;
    `item` is how the split names the item (a function name `n` is the item `Lua: n`)."""
    found, n = [], 0
    while len(found) < count:
        name = f"{prefix}_{n}"
        if gp.held_apart(item.format(name)) == want:
            found.append(name)
        n += 1
    return found


def _write(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")


@pytest.fixture
def datasets(tmp_path: Path) -> Path:
    """mimesis' `datasets/` layout, a few items of each list."""
    root = tmp_path / "datasets"
    questions = [
        "How do I learn to bake bread at home?",
        "what is the best way to learn french on your own?",
        "Too short?",
        "Why do people like watching porn so much?",  # blocked
        "This one is not a question at all, it has no mark",
    ]
    _write(
        root / "en" / "text.json",
        {"questions": questions, "words": ["Harbor", "ox", "harbor", "mo-dem", "lantern"]},
    )
    _write(
        root / "en" / "food.json",
        {"dishes": ["Kimchi"], "drinks": ["Pisco Sour"], "fruits": ["Mango"], "vegetables": []},
    )
    _write(
        root / "en" / "person.json",
        {"occupation": ["Baker", "Baker"], "names": {"female": ["Ada"], "male": ["Bo"]}},
    )
    _write(root / "en" / "address.json", {"city": ["Wheeling"]})
    _write(root / "es" / "text.json", {"text": ["Tengo mucho que hacer hoy.", "Tengo mucho que hacer hoy."]})
    _write(root / "de" / "text.json", {"words": ["kein Text"]})
    return root


def test_read_mimesis_takes_its_lists_as_data(datasets: Path) -> None:
    material = gp.read_mimesis(datasets)
    assert material.lists["occupation"] == ["Baker", "Baker"] and material.lists["city"] == ["Wheeling"]
    assert material.names == ["Ada", "Bo"] and material.sentences == {
        "Spanish": ["Tengo mucho que hacer hoy."] * 2,
        "German": [],
    }
    prompts = list(gp.requests(material))
    ids = [p.id for p in prompts]
    assert len(ids) == len(set(ids))
    questions = [p.text for p in prompts if p.kind == "question"]
    assert questions == [
        "How do I learn to bake bread at home?",
        "What is the best way to learn french on your own?",
    ]
    assert sorted(p.item for p in prompts if p.kind == "word") == [
        "harbor",
        "lantern",
    ]  # short, non-words, repeats out
    assert Counter(p.kind for p in prompts) == {"question": 2, "writing": 9, "word": 2, "translate": 1}
    assert "mimesis/writing/occupation1/baker" in ids and "mimesis/translate/spanish/00000" in ids


def test_a_damaged_mimesis_file_raises(tmp_path: Path) -> None:
    (tmp_path / "en").mkdir()
    (tmp_path / "en" / "text.json").write_text("[1, 2]")
    with pytest.raises((ValueError, OSError)):
        gp.read_mimesis(tmp_path)


def test_pygments_builtins_are_read_from_its_lexer_tables() -> None:
    pytest.importorskip("pygments", reason="Pygments (real-target extra) ships the builtin tables")
    found = gp.read_pygments_builtins()
    assert set(found) == {language for language, _, _ in gp.PYGMENTS_TABLES.values()}
    names, snippets = found["PHP"]
    assert "array_map" in names and snippets
    # sorted: some tables are sets, whose order changes with PYTHONHASHSEED (and the dedup's choice with it)
    assert all(names == sorted(set(names)) for names, _ in found.values())


def test_held_apart_items_never_reach_training_and_fill_the_eval_set() -> None:
    held, kept = _held("Occupation", True, 3), _held("Occupation", False, 5)
    material = Material(lists={"occupation": held + kept}, names=["Ada", "Bo", "Cy"])
    material.builtins = {"Lua": (_held("fn", True, 20, "Lua: {}") + _held("fn", False, 2, "Lua: {}"), True)}
    built = gp.split(material, arithmetic=16)
    train_items = {p.item for p in built.train}
    assert not train_items & set(held) and set(kept) <= train_items
    assert Counter(p.kind for p in built.train) == {"writing": 15, "other-code": 4, "arithmetic": 16}
    evaluation = Counter(p.kind for p in built.evaluation)
    assert evaluation == {"writing": 3, "other-code": gp.EVAL_PER_KIND["other-code"], "arithmetic": 15}
    assert built.held_apart_items == 3 + 20
    # one prompt per held item, none of them in training
    assert {p.item for p in built.evaluation if p.kind == "writing"} == set(held)
    assert not {p.text for p in built.evaluation} & {p.text for p in built.train}


def test_arithmetic_is_seeded_and_the_eval_seed_differs() -> None:
    names = ["Ada", "Bo", "Cy"]
    first = list(gp.arithmetic_problems(24, 1, names, "train"))
    assert [p.text for p in first] == [p.text for p in gp.arithmetic_problems(24, 1, names, "train")]
    assert not {p.text for p in first} & {p.text for p in gp.arithmetic_problems(24, 2, names, "eval")}
    assert len({p.text for p in first}) == 24 and all(p.id.startswith("arithmetic/train/") for p in first)


# ---------------------------------------------------------------- the n-gram rule


def test_near_duplicates_fire_on_the_same_and_nearly_the_same_text() -> None:
    question = "What are the main differences between a crocodile and an alligator in the wild?"
    near = NearDuplicates([question])
    assert near.matches("  what ARE the main differences between a crocodile and an alligator in the wild? ")
    # the last word changed: all but one of the six-word n-grams are still shared
    assert near.matches("What are the main differences between a crocodile and an alligator in the zoo?")
    assert not near.matches("What are the main differences between a frog and a toad in a garden pond?")
    assert not near.matches("Crocodile?")  # too short for n-grams, and not the same text


def test_template_wording_does_not_count_as_overlap() -> None:
    template = "Translate this {language} sentence into English, then explain any word a learner might not know:\n\n{text}"
    boiler = template_ngrams([template])
    assert ("translate", "this", "\x00", "sentence", "into", "english,") not in boiler  # none spans a slot
    assert ("sentence", "into", "english,", "then", "explain", "any") in boiler
    evaluation = template.format(language="Dutch", text="Hij eet een appel.")
    training = template.format(language="Dutch", text="Ik zie niet wat er veranderd is.")
    assert NearDuplicates([evaluation]).matches(training)  # without the templates, the wording alone matches
    assert not NearDuplicates([evaluation], [template]).matches(training)
    assert NearDuplicates([evaluation], [template]).matches(evaluation)


def test_wording_common_to_several_eval_prompts_is_boilerplate() -> None:
    stem = "please answer the following question carefully and in detail:"
    evaluation = [f"{stem} topic {n}" for n in range(3)]
    assert len(ngrams(stem)) == len(stem.split()) - NGRAM + 1
    assert not NearDuplicates(evaluation).matches(f"{stem} something else entirely")
    assert NearDuplicates(evaluation[:2]).matches(f"{stem} something else entirely")


# ---------------------------------------------------------------- with the Python prompts


def _general(train: list[GeneralPrompt], evaluation: list[GeneralPrompt]) -> GeneralSet:
    return GeneralSet(train, evaluation, 0)


def test_training_is_deduplicated_across_sources_and_kept_apart_from_the_chat_set(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    question = "How long should I boil an egg so that the yolk stays soft?"
    general = _general(
        [
            GeneralPrompt("mimesis/question/00001", "question", question, question),
            GeneralPrompt("other/question/7", "question", question, question.upper()),  # the same, normalised
            GeneralPrompt("mimesis/question/00002", "question", "q", "How long should I boil an egg so that the yolk stays runny?"),
            GeneralPrompt("mimesis/question/00003", "question", "q3", "Which birds can recognise themselves in a mirror?"),
            GeneralPrompt("pygments/other-code/lua/explain/pairs", "other-code", "Lua: pairs", "Explain what `pairs` does in Lua, with a short example."),
        ],
        [GeneralPrompt("mimesis/question/00009", "question", "e", "How long should I boil an egg so that the yolk stays soft and warm?")],
    )  # fmt: skip
    built = training_prompts([HUMANEVAL], root=lib, topics={}, general=general)
    assert sorted(p.id for p in built.prompts) == [
        "mimesis/question/00003",
        "pygments/other-code/lua/explain/pairs",
    ]
    assert (built.dropped_eval_overlap, built.dropped_duplicates) == (3, 0)
    assert built.by_kind == {"other-code": 1, "question": 1} and built.non_python == 2
    assert built.by_source == {"mimesis": 1, "pygments": 1}
    assert normalised(question) not in {normalised(p.text) for p in built.prompts}


def test_the_same_text_from_two_sources_is_kept_once(tmp_path: Path) -> None:
    text = 'Explain what the word "lantern" means, and use it in two example sentences.'
    general = _general(
        [GeneralPrompt("mimesis/word/lantern", "word", "lantern", text), GeneralPrompt("other/word/lantern", "word", "x", text.lower())],
        [],
    )  # fmt: skip
    built = training_prompts([HUMANEVAL], root=tmp_path, topics={}, general=general)
    assert [p.id for p in built.prompts] == ["mimesis/word/lantern"] and built.dropped_duplicates == 1


def test_any_prefix_of_the_shuffled_set_mixes_the_kinds(tmp_path: Path) -> None:
    kinds = ("question", "writing", "word", "translate", "other-code", "arithmetic")
    train = [
        GeneralPrompt(
            f"mimesis/{kind}/{n:04d}", kind, f"{kind} {n}", f"A request of kind {kind} about item number {n}."
        )
        for kind in kinds
        for n in range(200)
    ]  # sorted by kind: a prefix of the unshuffled list would be one kind only
    built = training_prompts([HUMANEVAL], root=tmp_path, topics={}, general=_general(train, []))
    assert len(built.prompts) == 1200
    for size in (60, 300):
        counts = Counter(p.id.split("/")[1] for p in built.prompts[:size])
        assert set(counts) == set(kinds) and max(counts.values()) < 3 * size / len(kinds)
    cut = training_prompts([HUMANEVAL], limit=60, root=tmp_path, topics={}, general=_general(train, []))
    assert [p.id for p in cut.prompts] == [p.id for p in built.prompts[:60]]
    assert sum(cut.by_kind.values()) == 60


# ---------------------------------------------------------------- the real set (slow)


@pytest.mark.slow
def test_the_real_set_has_50k_distinct_prompts_a_third_not_python_and_none_near_evaluation() -> None:
    from examples.smollm2 import sources

    if missing := sources.missing_modules():
        pytest.skip(f"needs the real-target extra (missing: {', '.join(missing)})")
    problems = prompt_sets.read_humaneval(sources.humaneval_file())
    general = gp.split(gp.load_material(sources.mimesis_datasets()))
    built = training_prompts(problems, general=general)
    texts = [normalised(p.text) for p in built.prompts]
    assert len(set(texts)) == len(texts) >= 50_000 and len({p.id for p in built.prompts}) == len(texts)
    assert built.non_python >= len(texts) / 3
    chat = prompt_sets.chat_eval_prompts(general)
    assert len(chat) >= 100
    evaluation = [p.text for p in prompt_sets.humaneval_prompts(problems)] + [p.text for p in chat]
    near = NearDuplicates(evaluation, [*prompt_sets.REQUESTS, *gp.templates()])
    assert not [p.id for p in built.prompts if near.matches(p.text)]
    assert not set(texts) & {normalised(t) for t in evaluation}
