"""The link check before a multi-node launch (issue 59): real children meeting on localhost, as two nodes'
launchers do; what they report; the bad input a join reveals (exit 2, naming the option)."""

from __future__ import annotations

import json
import socket
import sys
import threading

import pytest

from dflash_base.errors import DoctorError
from dflash_doctor.launch.link import (
    EXIT_JOIN,
    LinkReport,
    LinkRequest,
    drafter_devices,
    link_request,
    parse_report,
    run_link_check,
)
from dflash_doctor.launch.node_plans import differences, node_plan
from dflash_doctor.launch.plan import TorchrunOptions
from tests.launch.test_topology_choice import plan_for
from trainer.runspec.config import load_config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nodes(
    plans: list[dict],
    join_timeout: float = 60.0,
    ranks: list[int] | None = None,
    devices: tuple[str, ...] = (),
) -> list[LinkReport]:
    """Each plan's node runs its child at once (threads stand in for the launchers); their reports in order."""
    endpoint = f"127.0.0.1:{free_port()}"
    reports: list[LinkReport | None] = [None] * len(plans)
    ranks = ranks or list(range(len(plans)))

    def one(index: int) -> None:
        request = LinkRequest(
            endpoint,
            "--rdzv-endpoint",
            ranks[index],
            len(plans),
            "cpu",
            plans[index],
            join_timeout,
            devices=devices,
        )
        reports[index] = run_link_check(sys.executable, request)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(plans))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in reports if r is not None]


def test_two_nodes_that_agree_meet_and_time_an_all_reduce() -> None:
    a, b = nodes([{"optim.steps": 4}, {"optim.steps": 4}])
    for report in (a, b):
        assert report.error is None and report.failure is None, report
        assert report.plans == {0: {"optim.steps": 4}, 1: {"optim.steps": 4}}
        assert report.link is not None and report.link.bus_bytes_s > 1e6 and report.link.backend == "gloo"
    assert a.link == b.link  # both report the slowest node's time: one figure for the run
    assert (
        "GB/s all-reduce bus bandwidth (5 x 16 MiB over gloo, 2 processes on cpu a node" in a.link.describe()
    )


def test_with_several_drafters_a_node_the_link_is_timed_by_one_process_each() -> None:
    """The run's all-reduce world: 2 nodes x 2 drafter devices (here CPU processes: the CUDA path differs only
    in the devices it names)."""
    a, b = nodes([{"x": 1}, {"x": 1}], devices=("cpu", "cpu"))
    assert a.failure is None and a.link is not None and a.link.processes == 4, a
    assert a.link.device == "2 x cpu" and a.link == b.link


def test_the_devices_measured_are_each_nodes_drafters() -> None:
    by_node = plan_for("qwen3-8b-5t3d", 8, options=TWO)
    assert drafter_devices(by_node.roles, 1, 2) == ("cuda:5", "cuda:6", "cuda:7")
    one_list = plan_for("qwen3-8b-5t3d", 8, ["topology.placement='world'"], options=TWO)
    assert drafter_devices(one_list.roles, 0, 2) == ("cuda:0",)  # node 0 holds no drafter: the batches' path


def test_nodes_that_would_run_different_plans_are_told_what_differs_and_measure_nothing() -> None:
    a, b = nodes([{"optim.steps": 4, "data.seq_len": 64}, {"optim.steps": 6, "data.seq_len": 64}])
    assert a.link is None and b.link is None and a.plans == b.plans
    assert differences(a.plans) == ["optim.steps: node 0 4, node 1 6"]


def test_a_rank_two_launchers_gave_is_bad_input_naming_the_option() -> None:
    reports = nodes([{}, {}], join_timeout=4.0, ranks=[0, 0])
    errors = sorted(str(r.error) for r in reports)
    assert any("--node-rank 0: another launcher at 127.0.0.1:" in e for e in errors), errors
    assert any("--nnodes 2: node rank(s) 1 did not join" in e and "nothing was started" in e for e in errors)


