"""The SmolLM2 example's prompt sets: built from the standard library and the language reference, in the format
`data regenerate` reads, deterministic, and never sharing a function name or text with HumanEval."""

from __future__ import annotations

import ast
import gzip
import json
import re
from pathlib import Path

import pytest

from examples.smollm2 import prompt_sets
from examples.smollm2.prompt_sets import (
    CODE_REQUEST,
    TESTS_REQUEST,
    HumanEvalProblem,
    humaneval_prompts,
    read_humaneval,
    topic_sections,
    training_prompts,
)
from trainer.regenerate.conversations import parse_record

HUMANEVAL_LIKE = HumanEvalProblem(
    "HumanEval/0",
    "from typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
    '    """ Check if in given list of numbers, are any two numbers closer to each other than\n'
    '    given threshold.\n    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)\n    False\n    """\n',
    "has_close_elements",
)
DOC = "Return the number of items in the sequence that are larger than the given limit, in order."


def _module(body: str) -> str:
    return body.strip() + "\n"


@pytest.fixture
def fake_stdlib(tmp_path: Path) -> Path:
    """A small standard library: kept functions, a name HumanEval uses, a HumanEval docstring, a duplicate,
    and files that must be skipped (tests, private modules, undocumented or private functions)."""
    root = tmp_path / "lib"
    (root / "pkg").mkdir(parents=True)
    (root / "test").mkdir()
    (root / "alpha.py").write_text(
        _module(f'''
def count_larger(items, limit=0):
    """{DOC}"""
    return 0

def has_close_elements(xs):
    """Same name as a HumanEval problem, so it must never reach training prompts at all."""

def other(numbers, threshold):
    """ Check if in given list of numbers, are any two numbers closer to each other than
    given threshold.
    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)
    False
    """

def _private(x):
    """A private function is not a public API and is left out of the prompts entirely."""

def short(x):
    """Too short."""

class Box:
    def open_lid(self, force: bool = False) -> str:
        """Open the lid of the box, forcing it when asked, and return what was inside."""

    def shake(self, times):
        total = 0
        for _ in range(times):
            total += len(self.contents) if self.contents else 1
        self.shaken = total
        return "rattled" if total > 3 else "quiet"
''')
    )
    (root / "pkg" / "__init__.py").write_text(
        _module(f'''
def count_larger(items, limit=0):
    """{DOC}"""
''')
    )
    (root / "_hidden.py").write_text(
        'def visible(a, b):\n    """A private module is left out, whatever it holds here."""\n'
    )
    (root / "test" / "test_x.py").write_text(
        'def helper(a):\n    """Test helpers are not API, left out of the set."""\n'
    )
    (root / "broken.py").write_text("def (:\n")
    return root


TOPICS = {
    "assert": (
        'The "assert" statement\n**********************\n\nAssert statements are a convenient way to insert '
        "debugging assertions into a program, and they are removed when optimisation is requested.\n\n"
        '   assert_stmt ::= "assert" expression\n'
    ),
    "pass": 'Intro text that belongs to no section.\n\nThe "pass" statement\n********************\n\n'
    '"pass" is a null operation; when it is executed, nothing happens at all, which is useful as a '
    "placeholder.\n",
}


def _ids(prompts: list[prompt_sets.Prompt]) -> list[str]:
    return [p.id for p in prompts]


def test_training_prompts_leave_out_humaneval_duplicates_and_non_api(fake_stdlib: Path) -> None:
    built = training_prompts([HUMANEVAL_LIKE], root=fake_stdlib, topics=TOPICS)
    assert sorted(_ids(built.prompts)) == [
        "source/alpha.Box.shake",
        "stdlib/alpha.Box.open_lid",
        "stdlib/alpha.count_larger",
        "tests/alpha.Box.open_lid",
        "tests/alpha.count_larger",
        "topic/assert/0.0",
        "topic/pass/0.0",
    ]
    # left out: has_close_elements' and other's code and tests requests and other's source (HumanEval's name
    # or docstring); pkg.count_larger's code and tests requests (the same text as alpha's)
    counts = (
        built.code,
        built.tests,
        built.source,
        built.explain,
        built.dropped_leaks,
        built.dropped_duplicates,
    )
    assert counts == (2, 2, 1, 2, 5, 2)
    texts = {p.id: p.text for p in built.prompts}
    assert texts["stdlib/alpha.count_larger"] == CODE_REQUEST.format(
        code=f'def count_larger(items, limit=0):\n    """{DOC}"""\n'
    )
    assert "def open_lid(self, force: bool=False) -> str:" in texts["stdlib/alpha.Box.open_lid"]
    assert texts["topic/pass/0.0"].splitlines()[2] == 'The "pass" statement'
    assert texts["tests/alpha.count_larger"] == TESTS_REQUEST.format(
        code=f'def count_larger(items, limit=0):\n    """{DOC}"""\n'
    )
    shake = re.search(r"```python\n(.*)```", texts["source/alpha.Box.shake"], re.DOTALL)
    assert shake is not None and shake.group(1).startswith("def shake(self, times):\n    total = 0\n")
    ast.parse(shake.group(1))  # a method's source, dedented as a whole


