"""Target ranks -> drafter ranks: captured batches over torch.distributed point-to-point (gloo or NCCL).

Split topology only (a colocated rank trains on what it captured itself). Which rank is a target and which
target makes which batch is `trainer.runspec.topology.Topology`'s: on one node ranks [0, N) are targets,
[N, N+M) drafters, and global batch i is produced by target i % N; over several nodes each node's targets
make its own drafters' batches. Batch i is consumed by drafter i % M, so drafter d at step s trains on batch
s*M + d: nothing is negotiated at run time, and a resumed run knows where every rank stands from the step
alone.

On the wire, per batch: a fixed-size int64 header (kind, batch index, B, S, F, hidden dtype), then input_ids,
loss_mask (as uint8: gloo has no bool) and hidden. Each (target, drafter) pair is a FIFO channel, so the
header always precedes its own payload. A target keeps at most `in_flight` batches sent-but-unfinished
(isend, then wait on the oldest when over the bound). When a target is done it sends an END header to every
drafter it feeds; a drafter that finished its steps expects exactly that from every target that feeds it
(`Topology.pairs`: over several nodes, only its own node's: nothing crosses the network but the gradients).

Held-out (eval) batches travel on the same channels with their own kind and index space (eval batch j:
`producer_of(j)` -> drafter j % M), and one more tensor after hidden: the target's greedy next tokens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from trainer.model.batch import CapturedBatch
from trainer.runspec.topology import Topology  # who sends to whom; colocated runs need no transport

HEADER_LEN = 8
KIND_BATCH = 1
KIND_END = 2
KIND_EVAL = 3  # a held-out batch: input_ids, loss_mask, hidden, then target_ids
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_CODE_DTYPES = {code: dtype for dtype, code in _DTYPE_CODES.items()}


class TransportError(RuntimeError):
    """A peer vanished, went silent past the timeout, or sent something other than what was due."""


@dataclass(frozen=True)
class Header:
    kind: int
    index: int
    batch_size: int
    seq_len: int
    features: int
    dtype: torch.dtype


def encode_header(batch: CapturedBatch | None, index: int = -1) -> torch.Tensor:
    """The int64 header of a batch, or of END when batch is None."""
    if batch is None:
        return torch.tensor([KIND_END, index, 0, 0, 0, 0, 0, 0], dtype=torch.int64)
    b, s, f = batch.hidden.shape
    code = _DTYPE_CODES[batch.hidden.dtype]
    kind = KIND_EVAL if batch.is_eval else KIND_BATCH
    return torch.tensor([kind, batch.index, b, s, f, code, 0, 0], dtype=torch.int64)


def decode_header(header: torch.Tensor) -> Header:
    kind, index, b, s, f, code = (int(v) for v in header.tolist()[:6])
    if kind not in (KIND_BATCH, KIND_END, KIND_EVAL) or code not in _CODE_DTYPES:
        raise TransportError(f"malformed header {header.tolist()}")
    return Header(kind, index, b, s, f, _CODE_DTYPES[code])


class BatchSender:
    """A target rank's outbox: isend with at most `in_flight` batches unfinished."""

    def __init__(self, topology: Topology, rank: int, in_flight: int, device: torch.device) -> None:
        self.topology, self.rank, self.in_flight, self.device = topology, rank, in_flight, device
        self._pending: deque[tuple[int, list[dist.Work | None], list[torch.Tensor]]] = deque()
        self.max_pending_seen = 0

    def send(self, batch: CapturedBatch) -> None:
        dst = self.topology.drafter_rank(self.topology.consumer_of(batch.index))
        tensors = [
            encode_header(batch).to(self.device),
            batch.input_ids.contiguous(),
            batch.loss_mask.to(torch.uint8).contiguous(),
            batch.hidden.contiguous(),
        ]
        if batch.target_ids is not None:
            tensors.append(batch.target_ids.contiguous())
        works = [dist.isend(t, dst) for t in tensors]
        self._pending.append((dst, works, tensors))  # the tensors must outlive their sends
        self.max_pending_seen = max(self.max_pending_seen, len(self._pending))
        while len(self._pending) > self.in_flight:
            self._wait_oldest()

    def _wait_oldest(self) -> None:
        dst, works, _ = self._pending.popleft()
        for work in works:
            if work is not None:  # isend returns None where this rank is not in the group
                with _lost(dst, "sending a batch"):
                    work.wait()

    def close(self) -> None:
        """Finish every send, then tell every drafter this target feeds that it is done."""
        while self._pending:
            self._wait_oldest()
        for dst in self.topology.drafters_fed_by(self.rank):
            with _lost(dst, "sending the end of the stream"):
                dist.send(encode_header(None).to(self.device), dst)