def test_an_endpoint_nobody_answers_is_bad_input_within_the_join_timeout() -> None:
    """192.0.2.1 is TEST-NET-1: never this machine, never answers."""
    request = LinkRequest("192.0.2.1:29400", "--rdzv-endpoint", 1, 2, "cpu", {}, join_timeout_s=2.0)
    report = run_link_check(sys.executable, request)
    assert report.error is not None, report
    assert report.error.message.startswith("--rdzv-endpoint 192.0.2.1:29400 did not answer within 2 s")
    assert "node 0" in (report.error.hint or "") and "--join-timeout" in (report.error.hint or "")


REQUEST = LinkRequest("h:29400", "--rdzv-endpoint", 1, 2, "cpu", {})
TWO = TorchrunOptions(nnodes=2, node_rank=0, rdzv_endpoint="10.0.0.1:29400")


def test_reports_parse_and_joins_that_failed_are_errors() -> None:
    good = {
        "plans": {"0": {"a": 1}, "1": {"a": 1}},
        "link": {"backend": "gloo", "device": "cpu", "bytes": 8, "iterations": 2, "seconds": 0.5,
                 "bus_bytes_s": 32.0, "latency_s": 0.001},
        "seconds": 3.0, "joined_s": 1.0,
    }  # fmt: skip
    report = parse_report("noise\n" + json.dumps(good), "", 0, REQUEST)
    assert report.plans == {0: {"a": 1}, 1: {"a": 1}} and report.link is not None and report.seconds == 3.0
    missing = parse_report(json.dumps({"error": "missing", "missing": [1]}), "", EXIT_JOIN, REQUEST)
    assert isinstance(
        missing.error, DoctorError
    ) and "node rank(s) 1 did not join at --rdzv-endpoint h:29400" in str(missing.error)
    crashed = parse_report("", "Segmentation fault", -11, REQUEST)
    assert crashed.error is None and "without a report: Segmentation fault" in (crashed.failure or "")
    failed = parse_report(json.dumps({"error": "failed", "detail": "gloo: boom"}), "", 1, REQUEST)
    assert failed.failure == "gloo: boom"


def test_which_launches_measure_the_link() -> None:
    one = link_request("h:1", (None, None), None, 0, 1, "cpu", {}, 5.0, None)
    assert one == "one node: no link to measure"
    etcd = link_request("h:1", (None, None), "etcd", 0, 2, "cpu", {}, 5.0, None)
    assert isinstance(etcd, str) and "--rdzv-backend etcd" in etcd
    bare = link_request("h", (None, None), None, 1, 2, "cuda", {}, 5.0, "job7")
    assert isinstance(bare, LinkRequest) and bare.endpoint == "h:29400" and bare.run_id == "job7"
    assert "--backend" in bare.arguments("py") and "nccl" in bare.arguments("py")
    static = link_request(None, ("10.0.0.1", None), None, 1, 2, "cpu", {}, 5.0, None)
    assert isinstance(static, LinkRequest) and static.endpoint == "10.0.0.1:29500"
    assert static.option == "--master-addr/--master-port"


def test_a_nodes_plan_names_each_graph_field_and_survives_json() -> None:
    cfg = load_config("tiny-cpu-2t1d", ["optim.steps=4"])
    plan = node_plan(cfg, plan_for("tiny-cpu-2t1d", 0, ["optim.steps=4"]))
    assert plan["optim.steps"] == 4 and plan["drafter.layers"] == 1 and plan["topology"] == "split 2+1 (node)"
    assert json.loads(json.dumps(plan)) == plan  # what the other node reads back compares equal
    assert differences({0: plan, 1: plan}) == []
    assert differences({0: plan, 1: {**plan, "optim.steps": 6}}) == ["optim.steps: node 0 4, node 1 6"]


@pytest.mark.parametrize("missing_key", ["drafter.layers"])
def test_a_key_only_one_node_has_is_a_difference(missing_key: str) -> None:
    a = {missing_key: 1}
    assert differences({0: a, 1: {}}) == [f"{missing_key}: node 0 1, node 1 (unset)"]
