"""Where the compile caches are, resolved exactly as torch resolves them, and where we keep ours.

torch (`torch/_inductor/runtime/cache_dir_utils.py`): `TORCHINDUCTOR_CACHE_DIR`, else
`<tempfile.gettempdir()>/torchinductor_<user>`; Triton kernels compiled by Inductor go to
`TRITON_CACHE_DIR` when it is set, else to Inductor's own `triton/<device>/` subfolder. Triton on its
own (user kernels) defaults to `~/.triton/cache`. We resolve from an environ mapping, not from
`os.environ` directly, so the logic is a pure function and tests are hermetic.
"""

from __future__ import annotations

import getpass
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dflash_base.errors import DoctorError
from dflash_doctor import paths

INDUCTOR_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"
TRITON_VARIABLE = "TRITON_CACHE_DIR"

ROOT_VARIABLES = {"inductor": INDUCTOR_VARIABLE, "triton": TRITON_VARIABLE}

# Inside a cache folder: things we never archive. `locks/` holds per-process lock files that are
# meaningless elsewhere; `precompiled_headers/` is rebuilt on demand and is ~150 MB on CPU.
TRANSIENT_FOLDERS = frozenset({"locks", "precompiled_headers"})


@dataclass(frozen=True)
class CacheLocations:
    """The folders a compile in this environment reads and writes.

    ``triton`` is None when Inductor keeps its Triton kernels inside ``inductor/triton`` (the default),
    so one folder holds everything. ``triton_user`` is Triton's own default for non-Inductor kernels.
    ``inductor_source`` says how the Inductor folder was chosen (the variable, or "default").
    """

    inductor: Path
    inductor_source: str
    triton: Path | None
    triton_user: Path

    def roots(self) -> dict[str, Path]:
        """Archive root label -> folder: what a snapshot holds and where a restore puts it."""
        roots = {"inductor": self.inductor}
        if self.triton is not None:
            roots["triton"] = self.triton
        return roots


def _user_name() -> str:
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        name = f"uid_{os.getuid()}"
    return re.sub(r'[\\/:*?"<>|]', "_", name)


def default_inductor_dir(tempdir: str | None = None, user: str | None = None) -> Path:
    """torch's default: `<tempdir>/torchinductor_<user>` (volatile, in the shared temp folder)."""
    return Path(tempdir or tempfile.gettempdir()) / f"torchinductor_{user or _user_name()}"


def resolve_locations(
    environ: Mapping[str, str],
    tempdir: str | None = None,
    user: str | None = None,
    home: str | None = None,
) -> CacheLocations:
    """The cache folders for a process started with this environment."""
    configured = environ.get(INDUCTOR_VARIABLE)
    if configured:
        inductor, source = Path(os.path.abspath(os.path.expanduser(configured))), INDUCTOR_VARIABLE
    else:
        inductor, source = default_inductor_dir(tempdir, user), "default"
    triton_var = environ.get(TRITON_VARIABLE)
    triton = Path(os.path.abspath(os.path.expanduser(triton_var))) if triton_var else None
    triton_home = environ.get("TRITON_HOME") or home or os.path.expanduser("~")
    return CacheLocations(inductor, source, triton, Path(triton_home) / ".triton" / "cache")


def snapshots_dir() -> Path:
    """Where `cache snapshot` writes archives by default (under `$DFLASH_DOCTOR_HOME`, else platformdirs)."""
    return paths.cache_root() / "snapshots"


def managed_inductor_dir() -> Path:
    """Where we advise pointing `TORCHINDUCTOR_CACHE_DIR`: persistent, private to the user."""
    return paths.cache_root() / "inductor"


def warm_configs_dir() -> Path:
    """Where a launch with `--set` writes the config its warm-up child reads (one file per content)."""
    return paths.cache_root() / "warm-configs"


MANAGED_SOURCE = "managed"


