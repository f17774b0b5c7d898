"""Where dflash-doctor keeps its own state: snapshots, run records, hash cache, the managed compile cache.

One environment variable, `DFLASH_DOCTOR_HOME`, moves all of it (tests use it to stay hermetic);
otherwise the platform's user cache and state folders are used (platformdirs).
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from dflash_base.errors import DoctorError

HOME_ENV = "DFLASH_DOCTOR_HOME"


def _home() -> Path | None:
    value = os.environ.get(HOME_ENV)
    return Path(value).expanduser() if value else None


def cache_root() -> Path:
    """Re-creatable data: compile-cache snapshots, the managed compile cache, file-hash cache."""
    home = _home()
    return home / "cache" if home else Path(platformdirs.user_cache_dir("dflash-doctor"))


def state_root() -> Path:
    """Records worth keeping: run records, passed deep probes."""
    home = _home()
    return home / "state" if home else Path(platformdirs.user_state_dir("dflash-doctor"))


def runs_dir() -> Path:
    return state_root() / "runs"


def probes_dir() -> Path:
    """Passed deep probes, one file per environment key, beside the run records."""
    return state_root() / "probes"


def check_folder_path(folder: Path, what: str) -> None:
    """A DoctorError when `folder`'s path runs into a file (a home, `state` or `runs` that is a file): a
    reader would otherwise say "nothing there" of a folder it cannot see. `what` names the folder's role."""
    for part in (folder, *folder.parents):
        if os.path.lexists(part):
            if not part.is_dir():
                raise DoctorError(
                    f"{part} is a file, not a folder: {what} {folder} cannot be there",
                    hint=f"move {part} away, or set {HOME_ENV} to another folder",
                )
            return
