"""Functions, methods and classes of the shipped packages that nothing shipped uses: `python scripts/unused_code.py`.

A name is used when it appears anywhere else (a call, an attribute, an import, a decorator's argument) in the
code that counts; a definition whose name appears nowhere else is unused. Name-based, like vulture: a
name shared by two definitions keeps both alive, so it finds no false "unused", only misses some. Each finding
is one of:

- `dead`: called nowhere, not even in tests, bench or scripts;
- `tests only`: kept alive only by tests (a test helper or oracle that belongs in `tests/`);
- `bench only`: used by a benchmark or a script in the repository but by nothing shipped.

Exit 1 when a definition is dead or used by tests only and is not in KEPT (with its reason); `--all` lists
the KEPT ones too. Registered functions (`@check(...)`, `@app.command(...)`, a typer callback), dunder
methods and overrides of a library's hooks count as used.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("dflash_base", "dflash_doctor", "checks", "trainer")
TESTS = ("tests",)
OTHERS = ("bench", "scripts", "examples")

# Decorators that register what they decorate: the registry or the CLI calls it, never by name.
REGISTERING = ("check", "command", "callback")

# Unused by name, kept on purpose: (path, name) -> why.
KEPT: dict[tuple[str, str], str] = {
    ("trainer/data/pretokenize.py", "write_pretokenized"): "a documented API for users who pre-tokenise "
    "their data (docs/trainer.md; the chat loader's hint names it)",
    ("trainer/data/prefetch.py", "settle"): "the prefetcher's lead for tests and benchmarks (its docstring); "
    "without it the tests reach into its private delivery",
    ("trainer/eval/prompts.py", "chat_prompts"): "trainer/eval is being rewritten with the eval command "
    "(issue 55, the lead's part)",
    ("dflash_doctor/env/record_audit.py", "audited_rows"): "what bench/check/stat_survey.py measures",
    (
        "trainer/eval/proposers.py",
        "WholeContextProposer",
    ): "the reference bench/decode/context_cache.py and its "
    "test hold DFlashProposer to (trainer/eval is the lead's part of issue 55)",
}


def python_files(roots: tuple[str, ...]) -> list[Path]:
    """The Python files under these folders (not this script: its KEPT table names what it finds)."""
    return [
        p
        for root in roots
        for p in sorted((ROOT / root).rglob("*.py"))
        if ".venv" not in p.parts and p != Path(__file__).resolve()
    ]


def registered(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in REGISTERING:
            return True
    return False


def definitions(path: Path) -> list[tuple[str, int, str]]:
    """(name, line, kind) of every function, method and class defined in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = node.name
            if (name.startswith("__") and name.endswith("__")) or registered(node):
                continue
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            found.append((name, node.lineno, kind))
    return found


def names_used(paths: list[Path]) -> Counter[str]:
    """How often each identifier appears, definitions included (a definition counts once for its own name)."""
    counts: Counter[str] = Counter()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name):
                counts[node.id] += 1
            elif isinstance(node, ast.Attribute):
                counts[node.attr] += 1
            elif isinstance(node, ast.alias):
                counts[node.name.rpartition(".")[2]] += 1
                if node.asname:
                    counts[node.asname] += 1
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                counts[node.name] += 1
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                counts[node.value] += 1  # getattr(x, "name"), __all__, a monkeypatch by name
    return counts


def findings() -> list[tuple[str, str, int, str, str]]:
    """(verdict, path, line, kind, name) of every definition nothing shipped uses."""
    shipped_files = python_files(SHIPPED)
    shipped, tests, others = (names_used(python_files(r)) for r in (SHIPPED, TESTS, OTHERS))
    defined = Counter(name for path in shipped_files for name, _, _ in definitions(path))
    out = []
    for path in shipped_files:
        for name, line, kind in definitions(path):
            if shipped[name] > defined[name]:  # appears beyond its own definitions
                continue
            verdict = "bench only" if others[name] else "tests only" if tests[name] else "dead"
            out.append((verdict, str(path.relative_to(ROOT)), line, kind, name))
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="list the KEPT definitions too")
    args = parser.parse_args(argv)
    unexplained = 0
    for verdict, path, line, kind, name in findings():
        why = KEPT.get((path, name))
        if why is None and verdict != "bench only":
            unexplained += 1
        if why is None or args.all:
            print(f"{verdict:10}  {path}:{line}  {kind} {name}" + (f"  (kept: {why})" if why else ""))
    print(f"{unexplained} unused definition(s) without a reason in KEPT", file=sys.stderr)
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