def command_locations(environ: Mapping[str, str]) -> CacheLocations:
    """The folders `cache snapshot|restore|warm` act on: the cache `train` uses. With
    TORCHINDUCTOR_CACHE_DIR set, that folder (and TRITON_CACHE_DIR); unset, the managed cache, as
    `train` sets it for its workers (TRITON_CACHE_DIR dropped: Triton's kernels live inside it) -- never
    the machine-wide `/tmp/torchinductor_<user>` other processes are using."""
    if environ.get(INDUCTOR_VARIABLE):
        located = resolve_locations(environ)
        for label, folder in located.roots().items():
            if folder.parent == folder:  # `/`: no parent to swap it in (issue 37, Na)
                variable = ROOT_VARIABLES[label]
                raise DoctorError(
                    f"{variable}={environ.get(variable)} names the root folder {folder}: a compile cache "
                    "needs a folder of its own",
                    hint=f"export {variable}={managed_inductor_dir()}",
                )
        return located
    default = resolve_locations({})
    return CacheLocations(managed_inductor_dir(), MANAGED_SOURCE, None, default.triton_user)


def _unescape_mount(text: str) -> str:
    """mountinfo's octal escapes (`\\040` for a space) back to characters."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def read_mountinfo(text: str | None = None) -> list[tuple[str, str, str]]:
    """(device, root inside its filesystem, mount point) of every mount, from /proc/self/mountinfo."""
    if text is None:
        try:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as handle:
                text = handle.read()
        except OSError:
            return []
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 5:
            mounts.append((fields[2], _unescape_mount(fields[3]), _unescape_mount(fields[4])))
    return mounts


def place_of(path: Path, mounts: list[tuple[str, str, str]]) -> tuple[str, str]:
    """Where a folder really is: (its filesystem's device, its path inside that filesystem), through
    bind mounts (`/x/triton` bound from `<inductor>/triton` is `<inductor>/triton` there)."""
    real = os.path.realpath(path)
    best: tuple[str, str, str] | None = None
    for mount in mounts:  # the longest mount point holding it; the last of equals (mounted on top) wins
        point = mount[2].rstrip("/") or "/"
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[2].rstrip("/") or "/")):
            best = mount
    if best is None:
        return "", real
    point = best[2].rstrip("/") or "/"
    rest = real[len(point) :].lstrip("/")
    return best[0], os.path.normpath(os.path.join(best[1], rest)) if rest else os.path.normpath(best[1])


def check_apart(roots: Mapping[str, Path], mounts: list[tuple[str, str, str]] | None = None) -> None:
    """Refuse cache roots of which one is inside the other (or both one folder), before anything moves:
    a snapshot would archive the inner one's files twice, and a restore would swap the outer folder, then
    fail to find the inner one it had just moved away (issue 30, N3). Judged by where the folders really
    are (filesystem and path in it, through bind mounts; issue 37, B2), not by their paths' text."""
    mounts = read_mountinfo() if mounts is None else mounts
    real = {label: place_of(path, mounts) for label, path in roots.items()}
    for outer, inner in ((a, b) for a in real for b in real if a != b):
        (outer_dev, outer_path), (inner_dev, inner_path) = real[outer], real[inner]
        same = _same_folder(roots[inner], roots[outer]) or real[inner] == real[outer]
        inside = inner_dev == outer_dev and inner_path.startswith(outer_path.rstrip("/") + "/")
        if same or inside:
            where = "the same folder as" if same else "inside"
            raise DoctorError(
                f"{ROOT_VARIABLES.get(inner, inner)} ({roots[inner]}) is {where} "
                f"{ROOT_VARIABLES.get(outer, outer)} ({roots[outer]}): a snapshot would archive those files "
                "twice and a restore would move one cache inside the other; nothing was moved",
                hint=f"unset {TRITON_VARIABLE} (Inductor then keeps Triton's kernels in its own triton/ "
                f"folder), or point it at a folder outside {INDUCTOR_VARIABLE}",
            )


def _same_folder(a: Path, b: Path) -> bool:
    try:
        return os.path.samestat(os.stat(a), os.stat(b))
    except OSError:
        return False