def test_the_set_is_deterministic_and_a_limit_is_a_prefix(fake_stdlib: Path) -> None:
    first = training_prompts([HUMANEVAL_LIKE], root=fake_stdlib, topics=TOPICS)
    again = training_prompts([HUMANEVAL_LIKE], root=fake_stdlib, topics=TOPICS)
    assert [p.record() for p in first.prompts] == [p.record() for p in again.prompts]
    cut = training_prompts([HUMANEVAL_LIKE], limit=3, root=fake_stdlib, topics=TOPICS)
    assert _ids(cut.prompts) == _ids(first.prompts)[:3]


def test_records_are_what_data_regenerate_reads(fake_stdlib: Path) -> None:
    built = training_prompts([HUMANEVAL_LIKE], root=fake_stdlib, topics=TOPICS)
    lines = prompt_sets.jsonl([*built.prompts, *humaneval_prompts([HUMANEVAL_LIKE])]).splitlines()
    records = [parse_record(n, line) for n, line in enumerate(lines, start=1)]
    assert [r.id for r in records] == [*_ids(built.prompts), "HumanEval/0"]
    assert all(r.messages[0]["role"] == "user" and len(r.messages) == 1 for r in records)


def test_humaneval_is_worded_like_the_training_requests(tmp_path: Path) -> None:
    path = tmp_path / "HumanEval.jsonl.gz"
    row = {
        "task_id": HUMANEVAL_LIKE.task_id,
        "prompt": HUMANEVAL_LIKE.prompt,
        "entry_point": "has_close_elements",
    }
    with gzip.open(path, "wt") as handle:
        handle.write(json.dumps(row) + "\n")
    (prompt,) = humaneval_prompts(read_humaneval(path))
    assert prompt.text == CODE_REQUEST.format(code=HUMANEVAL_LIKE.prompt)


def test_topic_sections_start_at_underlined_titles() -> None:
    text = "preamble\n\nTitle one\n=========\n\nBody one.\n\nTitle two\n---------\nBody two.\n\nUnder\n--\n"
    assert topic_sections(text) == [("Title one", "Body one."), ("Title two", "Body two.\n\nUnder\n--")]


def test_this_pythons_library_gives_thousands_of_parseable_non_leaking_prompts() -> None:
    """The real material (this interpreter's standard library and pydoc topics), against a HumanEval-like
    problem set built from names the library really has."""
    problems = [
        HUMANEVAL_LIKE,
        HumanEvalProblem(
            "HumanEval/x", 'def median(l: list):\n    """Return median of elements."""\n', "median"
        ),
    ]
    built = training_prompts(problems)
    assert len(built.prompts) >= 8000 and built.explain >= 100 and built.dropped_leaks >= 1
    assert min(built.code, built.tests, built.source) >= 2000
    assert len(set(_ids(built.prompts))) == len(built.prompts)
    names = set()
    for prompt in built.prompts:
        if prompt.id.startswith(("stdlib/", "tests/", "source/")):
            code = re.search(r"```python\n(.*)```", prompt.text, re.DOTALL)
            assert code is not None, prompt.id
            tree = ast.parse(code.group(1))  # every stub is valid Python
            names.add(tree.body[0].name)  # type: ignore[attr-defined]
    assert not names & {"median", "has_close_elements"}


def test_function_segments_are_what_ast_gives_over_lines_split_once() -> None:
    """The build's own `get_source_segment` (one line split per module): the same text for functions and
    methods, one-line ones, non-ASCII text before a column, and CRLF or CR line ends."""
    source = (
        "class Café:\r\n    def naïve(self, x):  # é\r\n        return 'ü' * x\r\n\r\n"
        "    async def twice(self): return 2\n\ndef tab():\n\tpass\rx = 1\n"
    )
    tree = ast.parse(source)
    nodes = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    lines = prompt_sets.source_lines(source)
    assert len(nodes) == 3 and "".join(lines) == source
    for node in nodes:
        assert prompt_sets._segment(lines, node) == ast.get_source_segment(source, node, padded=True)
