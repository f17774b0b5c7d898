"""What `import torch` dlopens by full path before its C extension: `_preload_cuda_deps`.

torch/__init__.py walks every `sys.path` entry and dlopens the first `nvidia/<folder>/lib/<glob>`
(then `nvidia/cu<major>/lib/<glob>`, then `<folder>/lib/<glob>`) for a list of CUDA libraries that
changes between versions. We read that list and the calling convention from the audited torch's own
source, so the simulation follows the torch that is installed, not the one we remember.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass

# torch 2.11+ (REFERENCE.md section 1), used when the source cannot be read.
DOCUMENTED_LIBS: tuple[tuple[str, str], ...] = (
    ("cublas", "libcublasLt.so.*[0-9]"),
    ("cublas", "libcublas.so.*[0-9]"),
    ("cudnn", "libcudnn.so.*[0-9]"),
    ("cuda_nvrtc", "libnvrtc.so.*[0-9]"),
    ("cuda_nvrtc", "libnvrtc-builtins.so.*[0-9]"),
    ("cuda_runtime", "libcudart.so.*[0-9]"),
    ("cuda_cupti", "libcupti.so.*[0-9]"),
    ("cufft", "libcufft.so.*[0-9]"),
    ("curand", "libcurand.so.*[0-9]"),
    ("nvjitlink", "libnvJitLink.so.*[0-9]"),
    ("cusparse", "libcusparse.so.*[0-9]"),
    ("cusparselt", "libcusparseLt.so.*[0-9]"),
    ("cusolver", "libcusolver.so.*[0-9]"),
    ("nccl", "libnccl.so.*[0-9]"),
    ("nvshmem", "libnvshmem_host.so.*[0-9]"),
    ("cufile", "libcufile.so.*[0-9]"),
)


@dataclass(frozen=True)
class PreloadPlan:
    """How this torch preloads CUDA libraries.

    ``libs``: (folder, glob) in order; a failing dlopen stops the rest (torch swallows the error).
    ``optional``: looked up after ``libs`` (e.g. nvtx), best effort.
    ``on_success``: preload also when `libtorch_global_deps.so` loaded fine (2.11+: all of ``libs``;
    older: only ``on_success_libs``). Otherwise torch preloads only after that load failed.
    ``cu_major_folder``: whether `nvidia/cu<major>/lib` is searched (2.9+).
    ``source``: where the plan came from (a file, or "documented").
    """

    libs: tuple[tuple[str, str], ...]
    optional: tuple[tuple[str, str], ...] = ()
    on_success: bool = True
    on_success_libs: tuple[tuple[str, str], ...] = ()
    cu_major_folder: bool = True
    source: str = "documented"

    @property
    def success_path_libs(self) -> tuple[tuple[str, str], ...]:
        if not self.on_success:
            return ()
        return self.on_success_libs or self.libs + self.optional


DOCUMENTED_PLAN = PreloadPlan(DOCUMENTED_LIBS, (("nvtx", "libnvToolsExt.so.*[0-9]"),))


def _function_source(text: str, name: str) -> str | None:
    match = re.search(rf"^def {name}\(.*?(?=^\S|\Z)", text, re.S | re.M)
    return match.group(0) if match else None


def _string_pairs(node: ast.AST) -> list[tuple[str, str]]:
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return []
    if isinstance(value, dict):
        value = list(value.items())
    if not isinstance(value, list):
        return []
    return [
        (a, b)
        for a, b in (item for item in value if isinstance(item, tuple) and len(item) == 2)
        if isinstance(a, str) and isinstance(b, str)
    ]


def _call_name(node: ast.Call) -> str | None:
    return node.func.id if isinstance(node.func, ast.Name) else None


def _literal_args(node: ast.Call) -> tuple[str, str] | None:
    args = [a.value for a in node.args[:2] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return (args[0], args[1]) if len(args) == 2 else None


def parse_preload_plan(init_source: str, source: str = "torch/__init__.py") -> PreloadPlan | None:
    """Read the plan out of torch/__init__.py's text; None when it is not recognisable."""
    preload_src = _function_source(init_source, "_preload_cuda_deps")
    global_src = _function_source(init_source, "_load_global_deps")
    if preload_src is None or global_src is None:
        return None
    try:
        preload_tree, global_tree = ast.parse(preload_src), ast.parse(global_src)
    except SyntaxError:
        return None
    libs: list[tuple[str, str]] = []
    optional: list[tuple[str, str]] = []
    for tree in (preload_tree, global_tree):
        for node in ast.walk(tree):
            target: ast.expr | None = None
            if isinstance(node, ast.AnnAssign):
                target, value = node.target, node.value
            elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            if isinstance(target, ast.Name) and target.id == "cuda_libs" and value is not None and not libs:
                libs = _string_pairs(value)
    for node in ast.walk(preload_tree):
        if isinstance(node, ast.Call) and _call_name(node) == "_preload_cuda_lib":
            pair = _literal_args(node)
            if pair:
                optional.append(pair)
    if not libs:
        return None
    # The success path: calls inside the `try:` bodies of _load_global_deps, not its `except` handlers.
    on_success, success_libs = False, []
    for node in ast.walk(global_tree):
        if not isinstance(node, ast.Try):
            continue
        for stmt in node.body:
            for inner in ast.walk(stmt):
                if isinstance(inner, ast.Call) and _call_name(inner) in (
                    "_preload_cuda_deps",
                    "_preload_cuda_lib",
                ):
                    on_success = True
                    pair = _literal_args(inner)
                    if pair:
                        success_libs.append(pair)
    get_paths = _function_source(init_source, "_get_cuda_dep_paths") or ""
    return PreloadPlan(
        libs=tuple(libs),
        optional=tuple(optional),
        on_success=on_success,
        on_success_libs=tuple(success_libs),
        cu_major_folder='f"cu{' in get_paths or "f'cu{" in get_paths,
        source=source,
    )


def read_preload_plan(torch_dir: str | None) -> PreloadPlan:
    """The plan of the torch in `torch_dir`; the documented 2.11+ plan when it cannot be read."""
    if torch_dir is None:
        return DOCUMENTED_PLAN
    path = os.path.join(torch_dir, "__init__.py")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return DOCUMENTED_PLAN
    return parse_preload_plan(text, path) or DOCUMENTED_PLAN
