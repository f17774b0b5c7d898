from __future__ import annotations

from pathlib import Path

import pytest

from dflash_doctor.env.environment import Environment
from dflash_doctor.env.interpreter import InterpreterInfo
from tests.fakeenv import HAVE_GCC, FakeSite


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
