"""Every command that writes stdout fails on a failed write, naming stdout: `> /dev/full`, a full disk."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_doctor import stdout as stdout_module
from dflash_doctor.stdout import WholeWrites
from tests.disk_fixtures import fill, small_disk  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[1]


def doctor(args: list[str], out: object, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DFLASH_DOCTOR_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "dflash_doctor", *args],
        stdout=out,  # type: ignore[arg-type]
        stderr=subprocess.PIPE,
        text=True,
        cwd=home.parent,
        env=env,
        timeout=300,
    )


@pytest.mark.parametrize(
    "args", [["lock", "--json"], ["check", "--json"], ["runs", "--json"], ["cache", "list", "--json"]]
)
def test_a_command_writing_to_dev_full_fails_naming_stdout(args: list[str], tmp_path: Path) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        done = doctor(args, full, tmp_path / "home")
    assert done.returncode == 2, done.stderr
    assert "cannot write to stdout: No space left on device" in done.stderr
    assert "a file" not in done.stderr and "Traceback" not in done.stderr


def test_check_json_to_a_full_disk_is_exit_2_not_json_cut_at_8_kb(small_disk, tmp_path: Path) -> None:  # noqa: F811
    disk = small_disk(64)
    fill(disk, leave=8192)
    with open(disk / "check.json", "w") as out:
        done = doctor(["check", "--json"], out, tmp_path / "home")
    assert done.returncode == 2, done.stderr
    assert "cannot write to stdout" in done.stderr


def test_a_short_write_is_retried_and_a_refused_one_names_stdout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel takes part of a write and refuses the rest: Python's own stdout drops the rest silently."""
    taken: list[bytes] = []

    def short_then_full(fd: int, data: memoryview) -> int:
        if len(taken) < 2:
            taken.append(bytes(data[:10]))
            return 10
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(stdout_module.os, "write", short_then_full)
    raw = WholeWrites(1)
    with pytest.raises(OSError) as caught:
        raw.write(b"x" * 40)
    assert caught.value.filename == "stdout" and caught.value.errno == errno.ENOSPC
    assert taken == [b"x" * 10, b"x" * 10]  # retried after the short write until it failed
    assert raw.write(b"more") == 4  # reported once; what follows is dropped, shutdown has nothing to fail on
