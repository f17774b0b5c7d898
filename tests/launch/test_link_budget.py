"""What a step moves between nodes and whether the measured link can carry it (issue 59): `launch.nodes`
is ok, warns (no step time to weigh against), refuses a step that would wait on the network more than a
quarter of its time, refuses nodes that would run different plans, and stays quiet on one node."""

from __future__ import annotations

from dflash_doctor.context import CheckContext, CheckOptions
from dflash_doctor.findings import Severity
from dflash_doctor.launch.link import LINK, Link, LinkReport
from dflash_doctor.launch.link_budget import MAX_NETWORK_SHARE, LinkVerdict, step_traffic
from dflash_doctor.launch.plan import NodeFacts, TorchrunOptions, build_launch_plan
from dflash_doctor.registry import run_checks
from tests.conftest import env_for
from tests.fakeenv import FakeSite
from tests.launch.test_topology_choice import inventory
from trainer.runspec.config import load_config
from trainer.runspec.target_shapes import target_hf_config

TWO = TorchrunOptions(nnodes=2, node_rank=0, rdzv_endpoint="10.0.0.1:29400")
IB = Link("nccl", "cuda:0", 256 << 20, 10, 0.06, 45e9, 2e-5)  # ~400 Gb/s InfiniBand
SLOW = Link("nccl", "cuda:0", 256 << 20, 10, 27.0, 0.1e9, 1e-4)  # a congested 1 Gb/s path


def plan(config: str, overrides: list[str] | None = None, gpus: int = 8, options: TorchrunOptions = TWO):
    cfg = load_config(config, overrides or [])
    built = build_launch_plan(
        cfg, __file__, target_hf_config(cfg.target.path), "/py", NodeFacts(gpus), options
    )
    return cfg, built


def nodes_findings(site: FakeSite, config: str, report: LinkReport | None, overrides=None, options=TWO):
    cfg, built = plan(config, overrides, options=options)
    ctx = CheckContext(env_for(site), CheckOptions(config=cfg))
    ctx.options.extra["launch_plan"] = built
    ctx._shared["gpus"] = inventory(8)
    if report is not None:
        ctx.pending(LINK, lambda: report)
    return {f.id: f for r in run_checks(ctx, ["launch.nodes"]) for f in r.findings}


def agreed(link: Link) -> LinkReport:
    return LinkReport({0: {"a": 1}, 1: {"a": 1}}, link, seconds=4.0, joined_s=1.5)


def test_by_node_no_hidden_state_crosses_and_one_list_sends_most_batches_across() -> None:
    """qwen3-8b-5t3d (seq 40000, 5 captured layers of 4096, bf16): one batch is 1.6 GB on the wire."""
    cfg, by_node = plan("qwen3-8b-5t3d")
    traffic = step_traffic(cfg, by_node)
    assert traffic.crossing_batches == 0 and traffic.drafters == 6
    assert traffic.batch_bytes == 40000 * (5 * 4096 * 2 + 9)
    assert traffic.all_reduce_bytes == 2 * 5 / 6 * traffic.gradient_bytes
    cfg, one_list = plan(
        "qwen3-8b-5t3d", ["topology.placement='world'", "topology.targets=10", "topology.drafters=6"]
    )
    crossing = step_traffic(cfg, one_list)
    assert crossing.crossing_batches > 0
    assert LinkVerdict(crossing, IB, 2.5, "x").hidden_s > 10 * LinkVerdict(traffic, IB, 2.5, "x").hidden_s


def test_the_share_is_the_network_wait_over_the_step() -> None:
    cfg, by_node = plan("qwen3-8b-5t3d")
    traffic = step_traffic(cfg, by_node)
    fast, slow = LinkVerdict(traffic, IB, 3.0, "measured"), LinkVerdict(traffic, SLOW, 3.0, "measured")
    assert fast.share is not None and fast.share < MAX_NETWORK_SHARE and not fast.too_slow
    assert slow.too_slow and slow.network_s == traffic.all_reduce_bytes / SLOW.bus_bytes_s
    assert LinkVerdict(traffic, SLOW, None, "none").share is None  # nothing to weigh it against


def test_a_fast_link_passes_with_the_numbers(site: FakeSite) -> None:
    got = nodes_findings(site, "qwen3-8b-5t3d", agreed(IB))
    finding = got["launch.nodes"]
    assert finding.severity is Severity.OK, finding
    assert "2 nodes agree and met in 1.5 s; link: 45.00 GB/s all-reduce bus bandwidth" in finding.summary
    assert "processes on cuda:0 a node" in finding.summary
    assert (
        "no hidden states (no pair crosses nodes)" in finding.summary
        and "the limit is 25%" in finding.summary
    )
    assert finding.evidence["link"]["share"] < MAX_NETWORK_SHARE


def test_a_step_that_would_wait_on_the_network_is_refused_with_the_numbers(site: FakeSite) -> None:
    got = nodes_findings(site, "qwen3-8b-5t3d", agreed(SLOW))
    finding = got["launch.nodes.slow_link"]
    assert finding.severity is Severity.FAIL and "0.10 GB/s" in finding.summary
    assert "GB of gradients" in finding.summary and "--force" in (finding.remedy or "")
    assert finding.evidence["link"]["share"] > MAX_NETWORK_SHARE


def test_without_a_step_time_the_numbers_are_printed_not_judged(site: FakeSite) -> None:
    got = nodes_findings(site, "tiny-cpu-2t1d", agreed(Link("gloo", "cpu", 16 << 20, 5, 0.08, 1e9, 5e-4)))
    assert (
        got["launch.nodes"].severity is Severity.WARN and "printed, not judged" in got["launch.nodes"].summary
    )


def test_nodes_that_differ_are_refused_naming_the_field(site: FakeSite) -> None:
    report = LinkReport({0: {"optim.steps": 4}, 1: {"optim.steps": 6}}, None)
    got = nodes_findings(site, "tiny-cpu-2t1d", report)
    finding = got["launch.nodes.differ"]
    assert finding.severity is Severity.FAIL and "optim.steps: node 0 4, node 1 6" in finding.summary


def test_a_link_check_that_failed_warns_and_one_not_run_is_skipped(site: FakeSite) -> None:
    got = nodes_findings(site, "tiny-cpu-2t1d", LinkReport({}, None, failure="gloo: connection reset"))
    assert got["launch.nodes.link_failed"].severity is Severity.WARN
    assert "gloo: connection reset" in got["launch.nodes.link_failed"].summary
    skipped = nodes_findings(site, "tiny-cpu-2t1d", None)
    assert skipped["launch.nodes"].severity is Severity.SKIP


def test_one_node_has_no_link_finding(site: FakeSite) -> None:
    assert nodes_findings(site, "tiny-cpu-2t1d", None, options=TorchrunOptions()) == {}
