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
from tests.launch.test_train_gate import launches  # noqa: F401  (fixture)

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


def refused_while_held(
    capsys: pytest.CaptureFixture[str], started: list[list[str]], out: Path, node_rank: int, argv: list[str]
) -> str:
    """`run(argv)` while another launcher holds node `node_rank`'s lock on `out`: exit 2, nothing started,
    nothing recorded; its stderr, on one line."""
    with held_output_dir(out, "20261201-031500-beef", node_rank):
        code = run(argv)
        err = " ".join(capsys.readouterr().err.split())
        assert code == 2, err
        assert started == [] and RunStore().all() == []
    return err


def test_a_second_run_on_the_same_output_dir_is_refused_naming_the_first(
    launches: list[list[str]],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    argv = ["train", "--no-deep", "--config", "tiny-cpu", "--set", f"output.dir='{out}'"]
    assert "in use by run 20261201-031500-beef" in refused_while_held(capsys, launches, out, 0, argv)
    assert run(argv) == 0
    assert len(launches) == 1  # the folder is free again once its holder is gone


def node_launch(out: Path, node_rank: int) -> list[str]:
    """`train` as node `node_rank` of a two-node run writing `out` (a folder both nodes share)."""
    return [
        "train", "--no-deep", "--config", "tiny-cpu", "--set", f"output.dir='{out}'",
        "--nnodes", "2", "--node-rank", str(node_rank), "--rdzv-endpoint", "127.0.0.1:29999",
    ]  # fmt: skip


def test_the_nodes_of_one_run_share_an_output_dir_but_one_node_rank_does_not(
    launches: list[list[str]],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """Node 1's launcher holds its lock on a shared folder: a second node 1 is refused naming it (exit 2);
    node 0 of the run launches beside it and keeps its own record."""
    out = tmp_path / "shared"
    err = refused_while_held(capsys, launches, out, 1, node_launch(out, 1))
    assert "in use for node rank 1 by run 20261201-031500-beef (launcher pid 4242 on" in err
    with held_output_dir(out, "20261201-031500-beef", node_rank=1):
        assert run(node_launch(out, 0)) == 0  # node 0 of the same run is not refused
    assert len(launches) == 1 and "--node-rank=0" in launches[0]
    [record] = RunStore().all()
    assert record.status == "succeeded" and record.output_dir == str(out.resolve())
    assert "node rank 0 of 2" in record.notes  # each node's launcher keeps its own record, saying which
