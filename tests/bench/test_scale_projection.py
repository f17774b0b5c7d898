"""bench/e2e/scale_projection.py's arithmetic (docs/scale.md's tables come from it)."""

from __future__ import annotations

from bench.e2e.scale_projection import LINKS, colocated, recipe, split_by_node, split_one_list, sync_s
from dflash_doctor.launch.split import NVLINK_BUS_BYTES_S, load_role_rates

G = 4_000_000_000


def test_the_all_reduce_crosses_the_network_only_between_nodes() -> None:
    assert sync_s(G, 1, 1, 1e9) == 0.0  # one drafter: nothing to average
    assert sync_s(G, 8, 1, 1.0) == 2 * 7 / 8 * G / NVLINK_BUS_BYTES_S  # one node: NVLink only
    two = sync_s(G, 16, 2, 10e9)
    assert two == 2 * 7 / 8 * G / NVLINK_BUS_BYTES_S + 2 * 1 / 2 * G / 10e9


def test_projections_scale_and_a_slow_link_caps_the_one_list() -> None:
    r = recipe("qwen3-8b-b16", load_role_rates()["qwen3-8b-b16"], 1.0)
    ib, eth = LINKS["IB 8x400G"], LINKS["Eth 1x100G"]
    assert colocated(r, 16, 1, ib) > colocated(r, 8, 1, ib) > colocated(r, 16, 1, eth) / 2
    node, shape = split_by_node(r, 16, 4, ib)
    assert shape.endswith(" a node") and node > split_by_node(r, 8, 4, ib)[0]
    slow, slow_shape = split_one_list(r, 64, 1, eth)
    assert "(link-bound)" in slow_shape and slow < split_by_node(r, 64, 1, eth)[0]
