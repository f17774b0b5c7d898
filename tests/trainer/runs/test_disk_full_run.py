"""`dflash-doctor train` (tiny-cpu) with its output folder on a small tmpfs: the disk fills while the checkpoint
is written, or during the export. One line names the path and the bytes, the run record is `failed` with that
reason, nothing partial is left, and the last good checkpoint resumes the run once there is room.

Slow (four real launches, ~1 min each on 2 cores) and needs root to mount the tmpfs (skipped otherwise)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.disk_fixtures import small_disk  # noqa: F401  (fixture)
from tests.trainer.trainer_runs import REPO, environment

pytestmark = pytest.mark.slow

QUICK = {
    "data.seq_len": "64",
    "data.num_samples": "64",
    "optim.batch_size": "4",
    "optim.anchors": "16",
    "optim.steps": "20",
    "checkpoint.keep": "1",
    "run.timeout_s": "180",
}


def train(out: Path, overrides: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    sets = {**QUICK, **overrides, "output.dir": json.dumps(str(out))}
    args = [a for key, value in sets.items() for a in ("--set", f"{key}={value}")]
    command = [
        sys.executable,
        "-m",
        "dflash_doctor",
        "train",
        "--config",
        "tiny-cpu",
        "--no-deep",
        *args,
        *extra,
    ]
    return subprocess.run(command, cwd=REPO, env=environment(), capture_output=True, text=True, timeout=900)


def last_record() -> dict:
    from dflash_doctor.launch.runs import RunStore

    return RunStore().all()[-1].to_json()


def partial_files(folder: Path) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.name.startswith((".tmp-", ".old-", ".export."))]


def named_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "no space left on the device" in line]


def test_disk_full_while_the_checkpoint_is_written(small_disk) -> None:  # noqa: F811
    disk = small_disk(4096)  # one tiny-cpu checkpoint (2.6 MB) fits, a second beside it does not
    out = disk / "run"
    failed = train(out, {"checkpoint.every": "10"}, "--force")  # launch.disk refuses it: force it past
    output = failed.stdout + failed.stderr
    assert failed.returncode == 1, output[-3000:]
    lines = named_lines(output)
    assert len(lines) == 1 and re.search(r"/checkpoints/step_00000020: it needs 2\.\d MB", lines[0]), lines
    assert "Traceback" not in output and "ChildFailedError" not in output
    record = last_record()
    assert record["status"] == "failed" and "step_00000020" in record["reason"]
    assert "launch.disk.full" in record["forced_findings"]
    assert partial_files(out) == []
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000010"]
    subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)
    resumed = train(out, {"checkpoint.every": "10"})
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert "resuming at step 10" in resumed.stdout + resumed.stderr
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000020"]


def test_disk_full_during_the_export(small_disk) -> None:  # noqa: F811
    disk = small_disk(3400)  # the checkpoint at the end (2.6 MB) fits; an fp32 export (0.9 MB) beside it not
    out = disk / "run"
    overrides = {"checkpoint.every": "0", "output.export_dtype": '"fp32"'}
    failed = train(out, overrides, "--force")
    output = failed.stdout + failed.stderr
    assert failed.returncode == 1, output[-3000:]
    lines = named_lines(output)
    assert len(lines) == 1 and "/export/model.safetensors: it needs" in lines[0], lines
    assert "Traceback" not in output and "SafetensorError" not in output
    assert "export/model.safetensors" in last_record()["reason"]
    assert partial_files(out) == [] and not (out / "export").exists()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000020"]
    subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)
    resumed = train(out, overrides)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert (out / "export" / "model.safetensors").is_file()
