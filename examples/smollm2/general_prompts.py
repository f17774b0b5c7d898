"""General-chat prompts for the SmolLM2 example: everyday questions, writing, word explanations, translations,
other languages' code and arithmetic, from two packages of the `real-target` extra (SOURCES.md beside this
file names them and their licences), split into training prompts and a held-apart evaluation set.

- mimesis 22.2.0 (MIT) ships JSON data files: 4,900 real English questions (Quora-style), dishes, drinks,
  fruits, vegetables, occupations, US cities, a common-word list, first names, and short sentences in a
  dozen languages. The questions and sentences are used as they are; the lists fill short request templates
  ("Write a short cover letter for a job as a {occupation}.").
- Pygments 2.21.0 (BSD-2-Clause) ships the builtin function names of other languages' lexers (PHP, MySQL,
  Lua, Julia, Scheme, Objective-C's Cocoa classes...): each becomes an "explain this function" request, and
  for the common languages a "write a snippet" request too.
- Arithmetic word problems: a few templates filled with seeded numbers and mimesis' first names, a small
  share of the set (ARITHMETIC_TRAIN).

The evaluation split is by item, not by prompt: an item (a question, an occupation, a function name...) is
held apart when the sha256 of its normalised text falls in 1/HOLD_APART of the range, and then none of its
prompts is a training prompt; the chat set takes the first EVAL_PER_KIND of each kind's held-apart items
(by that digest). Its arithmetic problems come from another seed, its ids say `eval`. The files are read as
data (JSON, and the lexers' name tables): nothing of either package runs. Standard library only.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from examples.smollm2.overlap import normalised

HOLD_APART = 40  # one item in this many goes to the evaluation side
EVAL_PER_KIND = {
    "question": 50,
    "writing": 20,
    "word": 10,
    "translate": 10,
    "other-code": 15,
    "arithmetic": 15,
}
ARITHMETIC_TRAIN = 2000
ARITHMETIC_SEED, ARITHMETIC_EVAL_SEED = 1, 2
MIN_WORD_LENGTH = 5
# questions about sex, drugs, suicide and the like: not what a drafter's example chat should be built from
BLOCKED = re.compile(
    r"\b(sex\w*|porn\w*|rimjob|nude\w*|naked|penis|vagina|masturbat\w*|suicid\w*|kill\w*|rape\w*|drugs?|"
    r"weed|marijuana|cocaine|boobs?|dick|fuck\w*|shit\w*|horny|virgin\w*|orgasm\w*|erotic\w*)\b",
    re.IGNORECASE,
)
LANGUAGES = {  # mimesis locale -> the language's English name (regional variants share the base data)
    "ar": "Arabic", "az": "Azerbaijani", "de": "German", "el": "Greek", "es": "Spanish", "et": "Estonian",
    "fi": "Finnish", "fr": "French", "hr": "Croatian", "hu": "Hungarian", "is": "Icelandic", "it": "Italian",
    "ja": "Japanese", "ko": "Korean", "nl": "Dutch", "no": "Norwegian", "pl": "Polish", "pt": "Portuguese",
    "ru": "Russian", "sv": "Swedish", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese",
}  # fmt: skip
WRITING = {  # mimesis list -> request templates, {} the item
    "occupation": (
        "What does a {} do on a typical working day?",
        "Write a short cover letter for a job as a {}.",
        "What skills and training does someone need to become a {}?",
    ),
    "city": ("Write a short postcard to a friend from a weekend trip to {}.", "Plan a relaxed day out in {}."),
    "dish": ("Give me a simple recipe for {}, with a list of ingredients.", "Describe {} to someone who has never tried it."),
    "drink": ("How is {} made, and when is it usually served?",),
    "fruit": ("What are some healthy ways to eat more {}?",),
    "vegetable": ("Suggest an easy weeknight dinner that uses {}.",),
}  # fmt: skip
WORD_REQUEST = 'Explain what the word "{}" means, and use it in two example sentences.'
TRANSLATE_REQUEST = "Translate this {language} sentence into English, then explain any word a learner might not know:\n\n{text}"
EXPLAIN_NAME = "Explain what `{name}` does in {language}, with a short example."
SNIPPET_NAME = "Write a short {language} example that uses `{name}`, and explain each line."
# Pygments module -> (language, the tables of builtin names to take, whether to ask for snippets too)
PYGMENTS_TABLES = {
    "_php_builtins": ("PHP", ("MODULES",), True),
    "_mysql_builtins": ("MySQL", ("MYSQL_FUNCTIONS",), True),
    "_postgres_builtins": ("PostgreSQL", ("KEYWORDS",), True),
    "_tsql_builtins": ("T-SQL", ("FUNCTIONS",), True),
    "_googlesql_builtins": ("GoogleSQL", ("functionnames",), False),
    "_lua_builtins": ("Lua", ("MODULES",), True),
    "_julia_builtins": ("Julia", ("BUILTIN_LIST",), True),
    "_cocoa_builtins": ("Objective-C (Cocoa)", ("COCOA_INTERFACES",), False),
    "_cl_builtins": ("Common Lisp", ("BUILTIN_FUNCTIONS", "MACROS"), False),
    "_scheme_builtins": ("Scheme", ("scheme_builtins",), False),
    "_vbscript_builtins": ("VBScript", ("BUILTIN_FUNCTIONS",), False),
    "_stan_builtins": ("Stan", ("FUNCTIONS", "DISTRIBUTIONS"), False),
    "_stata_builtins": ("Stata", ("builtins_functions",), False),
    "_scilab_builtins": ("Scilab", ("functions_kw",), False),
    "_csound_builtins": ("Csound", ("OPCODES",), False),
}
_NAME = re.compile(r"^[A-Za-z_][\w.:$-]*$")


@dataclass(frozen=True)
class GeneralPrompt:
    """A request and what it is: its kind (question, writing, ...) and the item it was built from."""

    id: str  # "<source>/<kind>/...": the package it came from first
    kind: str
    item: str  # the real thing the split is made on (a question, an occupation, a function name)
    text: str


@dataclass
class Material:
    """What the packages ship, as plain lists (fixtures in the tests, the installed packages for real)."""

    questions: list[str] = field(default_factory=list)
    lists: dict[str, list[str]] = field(default_factory=dict)  # WRITING's keys -> items
    words: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # first names, for the arithmetic problems
    sentences: dict[str, list[str]] = field(default_factory=dict)  # language name -> sentences
    builtins: dict[str, tuple[list[str], bool]] = field(default_factory=dict)  # language -> (names, snippets)


# ---------------------------------------------------------------- reading the packages


def package_folder(module: str) -> Path | None:
    """Where an installed package lives, found without importing it (None when it is not installed)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _json(path: Path) -> dict[str, object]:
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


