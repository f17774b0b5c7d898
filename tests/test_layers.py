"""The layout is the design: every import points down the layer maps (docs/architecture.md).

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
    ("dflash_doctor.cache.warm_child", "trainer.runspec.config"),
    ("dflash_doctor.cache.warm_child", "trainer.api"),
}
# The trainer's floors (a module may import its own floor and any below). Some folders on one floor, or on
# floors one above the other, never import each other: training (`run`) and the inference engine (`engine`)
# share a floor; `data regenerate` and `eval` both sit on the engine and know nothing of each other or of
# training.
TRAINER_FLOORS = {
    "runspec": 0,
    "kernels": 1,
    "model": 2,
    "target_model": 3,
    "data": 4,
    "run": 5,
    "engine": 5,
    "regenerate": 6,
    "eval": 6,
    "api": 7,
    "__main__": 8,
}
SIBLINGS_APART = {
    ("run", "engine"),
    ("engine", "run"),
    ("regenerate", "eval"),
    ("eval", "regenerate"),
    ("regenerate", "run"),
    ("eval", "run"),
}
# What the doctor may import of the trainer: the torch-free description of a run, and the doorway (lazily).
TRAINER_FOR_THE_DOCTOR = ("trainer.runspec", "trainer.api")
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


def import_graph(roots: tuple[str, ...]) -> dict[str, set[str]]:
    """module -> the modules of ours it imports, at module level or inside a function (`ast.walk` sees both:
    an import hidden in a function still ties two modules together)."""
    modules = {module_name(path): path for root in roots for path in sorted((ROOT / root).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for here, path in modules.items():
        targets = set()
        for target, _, type_only in imports_of(path):
            if type_only:
                continue
            # `from a.b import c` may import the module a.b.c or the name c of a.b: the longest known module wins
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != here and not here.startswith(target + "."):
                targets.add(target)
        graph[here] = targets
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle of the graph, each as its modules in order (Tarjan's strongly connected components: a
    component of two or more modules is a circle of imports)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


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