# What gloo and NCCL say when a peer's process or its node went away mid-collective (a DDP all-reduce, the
# metrics' all-reduce): the drafters' gradient all-reduce is the one collective that crosses nodes.
PEER_GONE = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "remote process exited",
    "NCCL communicator was aborted",
)


def peer_lost(exc: BaseException) -> bool:
    """A collective failed because another rank of the run stopped (on this node or another)."""
    return isinstance(exc, RuntimeError) and (
        isinstance(exc, dist.DistNetworkError) or any(text in str(exc) for text in PEER_GONE)
    )


def lost_peer_message(exc: BaseException) -> str:
    """The one line for it: what happened, the library's own first line, where to look."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return (
        f"lost a peer of this run in a collective ({first[:200]}): a rank stopped, on this node or another "
        "(a node lost: its launcher killed, its machine or network down); that rank's own error, or its node's "
        "run record, says why"
    )


@contextmanager
def _lost(peer: int, doing: str) -> Iterator[None]:
    """A send to a drafter that died (its own error is the run's reason) as one TransportError line."""
    try:
        yield
    except RuntimeError as exc:  # gloo: connection closed / timed out; NCCL: watchdog abort
        raise TransportError(f"lost drafter rank {peer} while {doing}: {exc}") from exc


class BatchReceiver:
    """A drafter rank's inbox: receives exactly the batches the assignment gives it, in order."""

    def __init__(self, topology: Topology, drafter_index: int, device: torch.device) -> None:
        self.topology, self.drafter_index, self.device = topology, drafter_index, device
        self.rank = topology.drafter_rank(drafter_index)

    def _recv(self, tensor: torch.Tensor, src: int, what: str) -> torch.Tensor:
        try:
            dist.recv(tensor, src)
        except RuntimeError as exc:  # gloo: connection closed / timed out; NCCL: watchdog abort
            raise TransportError(
                f"drafter rank {self.rank}: lost target rank {src} while waiting for {what}: {exc}"
            ) from exc
        return tensor

    def _header(self, src: int, what: str) -> Header:
        return decode_header(
            self._recv(torch.empty(HEADER_LEN, dtype=torch.int64, device=self.device), src, what)
        )

    def receive(self, step: int) -> CapturedBatch:
        """The training batch of micro-step `step` (step * drafters + this drafter's index)."""
        return self._receive(self.topology.batch_for(step, self.drafter_index), KIND_BATCH)

    def receive_eval(self, eval_index: int) -> CapturedBatch:
        """Held-out batch `eval_index` (it carries the target's greedy next tokens)."""
        return self._receive(eval_index, KIND_EVAL)

    def _receive(self, index: int, kind: int) -> CapturedBatch:
        src = self.topology.producer_of(index)
        what = f"{'held-out ' if kind == KIND_EVAL else ''}batch {index}"
        head = self._header(src, what)
        if head.kind != kind or head.index != index:
            names = {KIND_END: "end of stream", KIND_EVAL: "held-out batch", KIND_BATCH: "batch"}
            got = names[head.kind] + ("" if head.kind == KIND_END else f" {head.index}")
            raise TransportError(
                f"drafter rank {self.rank}: expected {what} from target rank {src}, got {got}"
            )
        b, s, f = head.batch_size, head.seq_len, head.features
        input_ids = self._recv(torch.empty(b, s, dtype=torch.int64, device=self.device), src, what)
        loss_mask = self._recv(torch.empty(b, s, dtype=torch.uint8, device=self.device), src, what)
        hidden = self._recv(torch.empty(b, s, f, dtype=head.dtype, device=self.device), src, what)
        target_ids = None
        if kind == KIND_EVAL:
            target_ids = self._recv(torch.empty(b, s, dtype=torch.int64, device=self.device), src, what)
        return CapturedBatch(input_ids, loss_mask.bool(), hidden, index, target_ids)

    def expect_end(self) -> None:
        """After the last step: every target that feeds this drafter must say it is done (and nothing else
        may be queued)."""
        for src in self.topology.targets_feeding(self.rank):
            head = self._header(src, "end of stream")
            if head.kind != KIND_END:
                raise TransportError(
                    f"drafter rank {self.rank}: expected end of stream from target rank {src}, got batch {head.index}"
                )
