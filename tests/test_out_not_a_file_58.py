"""Issue 58, N3: `probe --out` and `lock --out` replaced whatever was at the path (a device node, a FIFO, a
symbolic link): as root, `probe --no-flex --out /dev/full` replaced the system's /dev/full with a JSON file. The
shared atomic write (`dflash_base.atomic`) replaces only a regular file, and both commands say what is there."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from dflash_base.atomic import write_json_atomic
from dflash_doctor.cli import run


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _link(path: Path) -> None:
    (path.parent / "aimed-at").write_text("precious")
    path.symlink_to(path.parent / "aimed-at")


def _device(path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("making a device node needs root")
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 7))  # what /dev/full is


PLANTS: dict[str, tuple[Callable[[Path], None], Callable[[int], bool], str]] = {
    "fifo": (_fifo, stat.S_ISFIFO, "a FIFO is there"),
    "link": (_link, stat.S_ISLNK, "a symbolic link is there"),
    "device": (_device, stat.S_ISCHR, "a character device is there"),
}


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))


@pytest.mark.parametrize("kind", sorted(PLANTS))
def test_n3_the_atomic_write_replaces_only_a_regular_file(tmp_path: Path, kind: str) -> None:
    plant, is_kind, said = PLANTS[kind]
    target = tmp_path / "out.json"
    plant(target)
    with pytest.raises(OSError, match=said):
        write_json_atomic(target, {"a": 1})
    assert is_kind(os.lstat(target).st_mode)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.json.")]  # no temp file left


@pytest.mark.parametrize("kind", sorted(PLANTS))
def test_n3_probe_out_refuses_what_is_not_a_file_before_it_probes(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dflash_doctor.commands import probe

    plant, is_kind, said = PLANTS[kind]
    target = tmp_path / "probe.json"
    plant(target)
    monkeypatch.setattr(probe, "run_probe", lambda *a, **k: pytest.fail("probed before refusing --out"))
    assert run(["probe", "--no-flex", "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert f"probe --out {target}: {said}" in err and "Traceback" not in err
    assert is_kind(os.lstat(target).st_mode)


@pytest.mark.parametrize("kind", sorted(PLANTS))
def test_n3_lock_out_refuses_what_is_not_a_file(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    plant, is_kind, said = PLANTS[kind]
    target = tmp_path / "dflash.lock"
    plant(target)
    assert run(["lock", "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert f"lock --out {target}: {said}" in err and "Traceback" not in err
    assert is_kind(os.lstat(target).st_mode)
    if kind == "link":
        assert (tmp_path / "aimed-at").read_text() == "precious"
