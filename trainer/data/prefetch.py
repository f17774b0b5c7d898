"""A rank's first-epoch sequences made ahead of need by worker processes: its training thread reads them back.

Rendering a `chat` record through its template and tokenising it costs ~1.2 ms of a CPU core (SmolLM2's
answers): ~37 ms of the SmolLM2 recipe's 118 ms step on an H200, spent on the rank's one host thread before it
can queue the GPU's work. The source keeps what it made (`TokenizedSource.kept`), so every later epoch reads
it back (0.45 ms a batch, BENCHMARKS 4.10); this takes the first epoch's making off that thread too.

The batches a rank asks for are known in advance (`BatchOrder` is a seeded permutation; the trainer passes
the indices in the order it will ask), so `Prefetch` keeps the next `ahead` batches' sequences that are not
kept yet being made by a small process pool, and hands what is done to the source's `kept` (within
KEPT_TOKENS) each time a batch is about to be made. Nothing else changes: a sequence that is not delivered
yet is made inline by `TokenizedSource.get`, exactly as without workers (the same `made`), so batches are
bit-identical, the order is the run's, and nothing ever waits on a worker.

Workers are spawned, not forked (the rank has initialised CUDA and runs threads), rebuild the source from a
picklable `SourceRecipe` and return numpy arrays. They ignore SIGINT (a terminal's Ctrl-C reaches the whole
process group; the rank stops them itself, `close`) and exit within a second of their rank's death (SIGKILL,
the OOM killer), so none outlives its run.

A failure falls back to inline making with one warning; it never stops the run. Prefetching only moves work
and inline making is the reference: a bad record is raised by the inline making of its batch, with the same
message at the same batch as without workers, and a worker lost to the OOM killer costs the speed-up, not the
run. After the first failure the pool is shut down and everything left is made inline.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from queue import SimpleQueue
from types import TracebackType
from typing import Any

import numpy as np
import torch

from trainer.data.order import BatchOrder
from trainer.data.sources import SequenceSource, TokenizedSource
from trainer.target_model.tokenizer import load_tokenizer

# Sequences a job: ~10 ms of a worker's time at SmolLM2's answers, so one batch is shared among the workers
# and a job's result (8 x seq_len x 5 bytes) pickles in microseconds.
CHUNK = 8
# Batches kept in the works ahead of the one being made: 32 x 16 sequences is ~0.6 s of one worker's work, so
# the lead made while the drafter compiles covers the first 16 steps of the SmolLM2 recipe, and what is
# waiting to be read back is a few MB.
AHEAD_BATCHES = 32
# "auto" on CUDA: at most this many workers. The recipe makes 32 sequences a step, ~38 ms of one core per
# ~80 ms step without them: one worker keeps up on average, four leave room for longer records and jitter
# while the host's other cores stay with the ranks' own threads.
AUTO_WORKERS = 4
PARENT_POLL_S = 1.0  # how often a worker looks for its rank
# At close: how long a worker may take to finish its job (~10 ms) before it is terminated. A worker still
# starting (importing torch, reading the data: seconds) would otherwise hold up a Ctrl-C for that long.
CLOSE_GRACE_S = 0.5


def resolve_workers(
    setting: int | str,
    kind: str,
    device_type: str,
    cores: int | None = None,
    local_ranks: int | None = None,
) -> int:
    """`data.workers` for this rank: only `text`/`chat` sources make sequences; "auto" is 0 on a CPU device (its
    cores train) and on CUDA min(AUTO_WORKERS, usable cores / ranks on this host - 1): one core per rank
    stays with the rank's own thread."""
    if kind not in ("text", "chat"):
        return 0
    if setting != "auto":
        return int(setting)
    if device_type != "cuda":
        return 0
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if local_ranks is None:
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # torchrun's; a lone rank: 1
    return max(0, min(AUTO_WORKERS, cores // max(1, local_ranks) - 1))


@dataclass(frozen=True)
class SourceRecipe:
    """What a worker rebuilds the rank's `TokenizedSource` from: plain, picklable values (a tokenizer is not)."""

    path: str
    kind: str
    tokenizer_path: str
    seq_len: int
    template_kwargs: dict[str, Any]
    loops: str
    field: str

    @classmethod
    def of(cls, source: TokenizedSource, tokenizer_path: str) -> SourceRecipe:
        return cls(
            source.path,
            source.kind,
            tokenizer_path,
            source.seq_len,
            dict(source.template_kwargs),
            source.loops,
            source.field,
        )

    def build(self) -> TokenizedSource:
        tokenizer = load_tokenizer(self.tokenizer_path)
        return TokenizedSource(
            self.path, self.kind, tokenizer, self.seq_len, self.template_kwargs, self.field, self.loops
        )


# ---------------------------------------------------------------- in the worker processes

_SOURCE: TokenizedSource | None = None  # the worker's own source, built once by `_start_worker`

Made = list[tuple[int, np.ndarray, np.ndarray]]  # (sequence id, int32 ids, bool mask), unpadded


def _start_worker(recipe: SourceRecipe, rank_pid: int) -> None:
    """A worker's start: Ctrl-C is its rank's to handle, the rank's death ends it, then the source is built.
    SIGINT was blocked since the spawn (`_sigint_blocked`): one that came meanwhile is dropped here."""
    global _SOURCE
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    threading.Thread(target=_exit_with_rank, args=(rank_pid,), name="rank-watch", daemon=True).start()
    torch.set_num_threads(1)
    _SOURCE = recipe.build()


def _exit_with_rank(rank_pid: int) -> None:
    """A spawned worker is re-parented when its rank is killed outright; nothing would tell it to stop."""
    while os.getppid() == rank_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _make(ids: list[int]) -> Made:
    """Sequences `ids` as `TokenizedSource.get` would make and keep them."""
    assert _SOURCE is not None, "_start_worker builds the source"
    made = []
    for j in ids:
        tokens, mask = _SOURCE.made(j)
        made.append((j, np.asarray(tokens, dtype=np.int32), np.asarray(mask, dtype=np.bool_)))
    return made


# ---------------------------------------------------------------- in the rank


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """A worker spawned in here starts with SIGINT blocked (a signal mask survives exec), so a Ctrl-C while it
    imports torch is not a KeyboardInterrupt traceback from it. Only this thread blocks it: the rank's own
    SIGINT is taken by another thread meanwhile, or by this one when the block ends; none is lost."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _stop(pool: Executor, grace_s: float = CLOSE_GRACE_S) -> None:
    """Shut `pool` down: jobs not started are dropped, a running one gets `grace_s` to finish, then a worker
    still alive (one still starting) is terminated; returns once every worker is gone."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # ProcessPoolExecutor's workers
    pool.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + grace_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.terminate()
            process.join()
    pool.shutdown(wait=True)  # the pool's own threads, with nothing left to wait for


def _warn_stderr(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr, flush=True)


class Prefetch:
    """The next `ahead` batches' unkept sequences in the works on `pool`, delivered to `source.kept` by `before`.

    `upcoming`: the global batch indices this rank will make, in order. `before(index)` is called by the one
    thread that makes batches, right before batch `index` is made; everything here runs on that thread (the
    pool's done-callbacks only queue the finished job). `pool`: any `Executor` running `_make` (tests pass
    their own)."""

    def __init__(
        self,
        source: TokenizedSource,
        order: BatchOrder,
        upcoming: Iterable[int],
        pool: Executor,
        ahead: int = AHEAD_BATCHES,
        chunk: int = CHUNK,
        warn: Callable[[str], None] = _warn_stderr,
    ) -> None:
        self.source, self.upcoming = source, iter(upcoming)
        self.pool: Executor | None = pool  # None once shut down: everything left is made inline
        # Its own order: looking ahead across an epoch's end must not make the trainer's order redraw its
        # permutation back and forth.
        self.order = BatchOrder(order.pool, order.batch_size, order.seed)
        self.ahead, self.chunk, self.warn = ahead, chunk, warn
        # Batches whose sequences were handed to the pool, in order, with their jobs.
        self.window: deque[tuple[int, list[Future[Made]]]] = deque()
        self.jobs: dict[Future[Made], list[int]] = {}
        self.pending: set[int] = set()  # sequence ids in the works
        self.finished: SimpleQueue[Future[Made]] = SimpleQueue()
        self.delivered = 0  # sequences made by the workers and kept
        self.out_of_order: int | None = None  # the first batch asked for that was not the next one expected
        self._fill()

    @property
    def running(self) -> bool:
        return self.pool is not None

    def before(self, index: int) -> None:
        """Batch `index` is about to be made: hand the source what is done, keep the next batches in the works."""
        if self.pool is None:
            return
        self._deliver()
        if self.pool is None:  # a failure, or KEPT_TOKENS full, found in what was delivered
            return
        if any(batch == index for batch, _ in self.window):
            while True:  # this batch and any skipped are made now: their jobs not started yet are dropped
                batch, jobs = self.window.popleft()
                for job in jobs:
                    job.cancel()
                if batch == index:
                    break
        elif self.out_of_order is None:
            self.out_of_order = index
        if index % max(1, self.order.per_epoch) == 0 and self._all_kept():
            self._shut()  # a later epoch with every sequence kept: nothing left to make, the workers go
            return
        self._fill()

    def settle(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the jobs in the works, then deliver them (a lead, for tests and
        benchmarks; training never waits)."""
        if self.pool is not None:
            wait(list(self.jobs), timeout=timeout)
            self._deliver()

    def close(self) -> None:
        """Stop the workers (`_stop`: within CLOSE_GRACE_S, a worker still starting is terminated); idempotent."""
        if self.out_of_order is not None:
            self.warn(
                f"data workers: batch {self.out_of_order} was asked for out of the expected order; the "
                "sequences made ahead may not have been the ones needed (a bug: please report it)"
            )
            self.out_of_order = None
        self._shut()

    def __enter__(self) -> Prefetch:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _fill(self) -> None:
        while self.pool is not None and len(self.window) < self.ahead:
            index = next(self.upcoming, None)
            if index is None:  # the run's last batches are in the works
                return
            kept, pending = self.source.kept, self.pending
            missing = [j for j in self.order.sequence_ids(index) if j not in kept and j not in pending]
            jobs = [
                self._submit(missing[start : start + self.chunk])
                for start in range(0, len(missing), self.chunk)
            ]
            self.window.append((index, [job for job in jobs if job is not None]))

    def _all_kept(self) -> bool:
        """Is every sequence of the order kept? (~3 ms for 60k, once an epoch once there are enough.)"""
        kept = self.source.kept
        return len(kept) >= len(self.order.pool) and all(j in kept for j in self.order.pool)

    def _submit(self, ids: list[int]) -> Future[Made] | None:
        if self.pool is None:  # failed at an earlier submit
            return None
        try:
            with _sigint_blocked():  # a submit may spawn a worker
                future = self.pool.submit(_make, ids)
        except Exception as exc:  # a pool found broken at submit
            self._fail(exc)
            return None
        self.jobs[future] = ids
        self.pending.update(ids)
        future.add_done_callback(self.finished.put)
        return future

    def _deliver(self) -> None:
        while self.pool is not None and not self.finished.empty():
            future = self.finished.get()
            self.pending.difference_update(self.jobs.pop(future, []))
            if future.cancelled():
                continue
            if (error := future.exception()) is not None:
                self._fail(error)
                return
            for j, ids, mask in future.result():
                if j in self.source.kept:  # made inline meanwhile
                    continue
                if not self.source.keep(j, torch.from_numpy(ids), torch.from_numpy(mask)):
                    self._shut()  # KEPT_TOKENS is full: what is not kept is made inline each time, as before
                    return
                self.delivered += 1

    def _fail(self, error: BaseException) -> None:
        self.warn(
            f"data workers stopped ({type(error).__name__}: {error}); the remaining sequences are made on the "
            "training thread"
        )
        self._shut()

    def _shut(self) -> None:
        pool, self.pool = self.pool, None
        self.window.clear()
        self.jobs.clear()
        self.pending.clear()
        if pool is not None:
            _stop(pool)


def start_prefetch(
    source: SequenceSource,
    tokenizer_path: str,
    order: BatchOrder,
    upcoming: Iterable[int],
    workers: int,
    warn: Callable[[str], None] = _warn_stderr,
) -> Prefetch | None:
    """`workers` spawned processes making `upcoming`'s sequences ahead; None when there is nothing to do
    (no workers, or a source that does not tokenise). Returns at once: the workers start in the background
    (~2 s to import torch and read the data), and the batches asked for before they deliver are made inline."""
    if workers <= 0 or not isinstance(source, TokenizedSource):
        return None
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_start_worker,
        initargs=(SourceRecipe.of(source, tokenizer_path), os.getpid()),
    )
    try:
        return Prefetch(source, order, upcoming, pool, warn=warn)
    except BaseException:
        with contextlib.suppress(Exception):
            _stop(pool)
        raise
