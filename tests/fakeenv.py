"""Hermetic fixtures: fake site-packages trees with real dist-info and gcc-built ELF libraries.

`FakeSite.add_dist` writes METADATA/RECORD/WHEEL/INSTALLER with correct sha256s, so ownership and
clobbering checks see what pip would have left. `build_elf` makes a real shared object with the
soname, NEEDED entries and RPATH/RUNPATH we choose, so the resolver reads real ELF files.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

HAVE_GCC = shutil.which("gcc") is not None


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_elf(
    path: str | os.PathLike[str],
    soname: str | None = None,
    needed: Iterable[str] = (),
    rpath: str | None = None,
    runpath: str | None = None,
    symbol: str | None = None,
) -> Path:
    """Compile a tiny shared object at `path` with exactly these dynamic-section entries."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        src = Path(scratch) / "lib.c"
        fn = symbol or "fixture_" + hashlib.sha1(str(out).encode()).hexdigest()[:8]
        src.write_text(f"int {fn}(void) {{ return 42; }}\n")
        args = ["gcc", "-shared", "-fPIC", "-o", str(out), str(src), f"-L{scratch}", "-Wl,--no-as-needed"]
        if soname:
            args.append(f"-Wl,-soname,{soname}")
        for i, dep in enumerate(needed):
            stub = Path(scratch) / dep
            subprocess.run(
                ["gcc", "-shared", "-fPIC", "-o", str(stub), "-x", "c", "-", f"-Wl,-soname,{dep}"],
                input=f"int stub_{i}(void) {{ return {i}; }}\n",
                text=True,
                check=True,
                capture_output=True,
            )
            args.append(f"-l:{dep}")
        if rpath is not None:
            args += ["-Wl,--disable-new-dtags", f"-Wl,-rpath,{rpath}"]
        elif runpath is not None:
            args += ["-Wl,--enable-new-dtags", f"-Wl,-rpath,{runpath}"]
        subprocess.run(args, check=True, capture_output=True, text=True)
    return out


@dataclass
class FakeSite:
    """A site-packages folder we fill with distributions."""

    root: Path
    dists: dict[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def add_dist(
        self,
        name: str,
        version: str,
        files: Mapping[str, bytes | Path] | None = None,
        requires: Iterable[str] = (),
        wheel_tag: str = "py3-none-manylinux_2_28_x86_64",
        build: str | None = None,
        installer: str = "pip",
        write_files: bool = True,
    ) -> Path:
        """Install a fake distribution: its files (bytes, or a built file to move in) and dist-info."""
        norm = name.replace("-", "_")
        dist_info = self.root / f"{norm}-{version}.dist-info"
        dist_info.mkdir(parents=True, exist_ok=True)
        rows: list[list[str]] = []
        for rel, content in (files or {}).items():
            target = self.root / rel
            data = content.read_bytes() if isinstance(content, Path) else content
            if write_files:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            rows.append([rel, record_hash(data), str(len(data))])
        meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
        meta += [f"Requires-Dist: {r}" for r in requires]
        (dist_info / "METADATA").write_text("\n".join(meta) + "\n\n")
        wheel = ["Wheel-Version: 1.0", "Generator: fakeenv", "Root-Is-Purelib: false", f"Tag: {wheel_tag}"]
        if build:
            wheel.append(f"Build: {build}")
        (dist_info / "WHEEL").write_text("\n".join(wheel) + "\n")
        (dist_info / "INSTALLER").write_text(installer + "\n")
        for meta_name in ("METADATA", "WHEEL", "INSTALLER"):
            data = (dist_info / meta_name).read_bytes()
            rows.append([f"{dist_info.name}/{meta_name}", record_hash(data), str(len(data))])
        rows.append([f"{dist_info.name}/RECORD", "", ""])
        with open(dist_info / "RECORD", "w", newline="") as handle:
            csv.writer(handle).writerows(rows)
        self.dists[name] = dist_info
        return dist_info

    def remove_dist(self, name: str) -> None:
        """What `pip uninstall` does: delete every file its RECORD lists, then the dist-info."""
        dist_info = self.dists.pop(name)
        with open(dist_info / "RECORD", newline="") as handle:
            for row in csv.reader(handle):
                if row and row[0]:
                    (self.root / row[0]).unlink(missing_ok=True)
        shutil.rmtree(dist_info, ignore_errors=True)

    def add_torch(
        self,
        version: str = "2.13.0+cpu",
        cuda: str | None = None,
        git: str = "cf30153c4c131c8164ee7798e5022d810682e2cb",
        requires: Iterable[str] = (),
        build: str | None = None,
        extra_files: Mapping[str, bytes | Path] | None = None,
    ) -> Path:
        version_py = (
            f"__version__ = '{version}'\ndebug = False\ncuda = {cuda!r}\n"
            f"git_version = '{git}'\nhip = None\nxpu = None\n"
        ).encode()
        files: dict[str, bytes | Path] = {"torch/__init__.py": b"", "torch/version.py": version_py}
        files.update(extra_files or {})
        public = version.split("+")[0]
        return self.add_dist("torch", public, files, requires=requires, build=build)


def make_venv(where: Path) -> Path:
    """A real (pip-less) venv: its interpreter answers `--python` probes. Returns its site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    major, minor = sys.version_info[:2]
    return where / "lib" / f"python{major}.{minor}" / "site-packages"
