"""The import graph of the shipped packages against their layer maps: `python3 scripts/import_graph.py`.

Prints the doctor's layers and the trainer's floors with the folders on each, then every arrow between two
folders (how many imports make it), and exits 1 naming each import that points up a map (or between two
folders kept apart) and each circle of modules that import each other. Every import counts, those inside
functions too; one under `if TYPE_CHECKING:` does not (it never runs).

The maps and the parsing live here, once: `tests/test_layers.py` imports them and holds the same rules as
tests (docs/architecture.md draws the maps).
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("dflash_base", "dflash_doctor", "checks", "trainer")

# The doctor's layers: higher numbers sit above lower ones; a module may import its own layer and anything below.
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


def layer_of(module: str) -> str | None:
    """The doctor's layer of a module (`dflash_doctor.launch.gate` -> "launch"); None for one not ours."""
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


def trainer_part(module: str) -> str | None:
    """ "trainer.run.train" -> "run"; "trainer.api" -> "api"; "trainer.__main__" -> "__main__"."""
    parts = module.split(".")
    if parts[0] != "trainer":
        return None
    return parts[1] if len(parts) > 1 else "__main__"


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


def python_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def doctor_upward_imports() -> list[str]:
    """`path:line (layer) imports module (layer)` for each import of the doctor that points up its map."""
    upward = []
    for path in python_files("dflash_doctor"):
        here = module_name(path)
        mine = layer_of(here)
        assert mine is not None
        for target, line, type_only in imports_of(path):
            theirs = layer_of(target)
            if theirs is None or type_only or (here, target) in ALLOWED_UPWARD:
                continue
            if LAYERS[theirs] > LAYERS[mine]:
                upward.append(f"{path.relative_to(ROOT)}:{line} ({mine}) imports {target} ({theirs})")
    return upward


def trainer_upward_imports() -> list[str]:
    """Each import of the trainer that points up its floors, between two folders kept apart, or out to the
    doctor, a check, bench or the tests."""
    bad = []
    for path in python_files("trainer"):
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
    return bad


def import_graph(roots: tuple[str, ...]) -> dict[str, set[str]]:
    """module -> the modules of ours it imports, at module level or inside a function (`ast.walk` sees both:
    an import hidden in a function still ties two modules together)."""
    modules = {module_name(path): path for root in roots for path in python_files(root)}
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


def folder_of(module: str) -> str:
    """The map's unit a module belongs to: a doctor layer's folder, a trainer folder, `dflash_base`, `checks`."""
    if module.startswith("trainer"):
        return f"trainer/{trainer_part(module)}"
    layer = layer_of(module)
    return "dflash_base" if layer == "base" else "checks" if layer == "checks" else f"dflash_doctor/{layer}"


def folder_arrows(graph: dict[str, set[str]]) -> Counter[tuple[str, str]]:
    """(importing folder, imported folder) -> how many module imports make that arrow (within a folder: none)."""
    arrows: Counter[tuple[str, str]] = Counter()
    for here, targets in graph.items():
        for target in targets:
            pair = (folder_of(here), folder_of(target))
            if pair[0] != pair[1]:
                arrows[pair] += 1
    return arrows


def describe_maps() -> list[str]:
    """The doctor's layers and the trainer's floors, top first, with the folders on each."""
    lines = ["the doctor's layers (dflash_doctor/, checks/; a folder imports its own layer and those below):"]
    for number in sorted(set(LAYERS.values()), reverse=True):
        lines.append(f"  {number:>2}  " + "  ".join(name for name, n in LAYERS.items() if n == number))
    lines.append(
        "the trainer's floors (trainer/; apart: "
        + ", ".join(f"{a}-{b}" for a, b in sorted(SIBLINGS_APART) if a < b)
        + "):"
    )
    for number in sorted(set(TRAINER_FLOORS.values()), reverse=True):
        lines.append(
            f"  {number:>2}  " + "  ".join(name for name, n in TRAINER_FLOORS.items() if n == number)
        )
    return lines


def main() -> int:
    graph = import_graph(SHIPPED)
    print("\n".join(describe_maps()))
    print("arrows (folder -> folder it imports: how many modules import across):")
    arrows = folder_arrows(graph)
    for source in sorted({a for a, _ in arrows}):
        targets = sorted((t, n) for (a, t), n in arrows.items() if a == source)
        print(f"  {source} -> " + ", ".join(f"{t} ({n})" for t, n in targets))
    upward = doctor_upward_imports() + trainer_upward_imports()
    cycles = import_cycles(graph)
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} imports between them")
    for line in upward:
        print(f"upward: {line}")
    for cycle in cycles:
        print("circle: " + " <-> ".join(cycle))
    print(f"{len(upward)} upward import(s), {len(cycles)} circle(s)")
    return 1 if upward or cycles else 0


if __name__ == "__main__":
    sys.exit(main())