def _strings(value: object) -> list[str]:
    return [v.strip() for v in value if isinstance(v, str) and v.strip()] if isinstance(value, list) else []


def read_mimesis(datasets: Path) -> Material:
    """mimesis' `datasets/` folder -> its questions, lists, words, names and other languages' sentences."""
    text, food, person = (_json(datasets / "en" / f"{n}.json") for n in ("text", "food", "person"))
    address = _json(datasets / "en" / "address.json")
    names = person.get("names")
    material = Material(
        questions=_strings(text.get("questions")),
        lists={
            "occupation": _strings(person.get("occupation")),
            "city": _strings(address.get("city")),
            "dish": _strings(food.get("dishes")),
            "drink": _strings(food.get("drinks")),
            "fruit": _strings(food.get("fruits")),
            "vegetable": _strings(food.get("vegetables")),
        },
        words=_strings(text.get("words")),
        names=sorted({n for v in names.values() for n in _strings(v)}) if isinstance(names, dict) else [],
    )
    for locale, language in LANGUAGES.items():
        path = datasets / locale / "text.json"
        if path.is_file():
            material.sentences[language] = _strings(_json(path).get("text"))
    return material


def read_pygments_builtins() -> dict[str, tuple[list[str], bool]]:
    """PYGMENTS_TABLES' names from the installed Pygments (data modules: lists and dicts of names)."""
    found: dict[str, tuple[list[str], bool]] = {}
    for module, (language, tables, snippets) in PYGMENTS_TABLES.items():
        loaded = importlib.import_module(f"pygments.lexers.{module}")
        names: list[str] = []
        for table in tables:
            value = getattr(loaded, table)
            for entry in value.values() if isinstance(value, dict) else [value]:
                names.extend(str(n) for n in entry)
        found[language] = (sorted(set(names)), snippets)  # some tables are sets: their order varies by run
    return found


# ---------------------------------------------------------------- the requests


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "x"


def digest(item: str) -> int:
    return int.from_bytes(hashlib.sha256(normalised(item).encode()).digest()[:8], "big")


def held_apart(item: str) -> bool:
    """Whether an item belongs to the evaluation side (the same answer for the same item, everywhere)."""
    return digest(item) % HOLD_APART == 0


def _usable_question(q: str) -> bool:
    return q.endswith("?") and len(q.split()) >= 5 and not BLOCKED.search(q)


