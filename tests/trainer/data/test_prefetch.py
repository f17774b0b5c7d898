"""Data workers make first-epoch sequences ahead of the training thread (trainer/data/prefetch.py): the batches
are bit-identical to those made inline, whatever is or is not ready; a failure falls back to inline making with
one warning; no worker outlives its rank (closed, an exception, Ctrl-C, the rank killed outright).

Most tests drive `Prefetch` with a pool of their own that runs jobs only when told (no process); three start
real spawned workers (~3-6 s each on a 2-core box: a worker imports torch)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainer.chat_fixtures import QWEN3_LIKE, byte_tokenizer
from tests.trainer.data.made_calls import calls_to
from trainer.data import prefetch, sources
from trainer.data.order import BatchOrder, make_batch
from trainer.data.prefetch import Prefetch, resolve_workers, start_prefetch
from trainer.data.sources import TokenizedSource

REPO = Path(__file__).resolve().parents[3]
SEQ_LEN = 48  # the longer records are truncated, the shorter padded
BATCH = 4
CHATS = [
    [{"role": "user", "content": f"Q{i}"}, {"role": "assistant", "content": "ab" * (3 + 5 * (i % 7))}]
    for i in range(24)
]  # 6 batches an epoch


@pytest.fixture
def chat_data(tmp_path: Path) -> tuple[Path, Path]:
    """(target folder with a byte-level tokenizer, chat jsonl)."""
    target = tmp_path / "target"
    byte_tokenizer(QWEN3_LIKE, target)
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": chat}) + "\n" for chat in CHATS))
    return target, data


def _source(chat_data: tuple[Path, Path]) -> TokenizedSource:
    return TokenizedSource(str(chat_data[1]), "chat", byte_tokenizer(QWEN3_LIKE), SEQ_LEN)


def _order(source: TokenizedSource) -> BatchOrder:
    return BatchOrder(len(source), BATCH, seed=3)


def _sources(chat_data: tuple[Path, Path]) -> tuple[TokenizedSource, TokenizedSource, BatchOrder]:
    """The source under test, a reference made inline, and the batch order both are read in."""
    source = _source(chat_data)
    return source, _source(chat_data), _order(source)


def _same(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> bool:
    return a[0].dtype == b[0].dtype and a[1].dtype == b[1].dtype and all(map(torch.equal, a, b))


class HeldPool(Executor):
    """Runs a job only when `finish` says so, in this process, on `worker_source` (the worker's own copy)."""

    def __init__(self, worker_source: TokenizedSource, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(prefetch, "_SOURCE", worker_source)
        self.held: list[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = []
        self.shut = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self.held.append((future, fn, args))
        return future

    def finish(self, error: BaseException | None = None) -> None:
        for future, fn, args in self.held:
            if not future.set_running_or_notify_cancel():  # cancelled before it ran, as an executor does
                continue
            if error is None:
                future.set_result(fn(*args))
            else:
                future.set_exception(error)
        self.held.clear()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.shut = True


def _children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _workers(pid: int) -> list[int]:
    """`pid`'s spawned workers (not the resource tracker that comes with them)."""
    return [child for child in _children(pid) if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# ---------------------------------------------------------------- without processes


def test_what_is_not_ready_is_made_inline_and_a_late_delivery_changes_nothing(
    chat_data: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    source, reference, order = _sources(chat_data)
    pool = HeldPool(_source(chat_data), monkeypatch)
    inline = calls_to(source, "made", monkeypatch)
    with Prefetch(source, order, range(12), pool, ahead=3, chunk=3) as ahead:
        assert len(pool.held) == 3 * -(-BATCH // 3)  # three batches in the works, in chunks of 3
        ahead.before(0)  # nothing is done: batch 0 is made here, as without workers
        assert [future.cancelled() for future, _, _ in pool.held[:2]] == [True, True]  # its jobs dropped
        assert not any(future.cancelled() for future, _, _ in pool.held[2:])
        assert _same(make_batch(source, order.sequence_ids(0)), make_batch(reference, order.sequence_ids(0)))
        assert inline == order.sequence_ids(0)
        kept_tokens = source.kept_tokens
        pool.finish()  # batches 0-3 done late: 0's are kept already, the others' are delivered
        ahead.before(1)
        assert source.kept_tokens > kept_tokens and ahead.delivered == 3 * BATCH
        for index in range(1, 12):
            ahead.before(index)
            batch = make_batch(source, order.sequence_ids(index))
            assert _same(batch, make_batch(reference, order.sequence_ids(index))), index
            pool.finish()
        assert inline == order.sequence_ids(0)  # everything else came from the workers
        assert not ahead.running  # the second epoch had nothing to make: the pool went at its start
    assert pool.shut
    assert source.kept.keys() == reference.kept.keys() and source.kept_tokens == reference.kept_tokens
    for j, (ids, mask) in reference.kept.items():
        assert _same(source.kept[j], (ids, mask))


def test_a_failed_job_is_one_warning_and_the_rest_is_made_inline(
    chat_data: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    source, reference, order = _sources(chat_data)
    pool = HeldPool(_source(chat_data), monkeypatch)
    warnings: list[str] = []
    with Prefetch(source, order, range(6), pool, ahead=2, warn=warnings.append) as ahead:
        pool.finish(BrokenProcessPool("a worker died"))
        for index in range(6):
            ahead.before(index)
            assert _same(
                make_batch(source, order.sequence_ids(index)),
                make_batch(reference, order.sequence_ids(index)),
            )
        assert not ahead.running and pool.shut and ahead.delivered == 0
    assert warnings == [
        "data workers stopped (BrokenProcessPool: a worker died); the remaining sequences are made on the "
        "training thread"
    ]


def test_a_full_budget_stops_the_workers_and_nothing_changes(
    chat_data: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    source, reference, order = _sources(chat_data)
    monkeypatch.setattr(sources, "KEPT_TOKENS", 3 * SEQ_LEN)  # room for three sequences at most
    pool = HeldPool(_source(chat_data), monkeypatch)
    with Prefetch(source, order, range(12), pool, ahead=2) as ahead:
        pool.finish()
        for index in range(12):
            ahead.before(index)
            assert _same(
                make_batch(source, order.sequence_ids(index)),
                make_batch(reference, order.sequence_ids(index)),
            )
            pool.finish()
        assert not ahead.running and ahead.delivered <= 3
    assert source.kept_tokens <= sources.KEPT_TOKENS


def test_a_batch_asked_out_of_order_is_made_all_the_same_and_said_at_close(
    chat_data: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    source, reference, order = _sources(chat_data)
    warnings: list[str] = []
    pool = HeldPool(_source(chat_data), monkeypatch)
    with Prefetch(source, order, range(6), pool, ahead=2, warn=warnings.append) as ahead:
        ahead.before(4)
        assert _same(make_batch(source, order.sequence_ids(4)), make_batch(reference, order.sequence_ids(4)))
        assert warnings == []
    assert len(warnings) == 1 and "batch 4 was asked for out of the expected order" in warnings[0]


def test_an_exception_in_the_run_shuts_the_pool(
    chat_data: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _source(chat_data)
    pool = HeldPool(_source(chat_data), monkeypatch)
    with (
        pytest.raises(RuntimeError, match="the step failed"),
        Prefetch(source, _order(source), range(6), pool),
    ):
        raise RuntimeError("the step failed")
    assert pool.shut


@pytest.mark.parametrize(
    ("setting", "kind", "device", "cores", "ranks", "expected"),
    [
        ("auto", "chat", "cpu", 16, 1, 0),  # the CPU's cores train
        ("auto", "chat", "cuda", 16, 1, 4),
        ("auto", "text", "cuda", 16, 8, 1),  # 2 cores a rank: one for the rank, one worker
        ("auto", "chat", "cuda", 8, 8, 0),
        (3, "chat", "cpu", 2, 1, 3),  # asked for: given
        (3, "jsonl", "cuda", 16, 1, 0),  # nothing to make
        ("auto", "synthetic", "cuda", 16, 1, 0),
    ],
)
def test_how_many_workers(
    setting: int | str, kind: str, device: str, cores: int, ranks: int, expected: int
) -> None:
    assert resolve_workers(setting, kind, device, cores=cores, local_ranks=ranks) == expected


def test_no_workers_or_no_tokenising_source_is_no_pool(chat_data: tuple[Path, Path]) -> None:
    source = _source(chat_data)
    assert start_prefetch(source, str(chat_data[0]), _order(source), range(6), 0) is None
    random = sources.RandomSource(8, 16, 4, 100, 0)
    assert start_prefetch(random, str(chat_data[0]), BatchOrder(8, 2, 0), range(4), 2) is None


# ---------------------------------------------------------------- real workers


def test_spawned_workers_make_the_same_batches_and_leave_nothing_running(
    chat_data: tuple[Path, Path],
) -> None:
    target, _ = chat_data
    source, reference, order = _sources(chat_data)
    ahead = start_prefetch(source, str(target), order, range(12), 1)  # two epochs
    assert ahead is not None
    with ahead:
        ahead.settle(timeout=60)  # a lead: the first epoch made before the first batch is asked for
        assert ahead.delivered == len(source)
        workers = _workers(os.getpid())
        assert len(workers) == 1
        for index in range(12):
            ahead.before(index)
            assert _same(
                make_batch(source, order.sequence_ids(index)),
                make_batch(reference, order.sequence_ids(index)),
            )
    assert not any(_alive(pid) for pid in workers)


def test_closing_does_not_wait_for_a_worker_still_starting() -> None:
    """A worker still in its start (here: asleep for a minute) is terminated after the grace, not waited for."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(
        1, multiprocessing.get_context("spawn"), initializer=time.sleep, initargs=(60,)
    )
    pool.submit(abs, -1)  # spawns the worker
    workers = _workers(os.getpid())
    began = time.monotonic()
    prefetch._stop(pool, grace_s=0.2)
    assert time.monotonic() - began < 20
    assert workers and not any(_alive(pid) for pid in workers)


CHILD = """
import sys, time
from dflash_base.stopping import Stopped, install_stop_handlers
from trainer.data.order import BatchOrder
from trainer.data.prefetch import start_prefetch
from trainer.data.sources import TokenizedSource
from trainer.target_model.tokenizer import load_tokenizer

install_stop_handlers()
target, data, lead = sys.argv[1:4]
source = TokenizedSource(data, "chat", load_tokenizer(target), 48)
ahead = start_prefetch(source, target, BatchOrder(len(source), 4, 0), range(10**6), 1)
try:
    with ahead:
        ahead.settle(timeout=float(lead))  # 0: the worker is still starting
        print("started", flush=True)
        time.sleep(120)
except Stopped as exc:
    sys.exit(exc.exit_code)
"""


@pytest.mark.parametrize("how", ["ctrl-c", "ctrl-c while it starts", "sigkill"])
def test_no_worker_outlives_its_rank(chat_data: tuple[Path, Path], how: str) -> None:
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it), once the worker works or while it
    still imports torch: the rank stops its worker and exits 130, the worker says nothing; SIGKILL of the rank
    alone: its worker sees it gone and exits."""
    target, data = chat_data
    lead = "0" if how == "ctrl-c while it starts" else "60"
    rank = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(target), str(data), lead],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert rank.stdout is not None and rank.stdout.readline() == "started\n"
        workers = _children(rank.pid)  # the worker, and the resource tracker spawned processes come with
        assert len(_workers(rank.pid)) == 1
        if how.startswith("ctrl-c"):
            os.killpg(rank.pid, signal.SIGINT)
            _, err = rank.communicate(timeout=30)
            assert rank.returncode == 130, err
            assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
        else:
            rank.kill()
            rank.wait(timeout=10)
        deadline = time.monotonic() + 3 * prefetch.PARENT_POLL_S + 5
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in workers)
    finally:
        if rank.poll() is None:
            os.killpg(rank.pid, signal.SIGKILL)
            rank.wait()
