"""The layout is the design: every import points down the layer maps (docs/architecture.md).

The doctor (`dflash_doctor/`, `checks/`) and the trainer (`trainer/`) each have their floors; they share only
`dflash_base` (stdlib-only). The doctor sees the trainer through its torch-free `trainer.spec` and, lazily, the
`trainer.api` doorway. A new module that needs something from a higher floor is in the wrong folder; these tests
name the import.
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
    ("dflash_doctor.cache.warm_child", "trainer.api"),
}
# The trainer's floors (a module may import its own floor and any below); `run` and `decode` share a floor
# and never import each other.
TRAINER_FLOORS = {
    "spec": 0,
    "model": 1,
    "target_model": 2,
    "data": 3,
    "run": 4,
    "decode": 4,
    "api": 5,
    "__main__": 6,
}
SIBLINGS_APART = {("run", "decode"), ("decode", "run")}
# What the doctor may import of the trainer: the torch-free description of a run, and the doorway (lazily).
TRAINER_FOR_THE_DOCTOR = ("trainer.spec", "trainer.api")
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


def module_level_imports(path: Path) -> set[int]:
    """Lines of the imports a module runs when it is imported (not those inside functions)."""
    tree = ast.parse(path.read_text())
    lines: set[int] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import | ast.ImportFrom):
                lines.add(node.lineno)
            elif isinstance(node, ast.If | ast.Try | ast.With):
                for body in ("body", "orelse", "finalbody", "handlers"):
                    for child in getattr(node, body, []):
                        visit(child.body if isinstance(child, ast.ExceptHandler) else [child])

    visit(tree.body)
    return lines


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


def test_the_doctor_imports_no_check() -> None:
    """Checks plug into the doctor, which reaches them only through the registry's discovery: an analysis a
    command and a check share lives in `audit/` (commands/ and checks/ share a layer, so the map alone
    would let a command import a check)."""
    bad = []
    for path in sorted((ROOT / "dflash_doctor").rglob("*.py")):
        here = module_name(path)
        for target, line, _ in imports_of(path):
            is_check = target == "checks" or target.startswith("checks.")
            if is_check and (here, target) not in ALLOWED_UPWARD:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not bad, (
        "the doctor imports a check (shared analysis belongs in dflash_doctor/audit/):\n" + "\n".join(bad)
    )


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


def trainer_part(module: str) -> str | None:
    """ "trainer.run.train" -> "run"; "trainer.api" -> "api"; "trainer.__main__" -> "__main__"."""
    parts = module.split(".")
    if parts[0] != "trainer":
        return None
    return parts[1] if len(parts) > 1 else "__main__"


def test_every_import_in_the_trainer_points_down() -> None:
    bad = []
    for path in sorted((ROOT / "trainer").rglob("*.py")):
        here = trainer_part(module_name(path)) or "__main__"
        if here == "__init__":
            continue
        for target, line, type_only in imports_of(path):
            where = f"{path.relative_to(ROOT)}:{line} ({here})"
            if target.split(".")[0] in ("dflash_doctor", "checks", "bench", "tests"):
                bad.append(f"{where} imports {target}: the trainer shares only dflash_base with the doctor")
                continue
            there = trainer_part(target)
            if there is None or there == "__main__" or type_only:
                continue
            if TRAINER_FLOORS[there] > TRAINER_FLOORS[here] or (here, there) in SIBLINGS_APART:
                bad.append(f"{where} imports {target} ({there})")
    assert not bad, "imports that point up the trainer's floors:\n" + "\n".join(bad)


def test_the_doctor_sees_the_trainer_through_spec_and_the_api_only() -> None:
    bad = []
    for root in ("dflash_doctor", "checks"):
        for path in sorted((ROOT / root).rglob("*.py")):
            loaded_at_import = module_level_imports(path)
            for target, line, type_only in imports_of(path):
                if not (target == "trainer" or target.startswith("trainer.")):
                    continue
                where = f"{path.relative_to(ROOT)}:{line} imports {target}"
                if not target.startswith(TRAINER_FOR_THE_DOCTOR):
                    bad.append(
                        f"{where}: only trainer.spec (torch-free) and trainer.api are the doctor's to import"
                    )
                elif target.startswith("trainer.api") and line in loaded_at_import and not type_only:
                    bad.append(
                        f"{where} at module level: trainer.api imports torch; import it inside the command"
                    )
    assert not bad, "\n".join(bad)


def test_every_trainer_folder_says_what_it_owns_and_may_import() -> None:
    for init in sorted((ROOT / "trainer").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "Owns" in doc, f"trainer/{init.parent.name}/__init__.py: say what it owns"
        assert "May import" in doc, f"trainer/{init.parent.name}/__init__.py: say what it may import"
    assert {p.parent.name for p in (ROOT / "trainer").glob("*/__init__.py")} == set(TRAINER_FLOORS) - {
        "api",
        "__main__",
    }, "a trainer folder without a floor in TRAINER_FLOORS (or a floor without a folder)"


SPEC_PROBE = """
import importlib, json, pkgutil, sys
import trainer.spec
names = [f"trainer.spec.{m.name}" for m in pkgutil.iter_modules(trainer.spec.__path__)]
for name in names:
    importlib.import_module(name)
print(json.dumps({"modules": names, "heavy": sorted(m for m in ("torch", "transformers") if m in sys.modules)}))
"""


def test_every_spec_module_imports_without_torch_or_transformers() -> None:
    """The gate reads configs before any worker starts: trainer.spec must not pull torch in (seconds)."""
    import json
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", SPEC_PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    found = json.loads(out)
    assert "trainer.spec.config" in found["modules"] and len(found["modules"]) >= 8
    assert found["heavy"] == [], f"importing trainer.spec.* loaded {found['heavy']}"


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
