"""The layout is the design: every import inside `dflash_doctor/` points down the layer map (docs/architecture.md).

A new module that needs something from a higher layer is in the wrong folder; this test names the import.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Higher numbers sit above lower ones; a module may import its own layer and anything below.
LAYERS = {
    "base": -1,
    "core": 0,
    "env": 1,
    "deep": 1,
    "libs": 2,
    "cache": 2,
    "audit": 3,
    "lock": 3,
    "launch": 4,
    "trainer": 4,
    "serving": 4,
}
LAYERS |= {"commands": 5, "checks": 5, "cli": 6}

# Imports that cross upward on purpose, each with its reason.
ALLOWED_UPWARD = {
    # The registry discovers the checks that plug into it (imported lazily, inside a function).
    ("dflash_doctor.registry", "checks"),
    # A script run by path in the audited interpreter: it imports the trainer in that other process.
    ("dflash_doctor.cache.warm_child", "trainer.spec.config"),
    ("dflash_doctor.cache.warm_child", "trainer.run.warmup"),
}
# Scripts run by path in another interpreter (an engine's venv, which pins its own torch and has no
# dflash-doctor): they may import nothing of ours at all, not even the core.
RUN_IN_ANOTHER_PYTHON = {
    "dflash_doctor.serving.vllm_loader",
    "dflash_doctor.serving.sglang_loader",
}


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "dflash_base":
        return "base"
    if parts[0] in ("checks", "trainer"):
        return parts[0]
    if parts[0] != "dflash_doctor":
        return None
    if len(parts) == 1 or (parts[1] not in LAYERS and parts[1] not in ("cli", "__main__")):
        return "core"
    return "cli" if parts[1] in ("cli", "__main__") else parts[1]


def imports_of(path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, type-checking only) for every absolute import in a file."""
    tree = ast.parse(path.read_text())
    type_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for stmt in block.body
        for node in ast.walk(stmt)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
            if node.module == "dflash_doctor":  # `from dflash_doctor import paths` imports a submodule
                names = [f"dflash_doctor.{alias.name}" for alias in node.names]
            found += [(name, node.lineno, id(node) in type_only) for name in names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, node.lineno, id(node) in type_only) for alias in node.names]
    return found


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def test_every_import_in_dflash_doctor_points_down() -> None:
    upward = []
    for path in sorted((ROOT / "dflash_doctor").rglob("*.py")):
        here = module_name(path)
        mine = layer_of(here)
        assert mine is not None
        for target, line, type_only in imports_of(path):
            theirs = layer_of(target)
            if theirs is None or type_only or (here, target) in ALLOWED_UPWARD:
                continue
            if LAYERS[theirs] > LAYERS[mine]:
                upward.append(f"{path.relative_to(ROOT)}:{line} ({mine}) imports {target} ({theirs})")
    assert not upward, "imports that point up the layer map:\n" + "\n".join(upward)


@pytest.mark.parametrize("module", sorted(RUN_IN_ANOTHER_PYTHON))
def test_scripts_run_in_another_python_import_nothing_of_ours(module: str) -> None:
    path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    ours = [f"{target} (line {line})" for target, line, _ in imports_of(path) if layer_of(target) is not None]
    assert not ours, f"{path.relative_to(ROOT)} runs in an engine's python, where {ours} cannot be imported"


@pytest.mark.parametrize("path", sorted((ROOT / "checks").glob("*.py")), ids=lambda p: p.name)
def test_no_check_imports_another_check(path: Path) -> None:
    others = [t for t, _, _ in imports_of(path) if t.startswith("checks.") or t == "checks"]
    assert not others, f"{path.name} imports {others}: shared code belongs in a dflash_doctor subpackage"


def test_every_subpackage_says_what_it_owns_and_may_import() -> None:
    for init in sorted((ROOT / "dflash_doctor").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        if init.parent.name == "commands":
            assert doc, "commands/__init__.py needs a docstring"
            continue
        assert "Owns" in doc or "Module map" in doc, f"{init.parent.name}/__init__.py: say what it owns"
        assert "May import" in doc, f"{init.parent.name}/__init__.py: say what it may import"


def test_the_shared_base_imports_only_the_standard_library() -> None:
    """`dflash_base` is what the doctor and the trainer share; it imports neither, nor anything outside stdlib."""
    bad = []
    for path in sorted((ROOT / "dflash_base").rglob("*.py")):
        for target, line, _ in imports_of(path):
            top = target.split(".")[0]
            if top != "dflash_base" and top not in sys.stdlib_module_names:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not bad, "dflash_base must import the standard library only:\n" + "\n".join(bad)


SHIPPED = ("dflash_base", "dflash_doctor", "trainer", "checks")


def test_nothing_shipped_imports_bench() -> None:
    """`bench/` is not installed: a shipped module that imports it works in the checkout and fails for users."""
    bad = []
    for package in SHIPPED:
        for path in sorted((ROOT / package).rglob("*.py")):
            for target, line, _ in imports_of(path):
                if target.split(".")[0] == "bench":
                    bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not bad, "shipped code must not import bench/:\n" + "\n".join(bad)
