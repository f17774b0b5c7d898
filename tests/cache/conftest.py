from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def private_locks(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's lock folder (paths.lock_root: the same for every home), in pytest's temp folder but
    beside tmp_path (tests compare tmp_path's whole state before and after)."""
    locks = tmp_path_factory.mktemp("user-locks")
    monkeypatch.setenv("DFLASH_DOCTOR_LOCK_DIR", str(locks))
    return locks


@pytest.fixture
def cache_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A hermetic store and cache folder: nothing outside tmp_path is read or written."""
    home, inductor = tmp_path / "home", tmp_path / "caches" / "inductor"
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(home))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    return {"home": home, "inductor": inductor, "snapshots": home / "cache" / "snapshots"}
