"""Transport over real gloo processes: headers, order, assignment, the in-flight bound, end of stream."""

from __future__ import annotations

import json
import time
import traceback
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainer.model.batch import CapturedBatch
from trainer.run.transport import (
    BatchReceiver,
    BatchSender,
    Topology,
    TransportError,
    decode_header,
    encode_header,
)


def make_batch(index: int, dtype: torch.dtype) -> CapturedBatch:
    """Contents derived from the index, so the receiver can tell which batch it got."""
    ids = torch.full((2, 6), index, dtype=torch.int64)
    mask = (torch.arange(6) % 2 == 0).expand(2, 6).clone()
    hidden = torch.full((2, 6, 5), float(index), dtype=dtype)
    return CapturedBatch(ids, mask, hidden, index)


def test_header_round_trip() -> None:
    head = decode_header(encode_header(make_batch(41, torch.bfloat16)))
    assert (head.index, head.batch_size, head.seq_len, head.features, head.dtype) == (
        41,
        2,
        6,
        5,
        torch.bfloat16,
    )
    assert decode_header(encode_header(None)).kind == 2


def test_assignment_is_fixed_by_the_batch_index() -> None:
    topo = Topology(targets=5, drafters=3)
    assert topo.drafter_ranks == [5, 6, 7]
    assert [topo.batch_for(4, d) for d in range(3)] == [12, 13, 14]
    assert [topo.producer_of(i) for i in (12, 13, 14)] == [2, 3, 4]
    assert all(topo.consumer_of(topo.batch_for(s, d)) == d for s in range(5) for d in range(3))


def _phase(rank: int, topo: Topology, steps: int, dtype: torch.dtype, in_flight: int, sent: int) -> dict:
    """Targets send their share of `sent` batches; drafters receive `steps` each, then expect END."""
    out: dict = {}
    if topo.is_target(rank):
        sender = BatchSender(topo, rank, in_flight, torch.device("cpu"))
        bound_held = True
        for index in (i for i in range(sent) if topo.producer_of(i) == rank):
            sender.send(make_batch(index, dtype))
            bound_held &= len(sender._pending) <= in_flight
        try:
            sender.close()
        except RuntimeError as exc:  # gloo sends finish only when received: a drafter that left fails it
            out["close_error"] = str(exc)
        out["max_pending"] = sender.max_pending_seen
        out["bound_held"] = bound_held
    else:
        d = topo.drafter_index(rank)
        receiver = BatchReceiver(topo, d, torch.device("cpu"))
        got = []
        try:
            for step in range(steps):
                time.sleep(0.02)  # a slow drafter: targets run ahead, up to the bound
                batch = receiver.receive(step)
                assert batch.hidden.dtype == dtype and batch.loss_mask.dtype == torch.bool
                assert torch.equal(batch.input_ids, make_batch(batch.index, dtype).input_ids)
                assert torch.equal(batch.hidden, make_batch(batch.index, dtype).hidden)
                assert torch.equal(batch.loss_mask, make_batch(batch.index, dtype).loss_mask)
                got.append(batch.index)
            receiver.expect_end()
        except TransportError as exc:
            out["error"] = str(exc)
        out["got"] = got
    return out


def _heldout_phase(rank: int, topo: Topology) -> dict:
    """One target, two drafters: training batches 0-1, held-out batches 0-1 (with target_ids), then 2-3."""
    if topo.is_target(rank):
        sender = BatchSender(topo, rank, 2, torch.device("cpu"))
        for index in (0, 1):
            sender.send(make_batch(index, torch.float32))
        for j in (0, 1):
            held = make_batch(100 + j, torch.float32)
            sender.send(CapturedBatch(held.input_ids, held.loss_mask, held.hidden, j, held.input_ids + 1))
        for index in (2, 3):
            sender.send(make_batch(index, torch.float32))
        sender.close()
        return {}
    d = topo.drafter_index(rank)
    receiver = BatchReceiver(topo, d, torch.device("cpu"))
    first = receiver.receive(0)
    held = receiver.receive_eval(d)
    second = receiver.receive(1)
    receiver.expect_end()
    assert first.target_ids is None and held.target_ids is not None
    assert torch.equal(held.target_ids, held.input_ids + 1) and int(held.input_ids[0, 0]) == 100 + d
    return {"got": [first.index, held.index, second.index]}