def requests(material: Material) -> Iterator[GeneralPrompt]:
    """Every request the material gives, held-apart items included (`split` separates them)."""
    for n, q in enumerate(material.questions):
        if _usable_question(q):
            yield GeneralPrompt(f"mimesis/question/{n:05d}", "question", q, q[0].upper() + q[1:])
    for key, templates in WRITING.items():
        for item in dict.fromkeys(material.lists.get(key, [])):
            for t, template in enumerate(templates):
                yield GeneralPrompt(
                    f"mimesis/writing/{key}{t}/{_slug(item)}", "writing", item, template.format(item)
                )
    for word in dict.fromkeys(w.lower() for w in material.words):
        if word.isalpha() and len(word) >= MIN_WORD_LENGTH:
            yield GeneralPrompt(f"mimesis/word/{word}", "word", word, WORD_REQUEST.format(word))
    for language, sentences in material.sentences.items():
        for n, sentence in enumerate(dict.fromkeys(sentences)):
            text = TRANSLATE_REQUEST.format(language=language, text=sentence)
            yield GeneralPrompt(f"mimesis/translate/{_slug(language)}/{n:05d}", "translate", sentence, text)
    for language, (names, snippets) in material.builtins.items():
        for name in dict.fromkeys(names):
            if not _NAME.match(name):
                continue
            stem = f"pygments/other-code/{_slug(language)}"
            item = f"{language}: {name}"
            yield GeneralPrompt(
                f"{stem}/explain/{name}",
                "other-code",
                item,
                EXPLAIN_NAME.format(name=name, language=language),
            )
            if snippets:
                yield GeneralPrompt(
                    f"{stem}/snippet/{name}",
                    "other-code",
                    item,
                    SNIPPET_NAME.format(name=name, language=language),
                )


ARITHMETIC = (
    "{a} has {x} marbles. {b} gives {a} {y} more, and then {a} loses {z}. How many marbles does {a} have now?",
    "A bakery sells muffins for ${x} each. {a} buys {y} muffins and pays with a ${big} note. How much change does {a} get?",
    "{a} reads {x} pages a day. How many days does {a} need to finish a book of {total} pages?",
    "A train travels at {x} km per hour for {y} hours, then at {z} km per hour for {w} hours. How far does it go in total?",
    "{a} and {b} share {total} stickers so that {a} gets {x} more than {b}. How many stickers does each get?",
    "A garden is {x} metres long and {y} metres wide. A path {z} metre wide runs around the outside. What is the area of the path?",
    "{a} saves ${x} every week. After {y} weeks, {a} spends ${z} on a bike. How much money is left?",
    "A box holds {x} rows of {y} eggs. {a} breaks {z} of them. How many whole eggs are left?",
)  # fmt: skip


def arithmetic_problems(count: int, seed: int, names: list[str], tag: str) -> Iterator[GeneralPrompt]:
    """Word problems with seeded numbers (so their answers are integers and positive) and real first names."""
    rng = random.Random(seed)
    people = names or ["Alex", "Sam"]
    for n in range(count):
        template = ARITHMETIC[n % len(ARITHMETIC)]
        x, y, z, w = rng.randint(3, 60), rng.randint(2, 12), rng.randint(1, 9), rng.randint(2, 6)
        a, b = rng.sample(people, 2) if len(people) > 1 else (people[0], people[0])
        total = (rng.randint(20, 400) // 2) * 2 + (x % 2) if "share" in template else x * rng.randint(4, 30)
        values = {
            "a": a,
            "b": b,
            "x": x,
            "y": y,
            "z": min(z, x),
            "w": w,
            "total": total,
            "big": 10 * (x * y // 10 + 1),
        }
        text = template.format(**values)
        yield GeneralPrompt(f"arithmetic/{tag}/{n:05d}", "arithmetic", text, text)


@dataclass
class GeneralSet:
    train: list[GeneralPrompt]
    evaluation: list[GeneralPrompt]
    held_apart_items: int  # items whose prompts were kept out of training


def split(material: Material, arithmetic: int = ARITHMETIC_TRAIN) -> GeneralSet:
    """Training prompts (items not held apart, and the training arithmetic) and the chat evaluation set (the
    first EVAL_PER_KIND held-apart items of each kind, one prompt each, and the evaluation arithmetic)."""
    train: list[GeneralPrompt] = []
    held: dict[str, dict[str, GeneralPrompt]] = {}
    for prompt in requests(material):
        if held_apart(prompt.item):
            held.setdefault(prompt.kind, {}).setdefault(normalised(prompt.item), prompt)
        else:
            train.append(prompt)
    train.extend(arithmetic_problems(arithmetic, ARITHMETIC_SEED, material.names, "train"))
    evaluation: list[GeneralPrompt] = []
    for kind, count in EVAL_PER_KIND.items():
        if kind == "arithmetic":
            evaluation.extend(arithmetic_problems(count, ARITHMETIC_EVAL_SEED, material.names, "eval"))
            continue
        chosen = sorted(held.get(kind, {}).values(), key=lambda p: (digest(p.item), p.id))[:count]
        evaluation.extend(sorted(chosen, key=lambda p: p.id))
    return GeneralSet(train, evaluation, sum(len(v) for v in held.values()))


def load_material(mimesis_datasets: Path, with_builtins: bool = True) -> Material:
    material = read_mimesis(mimesis_datasets)
    if with_builtins:
        material.builtins = read_pygments_builtins()
    return material


def templates() -> list[str]:
    """Every request template this module fills (their wording is boilerplate to overlap.NearDuplicates)."""
    writing = [t for group in WRITING.values() for t in group]
    return [*writing, WORD_REQUEST, TRANSLATE_REQUEST, EXPLAIN_NAME, SNIPPET_NAME, *ARITHMETIC]
