"""The launcher's warden (issue 59): a record whose launcher was killed outright is closed `failed` with the
cause, once the tree it supervised has ended; a record the launcher closed is never touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from dflash_doctor.launch.runs import RunStore
from dflash_doctor.launch.warden import Warden


def running_record(tmp_path: Path) -> Path:
    store = RunStore(tmp_path / "runs")
    record = store.create("running", launcher_pid=123456, host="node-a", output_dir=str(tmp_path / "out"))
    return store.path(record.id)


def wait_until(predicate, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_a_launcher_gone_without_release_leaves_its_record_failed_with_the_cause(tmp_path: Path) -> None:
    path = running_record(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "summary.json").write_text(json.dumps({"status": "interrupted", "steps": 7}))
    tree = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    warden = Warden.start(path)
    assert warden is not None
    warden.watch(tree.pid)
    os.close(warden.write_fd)  # what the kernel does when the launcher is killed: the pipe's end, no release
    time.sleep(1.0)
    assert json.loads(path.read_text())["status"] == "running"  # the watched tree still runs: not yet
    tree.kill()
    tree.wait()
    assert wait_until(lambda: json.loads(path.read_text())["status"] != "running")
    record = json.loads(path.read_text())
    assert record["status"] == "failed" and record["finished"] is not None
    assert (
        "the launcher (pid 123456 on node-a) was killed before it could close this record" in record["reason"]
    )
    assert record["metrics"] == {"status": "interrupted", "steps": 7}  # the workers' last word, kept
    assert any(n.startswith("closed by the launcher's warden") for n in record["notes"])
    assert warden.proc.wait(timeout=10) == 0


def test_a_released_warden_touches_nothing(tmp_path: Path) -> None:
    path = running_record(tmp_path)
    before = path.read_text()
    warden = Warden.start(path)
    assert warden is not None
    warden.release()
    assert warden.proc.poll() == 0 and path.read_text() == before
