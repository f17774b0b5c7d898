"""Shared fixtures, and the test session's own folders for everything that compiles or keeps state.

Hermetic by construction (issue 17): before any test module is imported (so before torch is), the session
points `TMPDIR`, `TORCHINDUCTOR_CACHE_DIR`, `TRITON_CACHE_DIR`, `TRITON_HOME`, `HF_HOME` and
`DFLASH_DOCTOR_HOME` into one fresh folder, removed at the end. Subprocesses (torchrun, the warm-up child,
the deep probe) inherit them. `TMPDIR` matters on CPU: Inductor puts its precompiled headers in
`<tempfile.gettempdir()>/torchinductor_<user>/precompiled_headers` whatever TORCHINDUCTOR_CACHE_DIR says
(`_HEADER_DIR` in torch/_inductor/codecache.py, fixed when that module is imported), so without it every
test run shared `/tmp/torchinductor_root` with every other torch process on the machine.
`DFLASH_DOCTOR_KEEP_TEST_TMP=1` keeps the folder for a post-mortem.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from dflash_doctor.env.environment import Environment
from dflash_doctor.env.interpreter import InterpreterInfo
from tests.fakeenv import HAVE_GCC, FakeSite

MACHINE_TEMP = tempfile.gettempdir()  # where torch's machine-wide default lives, read before the redirect
KEEP_ENV = "DFLASH_DOCTOR_KEEP_TEST_TMP"


def session_folders(root: Path) -> dict[str, str]:
    """The variables that send every cache and state folder of this session (and its children) under `root`."""
    return {
        "TMPDIR": str(root / "tmp"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
        "TRITON_CACHE_DIR": str(root / "triton"),
        "TRITON_HOME": str(root / "triton-home"),
        "HF_HOME": str(root / "hf"),
        "DFLASH_DOCTOR_HOME": str(root / "home"),
        "DFLASH_DOCTOR_LOCK_DIR": str(root / "locks"),  # the per-user cache locks (issue 37 G3)
    }


_SESSION: dict[str, object] = {}


def pytest_configure(config: pytest.Config) -> None:
    root = Path(tempfile.mkdtemp(prefix="dflash-doctor-tests-", dir=MACHINE_TEMP))
    folders = session_folders(root)
    (root / "tmp").mkdir()
    _SESSION.update(root=root, saved={k: os.environ.get(k) for k in folders})
    os.environ.update(folders)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again (pytest's tmp_path follows it too)


def pytest_unconfigure(config: pytest.Config) -> None:
    saved = _SESSION.get("saved")
    if not isinstance(saved, dict):
        return
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    tempfile.tempdir = None
    root = _SESSION.get("root")
    if isinstance(root, Path) and os.environ.get(KEEP_ENV, "") in ("", "0"):
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def session_root() -> Path:
    """The folder this session's caches, temp files and dflash-doctor home live in."""
    root = _SESSION["root"]
    assert isinstance(root, Path)
    return root


@pytest.fixture
def site(tmp_path: Path) -> FakeSite:
    return FakeSite(tmp_path / "site-packages")


def env_for(*sites: FakeSite | Path, ld_library_path: str = "") -> Environment:
    """An Environment over fake site folders, as if an interpreter had them on sys.path."""
    paths = [str(s.root if isinstance(s, FakeSite) else s) for s in sites]
    interp = InterpreterInfo(
        executable="/fake/bin/python",
        version="3.11.7",
        prefix="/fake",
        base_prefix="/usr",
        sys_path=paths,
        purelib=paths[0] if paths else None,
        platlib=paths[0] if paths else None,
        ld_library_path=ld_library_path,
    )
    return Environment.from_interpreter(interp)


@pytest.fixture
def needs_gcc() -> None:
    if not HAVE_GCC:
        pytest.skip("gcc is needed to build ELF fixtures")
