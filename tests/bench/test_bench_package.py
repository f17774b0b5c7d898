"""`bench/` is a package run from the repository root (`python3 -m bench.decode.spec_decode ...`): no script
changes the import path or imports `tests` (what it shares with the tests lives in `bench/lib/`), and every
command line that runs a script (the suites, the docs, the scripts' own docstrings) runs it as a module."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH_PY = sorted((ROOT / "bench").rglob("*.py"))
# `python3 bench/decode/spec_decode.py`, `.venv/bin/python -u bench/...`: a script run by its path
BY_PATH = re.compile(r"\b(?:\.venv/bin/)?python3?(?:\s+-u)?\s+bench/(?:[a-z0-9_]+/)+[a-z0-9_]+\.py\b")
COMMAND_FILES = sorted(
    [
        *(ROOT / "bench").rglob("*.sh"),
        *BENCH_PY,
        ROOT / "README.md",
        ROOT / "BENCHMARKS.md",
        ROOT / "CONTRIBUTING.md",
        *(ROOT / "docs").glob("*.md"),
    ]
)


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_no_bench_file_changes_the_import_path() -> None:
    """Not at module level, not in a function, not in the code a script hands a child (`python -c`)."""
    touching = [rel(p) for p in BENCH_PY if "sys.path" in p.read_text()]
    assert not touching, f"these bench files change sys.path (run them with -m from the root): {touching}"


def test_no_bench_file_imports_tests() -> None:
    bad = []
    for path in BENCH_PY:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            bad += [f"{rel(path)}:{node.lineno} imports {n}" for n in names if n.split(".")[0] == "tests"]
    assert not bad, "bench imports from tests/ (move what it needs to bench/lib/):\n" + "\n".join(bad)


@pytest.mark.parametrize("path", COMMAND_FILES, ids=rel)
def test_every_command_line_runs_a_bench_script_as_a_module(path: Path) -> None:
    by_path = [
        f"{rel(path)}:{number}: {match.group(0)}"
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        for match in BY_PATH.finditer(line)
    ]
    assert not by_path, "run as `python3 -m bench.<group>.<script>` from the root:\n" + "\n".join(by_path)


def test_every_bench_script_is_a_module() -> None:
    """Each folder is a package, so `-m bench.<group>.<script>` finds every script."""
    missing = [
        rel(p)
        for p in BENCH_PY
        if importlib.util.find_spec(".".join(p.relative_to(ROOT).with_suffix("").parts)) is None
    ]
    assert not missing, missing


def test_a_module_run_from_the_root_needs_no_install() -> None:
    """With site-packages off (-S: no editable install, as on a device machine where the project is not
    installed), `-m` from the root still finds bench and the project's own packages."""
    done = subprocess.run(
        [sys.executable, "-S", "-E", "-m", "bench.decode.eval_shards", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0 and "--shards" in done.stdout, done.stderr
    code = "import dflash_doctor, trainer.runspec.config as c; print(c.__file__)"
    done = subprocess.run(
        [sys.executable, "-S", "-E", "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == str(ROOT / "trainer/runspec/config.py"), (
        done.stderr
    )