def _worker(rank: int, world: int, folder: str) -> None:
    result: dict = {}
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{folder}/store",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=60),
        )
        # phase 1: one target feeding two drafters, fp32
        result["one_to_two"] = _phase(
            rank, Topology(1, 2), steps=6, dtype=torch.float32, in_flight=2, sent=12
        )
        dist.barrier()
        # phase 2: two targets feeding one drafter, bf16
        result["two_to_one"] = _phase(
            rank, Topology(2, 1), steps=8, dtype=torch.bfloat16, in_flight=3, sent=8
        )
        dist.barrier()
        result["heldout"] = _heldout_phase(rank, Topology(1, 2))
        dist.barrier()
        # phase 3 (last: target 1's END stays unread, so no collective may follow): the targets stop
        # after 4 batches while the drafter expects 6
        result["early_end"] = _phase(rank, Topology(2, 1), steps=6, dtype=torch.float32, in_flight=2, sent=4)
    except Exception:
        result["crash"] = traceback.format_exc()
    Path(folder, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    folder = tmp_path_factory.mktemp("transport")
    mp.start_processes(_worker, args=(3, str(folder)), nprocs=3, join=True, start_method="spawn")
    results = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(3)]
    for r in results:
        assert "crash" not in r, r.get("crash")
    return results


def test_one_target_two_drafters(three_ranks: list[dict]) -> None:
    target, d0, d1 = (r["one_to_two"] for r in three_ranks)
    assert d0["got"] == [0, 2, 4, 6, 8, 10]  # drafter d at step s: batch s*M + d
    assert d1["got"] == [1, 3, 5, 7, 9, 11]
    assert "error" not in d0 and "error" not in d1
    assert target["bound_held"] and target["max_pending"] == 3  # in_flight=2, +1 before waiting on the oldest


def test_two_targets_one_drafter_in_order(three_ranks: list[dict]) -> None:
    t0, t1, drafter = (r["two_to_one"] for r in three_ranks)
    assert drafter["got"] == list(range(8))  # interleaved from two producers, consumed in index order
    assert "error" not in drafter
    assert t0["bound_held"] and t1["bound_held"]


def test_heldout_batches_travel_between_training_batches_with_the_targets_tokens(
    three_ranks: list[dict],
) -> None:
    assert three_ranks[1]["heldout"]["got"] == [0, 0, 2]  # drafter 0: batch 0, held-out 0, batch 2
    assert three_ranks[2]["heldout"]["got"] == [1, 1, 3]


def test_early_end_of_stream_is_a_clear_error(three_ranks: list[dict]) -> None:
    drafter = three_ranks[2]["early_end"]
    assert drafter["got"] == [0, 1, 2, 3]
    assert drafter["error"] == "drafter rank 2: expected batch 4 from target rank 0, got end of stream"
    assert "close_error" not in three_ranks[0]["early_end"]  # target 0's END was read


def test_a_collective_that_lost_a_peer_is_named_and_other_errors_are_not() -> None:
    from trainer.run.transport import lost_peer_message, peer_lost

    gloo = RuntimeError("[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:24990. ...")
    assert (
        peer_lost(gloo)
        and not peer_lost(RuntimeError("CUDA out of memory"))
        and not peer_lost(ValueError("x"))
    )
    line = lost_peer_message(gloo)
    assert line.startswith("lost a peer of this run in a collective ([../gloo/transport/tcp/pair.cc:553]")
    assert "on this node or another" in line and "run record" in line
