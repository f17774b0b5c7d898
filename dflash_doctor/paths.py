"""Where dflash-doctor keeps its own state: snapshots, run records, hash cache, the managed compile cache.

One environment variable, `DFLASH_DOCTOR_HOME`, moves all of it (tests use it to stay hermetic);
otherwise the platform's user cache and state folders are used (platformdirs).
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

import platformdirs

from dflash_base.errors import DoctorError

HOME_ENV = "DFLASH_DOCTOR_HOME"
LOCK_DIR_ENV = "DFLASH_DOCTOR_LOCK_DIR"
PRIVATE_MODE = 0o700


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


# Where the lock folder of a user without an account home lives: one per uid for every home of that user
# (issue 58, R1: one per home let two homes restore into one cache at once). Tests point it at their own folder.
SHARED_LOCK_BASE = "/tmp"


def lock_root() -> Path:
    """The folder of this user's cache-folder locks, the same for every `DFLASH_DOCTOR_HOME` (two homes
    restoring into one cache must find one lock; issue 37, G3): `DFLASH_DOCTOR_LOCK_DIR` when set (tests,
    or a machine whose users have no home folder), else `~/.cache/dflash-doctor/locks` of the account's
    home folder (from the password database, not $HOME). Without an account home (no password entry, as
    `docker run -u 1234` gives; a home that is missing or not the user's): `/tmp/dflash-doctor-locks-<uid>`,
    one for every home of the uid (issue 58, R1), unless something not ours holds that name (another user can
    take it first in /tmp): then the home's own `cache/locks`, as before."""
    configured = os.environ.get(LOCK_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    try:
        account_home = Path(pwd.getpwuid(os.getuid()).pw_dir)
        info = os.stat(account_home)
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
            return account_home / ".cache" / "dflash-doctor" / "locks"
    except (KeyError, OSError):
        pass
    shared = Path(SHARED_LOCK_BASE) / f"dflash-doctor-locks-{os.getuid()}"
    try:
        taken = os.lstat(shared)
    except FileNotFoundError:
        return shared
    except OSError:
        return cache_root() / "locks"
    if stat.S_ISDIR(taken.st_mode) and taken.st_uid == os.getuid():
        return shared
    return cache_root() / "locks"


def make_private_dirs(folder: Path) -> None:
    """`mkdir -p folder`, every folder it makes 0700 whatever the umask (issue 37, I1: under umask 000
    `mkdir(parents=True)` made the home and its `cache` 0777, so any user could swap them away)."""
    missing = []
    for part in (folder, *folder.parents):
        if os.path.lexists(part):
            break
        missing.append(part)
    for part in reversed(missing):
        try:
            os.mkdir(part, PRIVATE_MODE)
        except FileExistsError:
            continue
        os.chmod(part, PRIVATE_MODE)  # mkdir's mode is cut by the umask, never widened: set it exactly
