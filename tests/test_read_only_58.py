"""Issue 58, N10: a read-only output was reported as a full disk, a read-only DFLASH_DOCTOR_HOME as a crashed
deep probe. Both are said as what they are."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from dflash_base.disk import NoSpace, writing
from dflash_base.errors import DoctorError


def test_n10_a_write_refused_by_a_read_only_file_system_is_not_a_full_disk(tmp_path: Path) -> None:
    target = tmp_path / "checkpoints" / "step_00000002"
    with pytest.raises(DoctorError, match="is on a read-only file system") as said, writing(target, 10**15):
        raise OSError(
            errno.EROFS, os.strerror(errno.EROFS), str(target)
        )  # the bytes needed exceed what is free
    assert not isinstance(said.value, NoSpace)
    with pytest.raises(NoSpace), writing(target, 10):  # a full disk is still one
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))


def test_n10_a_probe_cache_that_cannot_be_written_is_said_not_a_crash(tmp_path: Path) -> None:
    import sys

    from dflash_doctor.deep.run import run_probe

    home = tmp_path / "home-is-a-file"
    home.write_text("not a folder")
    report = run_probe(sys.executable, 30, inductor_cache=str(home / "probe-inductor"))
    assert report.error is not None and "cannot be written" in report.error and "crashed" not in report.error
