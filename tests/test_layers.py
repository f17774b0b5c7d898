"""The layout is the design: every import points down the layer maps (docs/architecture.md; the maps and the
import parsing live in scripts/import_graph.py, which prints the graph and checks the same arrows).

The doctor (`dflash_doctor/`, `checks/`) and the trainer (`trainer/`) each have their floors; they share only
`dflash_base` (stdlib-only). The doctor sees the trainer through its torch-free `trainer.runspec` and, lazily, the
`trainer.api` doorway. A new module that needs something from a higher floor is in the wrong folder; these tests
name the import.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from scripts.import_graph import (
    ALLOWED_UPWARD,
    ROOT,
    TRAINER_FLOORS,
    doctor_upward_imports,
    import_cycles,
    import_graph,
    imports_of,
    layer_of,
    module_level_imports,
    module_name,
    trainer_upward_imports,
)

# What the doctor may import of the trainer: the torch-free description of a run, and the doorway (lazily).
TRAINER_FOR_THE_DOCTOR = ("trainer.runspec", "trainer.api")
# Scripts run by path in another interpreter (an engine's venv, which pins its own torch and has no
# dflash-doctor): they may import nothing of ours at all, not even the core.
RUN_IN_ANOTHER_PYTHON = {
    "dflash_doctor.serving.vllm_loader",
    "dflash_doctor.serving.sglang_loader",
}


def test_every_import_in_dflash_doctor_points_down() -> None:
    upward = doctor_upward_imports()
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


def test_every_import_in_the_trainer_points_down() -> None:
    bad = trainer_upward_imports()
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
                        f"{where}: only trainer.runspec (torch-free) and trainer.api are the doctor's to import"
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
import trainer.runspec
names = [f"trainer.runspec.{m.name}" for m in pkgutil.iter_modules(trainer.runspec.__path__)]
for name in names:
    importlib.import_module(name)
print(json.dumps({"modules": names, "heavy": sorted(m for m in ("torch", "transformers") if m in sys.modules)}))
"""


def test_every_spec_module_imports_without_torch_or_transformers() -> None:
    """The gate reads configs before any worker starts: trainer.runspec must not pull torch in (seconds)."""
    import json
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", SPEC_PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    found = json.loads(out)
    assert "trainer.runspec.config" in found["modules"] and len(found["modules"]) >= 8
    assert found["heavy"] == [], f"importing trainer.runspec.* loaded {found['heavy']}"


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


def test_no_two_modules_import_each_other() -> None:
    """A circle of imports, even one closed by an import inside a function, makes two modules one: neither can
    be read, tested or moved without the other (the old generation <-> kv_engine pair)."""
    cycles = import_cycles(import_graph(("dflash_base", "dflash_doctor", "checks", "trainer")))
    assert not cycles, "modules that import each other (at module level or inside a function):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_the_cycle_finder_finds_a_planted_circle(tmp_path: Path) -> None:
    """The detector itself: a circle closed inside a function is found, a straight chain is not."""
    graph = {"a": {"b"}, "b": {"c"}, "c": set(), "d": {"e"}, "e": {"d"}}
    assert import_cycles(graph) == [["d", "e"]]
    package = tmp_path / "planted"
    package.mkdir()
    (package / "one.py").write_text("import planted.two\n")
    (package / "two.py").write_text("def late():\n    from planted.one import x\n")
    found = import_graph_of(package)
    assert import_cycles(found) == [["planted.one", "planted.two"]]


def import_graph_of(package: Path) -> dict[str, set[str]]:
    """`import_graph` for a folder outside the repository (the planted-circle test)."""
    modules = {f"{package.name}.{p.stem}": p for p in sorted(package.glob("*.py"))}
    return {
        here: {t for t, _, _ in imports_of(path) if t in modules and t != here}
        for here, path in modules.items()
    }


def test_the_import_graph_script_prints_the_maps_and_passes(capsys: pytest.CaptureFixture[str]) -> None:
    """`python3 scripts/import_graph.py`: the evidence anyone can re-run; exit 0 on this tree."""
    from scripts.import_graph import main

    assert main() == 0
    out = capsys.readouterr().out
    assert "the trainer's floors" in out and "trainer/regenerate -> " in out
    assert out.rstrip().endswith("0 upward import(s), 0 circle(s)")
