"""A bytecode folder for the launch's processes when the interpreter caches none.

On an image whose torch, triton and sympy come without cached bytecode and where none gets written (uv
without --compile-bytecode, PYTHONDONTWRITEBYTECODE=1, a read-only site-packages: what `startup.bytecode`
warns about), every process a launch starts (the warm-up child, torchrun, each worker, Inductor's compile
workers) compiles ~1,800 modules from source at every start: 5-8 s each on an H200 host, and a worker's
"start + imports" of 10-13 s against ~6 s with bytecode (BENCHMARKS.md). The launch gives its processes a
bytecode folder of their own under the dflash-doctor home (PYTHONPYCACHEPREFIX) and lets them write it:
the first process writes, every later one (this launch's and the next) reads. Nothing in the image
changes. `startup.bytecode`'s own remedy (compileall into site-packages) makes this unnecessary;
DFLASH_DOCTOR_BYTECODE_CACHE=0, or a PYTHONPYCACHEPREFIX of the user's own, leaves the environment alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from dflash_doctor import paths
from dflash_doctor.findings import Finding, Severity

OPT_OUT = "DFLASH_DOCTOR_BYTECODE_CACHE"


def bytecode_dir() -> Path:
    return paths.cache_root() / "pycache"


def with_bytecode_cache(
    environ: Mapping[str, str], findings: Iterable[Finding], folder: Path | None = None
) -> tuple[dict[str, str], str | None]:
    """`environ` for the launch's processes, and a line saying what changed (None: nothing did)."""
    out = dict(environ)
    if out.get(OPT_OUT) == "0" or out.get("PYTHONPYCACHEPREFIX"):
        return out, None
    warning = next((f for f in findings if f.id == "startup.bytecode" and f.severity is Severity.WARN), None)
    if warning is None:
        return out, None
    folder = folder or bytecode_dir()
    folder.mkdir(parents=True, exist_ok=True)
    out["PYTHONPYCACHEPREFIX"] = str(folder)
    out.pop("PYTHONDONTWRITEBYTECODE", None)
    return out, (
        f"bytecode: this interpreter caches none for its heavy packages (startup.bytecode), so the launch's "
        f"processes keep theirs in {folder} (PYTHONPYCACHEPREFIX): the first start writes it, later ones "
        f"read it; {OPT_OUT}=0 turns this off"
    )
