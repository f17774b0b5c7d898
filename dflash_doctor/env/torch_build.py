"""What torch build is installed, read from `torch/version.py` without importing torch.

`pip show torch` says `2.11.0`; only `torch/version.py` carries the local tag (`+cu130`), the CUDA
version and the git commit, and it is readable even when `import torch` is broken.
"""

from __future__ import annotations

import ast
import os
from dataclasses import asdict, dataclass

from packaging.version import InvalidVersion, Version

# Distributions that provide the `triton` package torch compiles with.
TRITON_NAMES = frozenset(
    {"triton", "pytorch-triton", "pytorch-triton-rocm", "triton-rocm", "pytorch-triton-xpu"}
)


@dataclass(frozen=True)
class TorchBuild:
    package_dir: str
    version: str
    git_version: str | None
    cuda: str | None
    hip: str | None

    @property
    def local_tag(self) -> str | None:
        try:
            return Version(self.version).local
        except InvalidVersion:
            return self.version.partition("+")[2] or None

    @property
    def public_version(self) -> str:
        try:
            return Version(self.version).public
        except InvalidVersion:
            return self.version.partition("+")[0]

    @property
    def cuda_major(self) -> int | None:
        if not self.cuda:
            return None
        try:
            return int(self.cuda.split(".")[0])
        except ValueError:
            return None

    @property
    def variant(self) -> str:
        """cpu / cu12x / cu13x / rocm: the family that decides which nvidia-* packages fit."""
        if self.hip:
            return "rocm"
        if self.cuda_major is not None:
            return f"cu{self.cuda_major}x"
        return "cpu"

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = asdict(self)
        data.update(local_tag=self.local_tag, variant=self.variant)
        return data


def _literal_assignments(source: str) -> dict[str, object]:
    values: dict[str, object] = {}
    for node in ast.parse(source).body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        for target in targets:
            if isinstance(target, ast.Name) and value is not None:
                try:
                    values[target.id] = ast.literal_eval(value)
                except ValueError:
                    continue
    return values


def read_torch_build(package_dir: str) -> TorchBuild | None:
    """Parse `<package_dir>/version.py`; None when there is no torch there."""
    path = os.path.join(package_dir, "version.py")
    try:
        with open(path, encoding="utf-8") as handle:
            values = _literal_assignments(handle.read())
    except (OSError, SyntaxError):
        return None
    version = values.get("__version__")
    if not isinstance(version, str):
        return None

    def text(name: str) -> str | None:
        value = values.get(name)
        return value if isinstance(value, str) and value else None

    return TorchBuild(package_dir, version, text("git_version"), text("cuda"), text("hip"))
