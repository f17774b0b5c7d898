"""`train` with hostile input (issue 18): every case ends in exit 2 and a message naming the problem, before
anything starts; an output folder in use is refused naming its run; `--json` keeps stdout to one document."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflash_doctor.cli import run
from dflash_doctor.launch.runs import RunStore
from tests.gate.test_train_gate import launches  # noqa: F401  (fixture)

REPO = Path(__file__).resolve().parents[2]


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run `train --no-deep --dry-run ARGS`, expect exit 2, return stderr."""
    code = run(["train", "--no-deep", "--dry-run", *args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    return err


def test_a_config_path_that_does_not_exist_is_not_the_shipped_one(launches, capsys, tmp_path) -> None:  # noqa: F811
    err = refused(capsys, "--config", str(tmp_path / "some" / "dir" / "tiny-cpu.toml"))
    assert "no such file" in err and "tiny-cpu.toml" in err
    refused(capsys, "--config", "some/dir/tiny-cpu.toml")
    assert (
        run(["train", "--no-deep", "--dry-run", "--config", "tiny-cpu.toml"]) == 0
    )  # a bare name is shipped


def test_a_config_that_is_not_utf8_names_the_file(launches, capsys, tmp_path) -> None:  # noqa: F811
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b'[output]\ndir = "r\xe9sultats"\n')
    err = refused(capsys, "--config", str(bad))
    assert "not UTF-8" in err and "latin1.toml" in err


def test_nested_layer_ids_name_the_field_in_a_file_and_in_set(launches, capsys, tmp_path) -> None:  # noqa: F811
    err = refused(capsys, "--config", "tiny-cpu", "--set", "drafter.target_layer_ids=[[1],[2]]")
    assert "drafter.target_layer_ids" in err
    config = tmp_path / "nested.toml"
    config.write_text("[drafter]\ntarget_layer_ids = [[1], [2]]\n[optim]\nsteps = 3\n")
    assert "drafter.target_layer_ids" in refused(capsys, "--config", str(config))


def test_a_topology_of_100000_drafters_is_refused_at_once(launches, capsys) -> None:  # noqa: F811
    began = time.monotonic()
    err = refused(capsys, "--config", "tiny-cpu", "--set", "topology.drafters=100000")
    assert "topology.drafters" in err and time.monotonic() - began < 30


def test_a_large_plan_prints_a_bounded_table(launches, capsys) -> None:  # noqa: F811
    run(["train", "--no-deep", "--dry-run", "--config", "tiny-cpu", "--set", "topology.drafters=300"])
    out = capsys.readouterr().out
    rank_rows = [line for line in out.splitlines() if "│ drafter" in line or "│ target" in line]
    assert "285 more ranks" in out and len(rank_rows) == 16  # 8 first, 8 last, not 301


def jsonl(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = json.dumps({"input_ids": [1, 2, 3, 4], "loss_mask": [0, 1, 1, 1]})


@pytest.mark.parametrize(
    ("bad_line", "words"),
    [
        (json.dumps({"input_ids": "1 2 3", "loss_mask": [1]}), "input_ids must be a non-empty list"),
        (json.dumps({"input_ids": [1, 2, 100000], "loss_mask": [1, 1, 1]}), "got id 100000"),
        ('{"input_ids": [1, 2', "not JSON"),
    ],
)
def test_every_line_of_the_data_is_checked_before_launch(
    launches,  # noqa: F811
    capsys,
    tmp_path: Path,
    bad_line: str,
    words: str,
) -> None:
    data = jsonl(tmp_path, [GOOD] * 99 + [bad_line] + [GOOD] * 50 + [bad_line, bad_line])
    err = refused(
        capsys, "--config", "tiny-cpu", "--set", "data.kind='jsonl'", "--set", f"data.path='{data}'"
    )
    assert "line 100" in err and words in err
    assert "2 more bad lines after it" in err and "3 of 152 records are bad" in err


def test_an_output_dir_that_is_a_file_is_refused(launches, capsys, tmp_path) -> None:  # noqa: F811
    taken = tmp_path / "notes.txt"
    taken.write_text("mine")
    err = refused(capsys, "--config", "tiny-cpu", "--set", f"output.dir='{taken}'")
    assert "output.dir" in err and "not a folder" in err


@contextlib.contextmanager
def held_output_dir(out: Path, run_id: str, node_rank: int = 0) -> Iterator[None]:
    """Another launcher (a child process) holds node `node_rank`'s lock on `out` until the block ends."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pathlib import Path\n"
            "from dflash_doctor.launch.output_lock import OutputLock\n"
            "held = OutputLock(Path(sys.argv[1]), int(sys.argv[3]))\n"
            "held.acquire(sys.argv[2], 4242)\n"
            "print('held', flush=True)\n"
            "time.sleep(120)\n",
            str(out),
            run_id,
            str(node_rank),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.kill()
        holder.communicate()


def test_a_second_run_on_the_same_output_dir_is_refused_naming_the_first(
    launches: list[list[str]],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    with held_output_dir(out, "20261201-031500-beef"):
        code = run(["train", "--no-deep", "--config", "tiny-cpu", "--set", f"output.dir='{out}'"])
        err = capsys.readouterr().err
        assert code == 2 and "in use by run 20261201-031500-beef" in err
        assert launches == [] and RunStore().all() == []  # nothing started, nothing recorded
    assert run(["train", "--no-deep", "--config", "tiny-cpu", "--set", f"output.dir='{out}'"]) == 0
    assert len(launches) == 1  # the folder is free again once its holder is gone


def node_launch(out: Path, node_rank: int) -> list[str]:
    """`train` as node `node_rank` of a two-node run writing `out` (a folder both nodes share)."""
    return [
        "train", "--no-deep", "--config", "tiny-cpu", "--set", f"output.dir='{out}'",
        "--nnodes", "2", "--node-rank", str(node_rank), "--rdzv-endpoint", "127.0.0.1:29999",
    ]  # fmt: skip


def test_the_nodes_of_one_run_share_an_output_dir(
    launches: list[list[str]],  # noqa: F811
    tmp_path: Path,
) -> None:
    out = tmp_path / "shared"
    with held_output_dir(out, "20261201-031500-n0de", node_rank=1):  # node 1's launcher runs
        assert run(node_launch(out, 0)) == 0  # node 0 of the same run is not refused
    assert len(launches) == 1 and "--node-rank=0" in launches[0]
    [record] = RunStore().all()
    assert record.status == "succeeded" and record.output_dir == str(out.resolve())
    assert "node rank 0 of 2" in record.notes  # each node's launcher keeps its own record, saying which


def test_two_launches_of_one_node_rank_on_one_output_dir_are_refused(
    launches: list[list[str]],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    out = tmp_path / "shared"
    with held_output_dir(out, "20261201-031500-n0de", node_rank=1):
        code = run(node_launch(out, 1))
        err = " ".join(capsys.readouterr().err.split())
        assert code == 2, err
        assert "in use for node rank 1 by run 20261201-031500-n0de (launcher pid 4242 on" in err
        assert launches == [] and RunStore().all() == []  # nothing started, nothing recorded


def test_train_json_prints_one_document_for_a_refused_launch(launches, monkeypatch, capsys) -> None:  # noqa: F811
    monkeypatch.setenv("TORCHDYNAMO_SUPPRESS_ERRORS", "1")
    assert run(["train", "--config", "tiny-cpu", "--no-deep", "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["schema"] == "dflash-doctor/train/v1" and document["status"] == "refused"
    assert any(f.startswith("hazards.") for f in document["failing"])
    assert run(["train", "--config", "tiny-cpu", "--no-deep", "--dry-run", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["schema"] == "dflash-doctor/train/v1"


def test_ctrl_c_during_the_gate_is_one_line_and_exit_130(launches, monkeypatch, capsys) -> None:  # noqa: F811
    import os
    import signal

    from dflash_doctor.commands import train as train_command

    def interrupted_gate(*args: object, **kwargs: object) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the checks run
        raise AssertionError("the signal did not stop the gate")

    monkeypatch.setattr(train_command, "run_gate", interrupted_gate)
    assert run(["train", "--config", "tiny-cpu", "--no-deep"]) == 130
    err = capsys.readouterr().err
    assert "stopped by SIGINT" in err and "Traceback" not in err
    assert launches == [] and RunStore().all() == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored


def test_a_crash_of_the_launcher_still_closes_the_record(launches, monkeypatch, capsys) -> None:  # noqa: F811
    from dflash_doctor.commands import train as train_command

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the warm-up child vanished")

    monkeypatch.setattr(train_command, "prepare_compile_cache", broken)
    assert run(["train", "--config", "tiny-cpu", "--no-deep"]) == 3  # a bug: one line, exit 3
    assert "internal error: RuntimeError: the warm-up child vanished" in capsys.readouterr().err
    (record,) = RunStore().all()
    assert record.status == "failed" and any("the warm-up child vanished" in n for n in record.notes)
    assert launches == []


def test_a_config_with_a_bom_reads_and_a_fifo_as_data_is_refused(launches, capsys, tmp_path) -> None:  # noqa: F811
    import os

    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf[optim]\nsteps = 5\n")  # saved by a Windows editor
    assert run(["train", "--no-deep", "--dry-run", "--config", str(bom)]) == 0
    fifo = tmp_path / "data.jsonl"
    os.mkfifo(fifo)  # opening it to read would block for ever
    err = refused(
        capsys, "--config", "tiny-cpu", "--set", "data.kind='jsonl'", "--set", f"data.path='{fifo}'"
    )
    assert "not a regular file" in err
