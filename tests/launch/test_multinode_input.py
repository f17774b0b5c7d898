"""Bad input to a multi-node launch (issue 59): exit 2 naming the option and what to give, nothing started,
nothing recorded."""

from __future__ import annotations

import pytest

from dflash_doctor.cli import run
from dflash_doctor.launch import gate as gate_module
from dflash_doctor.launch import link
from dflash_doctor.launch.runs import RunStore
from tests.launch.test_train_gate import launches  # noqa: F401  (fixture)


@pytest.mark.parametrize(
    ("options", "says", "hint"),
    [
        (["--nnodes", "2", "--node-rank", "0"], "--nnodes 2: the nodes need a place to meet", "--rdzv-endpoint HOST:PORT"),
        (["--nnodes", "2", "--rdzv-endpoint", "h:29400"], "--nnodes 2: this node's --node-rank is missing", "from 0 to 1"),
        (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:29400"], "--node-rank 2: not a node of --nnodes 2", "0 to --nnodes - 1"),
    ],
)  # fmt: skip
def test_nodes_without_a_place_to_meet_or_a_rank_are_refused_before_the_gate(
    launches: list[list[str]],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    options: list[str],
    says: str,
    hint: str,
) -> None:
    assert run(["train", "--config", "tiny-cpu-2t1d", "--no-deep", *options]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert says in err and hint in err
    assert launches == [] and RunStore().all() == []


def test_an_endpoint_that_does_not_answer_is_exit_2_with_nothing_started(
    launches: list[list[str]],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The link check waits --join-timeout for the endpoint (192.0.2.1: TEST-NET-1, never answers)."""
    monkeypatch.setattr(gate_module, "run_link_check", link.run_link_check)  # the real one, not the fixture's
    endpoint = ["--rdzv-endpoint", "192.0.2.1:29400", "--join-timeout", "2"]
    args = ["train", "--config", "tiny-cpu-2t1d", "--no-deep", "--nnodes", "2", "--node-rank", "1", *endpoint]
    assert run([*args, "--set", "optim.steps=4"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--rdzv-endpoint 192.0.2.1:29400 did not answer within 2 s" in err and "nothing was started" in err
    assert launches == [] and RunStore().all() == []
