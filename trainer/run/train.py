"""The training run, one process per device under torchrun (a lone rank: started directly). Top down.

1. `main`: join the process group (torchrun's env; a world of one started without torchrun: a store in this
   process), resolve the topology once (trainer/runspec/topology.py): split (on one node ranks [0, N)
   targets, [N, N+M) drafters; over several, each node its own targets and drafters) or colocated (every
   rank both); agree on the resume step (the first drafter reads the newest
   checkpoint and tells everyone).
2. Split, `run_target`: capture the configured layers for every global batch this rank makes (i % N on one
   node; its own node's drafters' batches over several), from the resume point on, and stream them to
   drafter i % M with a bounded number in flight.
3. Split, `run_drafter`: receive batch s*M + d at step s and hand it to the `DrafterLoop`.
4. Colocated, `run_colocated`: build the frozen target and a drafter on this rank, capture batch s*K + r
   at step s and hand it to the same `DrafterLoop` (no transport, no second process per device).
5. `DrafterLoop` (both topologies): build the drafter, compile and warm it in this main thread, wrap it in
   DDP over the drafter ranks, restore a checkpoint if there is one, then per step: sample anchors,
   forward/backward (bf16 autocast on CUDA), clip, step, schedule, metrics, checkpoint. Export at the end.
   A lone rank the launcher started beside its gate (`link`) stops after its compile until the launcher's go:
   nothing it does before that writes to `output.dir` (dflash_doctor/launch/lone_rank.py).

No thread ever compiles; shapes are static (fixed seq_len, fixed anchors per sequence) and
`fail_on_recompile_limit_hit` is on, so a shape change fails loudly instead of silently going dense.
A rank that dies makes its peers' point-to-point calls fail (or time out after `run.timeout_s`) and torchrun
stops the job with a non-zero status. A rank whose parent is gone (torchrun, or the launcher that started a
lone rank directly, killed with SIGKILL) stops itself (`parent_watch`), so no rank outlives its job.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dflash_base import timeline
from dflash_base.errors import DoctorError
from dflash_base.go_link import RankLink, compiling
from dflash_base.stopping import Stopped, install_stop_handlers
from trainer.data.order import BatchOrder, make_batch, make_padded_batch
from trainer.data.prefetch import Prefetch, resolve_workers, start_prefetch
from trainer.data.sources import (
    DataSplit,
    SequenceSource,
    build_source,
    out_of_context_warning,
    split_data,
)
from trainer.model.anchors import sample_anchors
from trainer.model.batch import CapturedBatch, real_tokens
from trainer.model.build import build_drafter
from trainer.model.device import autocast_for, resolve_device
from trainer.model.drafter import DFlashDrafter
from trainer.model.loss import LossOutput
from trainer.run import checkpoint as ckpt
from trainer.run.faults import (
    Fault,
    fault_from_env,
    maybe_delay_capture,
    maybe_exit_target,
    maybe_hang_drafter,
)
from trainer.run.heldout import HeldoutEvaluator, HeldoutSums
from trainer.run.metric_sinks import open_sinks
from trainer.run.metrics import MetricsLog, Progress, summarize, write_summary
from trainer.run.optim import build_optimizer, build_scheduler, clip_gradients
from trainer.run.parent_watch import watch_parent
from trainer.run.pipeline import CaptureAhead, OptimizerStart, StepTimer
from trainer.run.profiling import StepProfiler
from trainer.run.schedule import RunPlan, plan_run, target_work
from trainer.run.startup import StartupClock
from trainer.run.steady import window_kind
from trainer.run.step_numbers import QueuedStep, StepNumbers, pack_step, step_metrics, unpack_step
from trainer.run.telemetry import MachineSampler
from trainer.run.transport import (
    BatchReceiver,
    BatchSender,
    TransportError,
    lost_peer_message,
    peer_lost,
)
from trainer.run.warmup import warm_up_model, warm_up_target
from trainer.runspec.config import TrainConfig
from trainer.runspec.outputs import EXPORT_DIR, error_line, metrics_path, read_metrics
from trainer.runspec.target_shapes import target_hf_config
from trainer.runspec.topology import (
    RunDigest,
    Topology,
    check_agreement,
    check_placement,
    overlap_mode,
    resolve_topology,
)
from trainer.target_model.capture import CaptureTarget, capture_target_for
from trainer.target_model.load import load_frozen_embeddings


@dataclass(frozen=True)
class Rank:
    """This process's place in the job (from torchrun's environment, or the launcher's for a lone rank)."""

    rank: int
    world_size: int
    local_rank: int

    @classmethod
    def from_environ(cls) -> Rank:
        return cls(
            int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
        )


def main(cfg: TrainConfig, link: RankLink | None = None) -> int:
    """`link`: the launcher started this lone rank beside its gate: compile, report, train only on its go."""
    timeline.remember("imports")  # torch and the trainer's modules, imported by the time we get here
    clock = StartupClock()
    me = Rank.from_environ()
    # SIGTERM/SIGINT/SIGHUP (torchrun stops every worker once one has failed; `train` forwards a stop)
    # raise Stopped, so `finally` blocks still run; a rank whose torchrun is gone stops itself.
    install_stop_handlers()
    watch_parent(grace_s=min(cfg.run.timeout_s, 30))
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", 1))  # torchrun's --nnodes
    topology = resolve_topology(cfg.topology, me.world_size, nodes)  # ConfigError: not what torchrun started
    clock.report_timeline(me.rank == topology.drafter_ranks[0])  # the rank whose first step is the run's
    device = resolve_device(cfg.run.device, me.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    split = split_data(cfg)
    plan = plan_run(cfg, len(split.train_ids), topology.drafters)

    join_process_group(
        "nccl" if device.type == "cuda" else "gloo", timedelta(seconds=cfg.run.timeout_s), me.world_size
    )
    try:
        # Before any other collective: every rank runs the same topology and graph config, or all stop
        # now with one message (each node's launcher resolves `auto` on its own GPUs, so nodes can differ).
        digest = RunDigest.of(cfg, topology, node=int(os.environ.get("GROUP_RANK", 0)), rank=me.rank)
        mine = torch.tensor(digest.to_row(), dtype=torch.int64, device=device)
        rows = [torch.empty_like(mine) for _ in range(me.world_size)]
        dist.all_gather(rows, mine)
        everyone = [RunDigest.from_row(row.tolist()) for row in rows]
        check_agreement(everyone)  # ConfigError: exit 2
        check_placement(everyone, topology)  # every rank on the node its pairs assume
        drafter_group = dist.new_group(topology.drafter_ranks)  # every rank must take part in creating it
        resume_step = agree_on_resume_step(cfg, topology, me.rank, device)
        clock.mark("process group")
        run = RunContext(cfg, plan, split, topology, me.rank, device, drafter_group, resume_step, clock, link)
        if topology.colocated:
            return run_colocated(run)
        if topology.is_target(me.rank):
            run_target(run)
            return 0
        return run_drafter(run)
    except TransportError as exc:
        print(f"dflash trainer: rank {me.rank}: {exc}", file=sys.stderr, flush=True)
        return 1
    except RuntimeError as exc:
        if not peer_lost(exc):
            raise
        # one line (and the launcher's reason) instead of gloo's or NCCL's traceback: another node was lost
        print(error_line(me.rank, lost_peer_message(exc)), file=sys.stderr, flush=True)
        return 1
    except DoctorError as exc:  # a full disk, a bad data line: one line, before the peers see this rank go
        hint = f"; {exc.hint}" if exc.hint else ""
        print(error_line(me.rank, exc.message + hint), file=sys.stderr, flush=True)
        return exc.exit_code
    except Stopped as exc:
        print(f"dflash trainer: rank {me.rank}: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    finally:
        dist.destroy_process_group()


def join_process_group(backend: str, timeout: timedelta, world_size: int) -> None:
    """torchrun's rendezvous (env://: MASTER_ADDR, MASTER_PORT), or, for a world of one started without
    torchrun (no MASTER_ADDR: dflash_doctor/launch/direct.py), a store in this process: no port, no peer."""
    if world_size == 1 and "MASTER_ADDR" not in os.environ:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        return
    dist.init_process_group(backend=backend, timeout=timeout)


@dataclass(frozen=True)
class RunContext:
    """What every drafter-side function of one rank needs, resolved once in `main`."""

    cfg: TrainConfig
    plan: RunPlan
    split: DataSplit  # training and held-out sequences
    topology: Topology
    rank: int
    device: torch.device
    group: dist.ProcessGroup  # the drafter ranks (all ranks when colocated): DDP and metric reductions
    # (a split's target ranks take part in creating it only)
    resume_step: int
    clock: StartupClock
    link: RankLink | None = None  # a lone rank started beside the launcher's gate: its go comes through it

    @property
    def drafter_index(self) -> int:
        return self.topology.drafter_index(self.rank)


def agree_on_resume_step(cfg: TrainConfig, topology: Topology, rank: int, device: torch.device) -> int:
    """The first drafter decides (newest checkpoint, else 0) and broadcasts: every rank resumes alike."""
    first_drafter = topology.drafter_rank(0)
    step = torch.zeros(1, dtype=torch.int64, device=device)
    if rank == first_drafter:
        latest = ckpt.latest_checkpoint(cfg.output_dir)
        step[0] = latest[0] if latest else 0
    dist.broadcast(step, src=first_drafter)
    return int(step.item())


def release_cached_memory(device: torch.device) -> None:
    """Give the build's transient blocks back to the driver before training.

    The frozen embedding and LM head are drawn in fp32 on the GPU (2 x 2.5 GB for Qwen3-8B) and then cast;
    the freed fp32 blocks stayed reserved by the caching allocator and fragmented it. NVML on two H200s at
    qwen3-8b-b16: 24.8 GiB (target rank) and 36.4 GiB (drafter rank) without this call, 17.0 / 31.8 GiB
    with it. Costs one `empty_cache` per rank, once.
    """
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- the target side (split targets, colocated)


@dataclass
class TargetSide:
    """The frozen truncated target of one rank (compiled and warmed on CUDA), its data and their order."""

    target: CaptureTarget
    source: SequenceSource
    eval_source: SequenceSource  # data.eval_path's records, or the training source (eval_fraction)
    order: BatchOrder
    fault: Fault | None = None  # a testing hook (trainer.run.faults)
    prefetch: Prefetch | None = None  # data workers making the training batches' sequences ahead

    def capture(self, index: int, device: torch.device) -> CapturedBatch:
        """Global training batch `index`: its sequences from the data, through the target."""
        maybe_delay_capture(self.fault)
        if self.prefetch is not None:
            self.prefetch.before(index)
        input_ids, loss_mask = make_batch(self.source, self.order.sequence_ids(index))
        return self.target.capture(to_device(input_ids, device), to_device(loss_mask, device), index)

    def capture_heldout(self, split: DataSplit, eval_index: int, device: torch.device) -> CapturedBatch:
        """Held-out batch `eval_index`, with the target's own greedy next tokens (the last one padded to the
        batch size with unsupervised rows)."""
        ids = split.eval_sequence_ids(eval_index)
        input_ids, loss_mask = make_padded_batch(self.eval_source, ids, split.batch_size)
        return self.target.capture_with_greedy(
            to_device(input_ids, device), to_device(loss_mask, device), eval_index
        )


@contextlib.contextmanager
def prefetching(side: TargetSide, run: RunContext, upcoming: Iterable[int]) -> Iterator[None]:
    """`data.workers` processes make the sequences of `upcoming` (the training batches this rank will capture,
    in order) ahead of need (trainer/data/prefetch.py), and are shut down however the run ends. Started before
    the drafter's build and warm-up, so the first batches are made while it compiles."""
    cfg = run.cfg
    workers = resolve_workers(cfg.data.workers, cfg.data.kind, run.device.type)

    def warn(line: str) -> None:
        print(f"dflash trainer: rank {run.rank}: warning: {line}", file=sys.stderr, flush=True)

    side.prefetch = start_prefetch(side.source, cfg.target.path, side.order, upcoming, workers, warn)
    try:
        yield
    finally:
        if side.prefetch is not None:
            side.prefetch.close()
            side.prefetch = None


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host batch onto `device` without waiting for the GPU: a plain copy from pageable memory makes
    the host wait until every kernel queued before it has run; from pinned memory it is queued like one."""
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def build_target(run: RunContext, colocated: bool = False) -> TargetSide:
    cfg, device, split = run.cfg, run.device, run.split
    target = capture_target_for(cfg, device, colocated)
    release_cached_memory(device)
    run.clock.mark("build target" if colocated else "build")
    if target.compiled:
        with compiling(run.link):
            warm_up_target(target, cfg, device)  # compile now, one rank at a time
        run.clock.mark("compile target" if colocated else "compile")
    vocab = int(target_hf_config(cfg.target.path).vocab_size)
    source = build_source(cfg, device, vocab)
    if run.rank == 0 and (unsupervised := out_of_context_warning(source)) is not None:
        print(f"dflash trainer: {unsupervised}", flush=True)
    eval_source = source
    if cfg.data.eval_path is not None and split.eval_batches:
        eval_source = build_source(cfg, device, vocab, cfg.data.eval_path, "data.eval_path")
    order = BatchOrder(split.train_ids, cfg.optim.batch_size, cfg.run.seed)
    run.clock.mark("data")
    return TargetSide(target, source, eval_source, order, fault_from_env())


def run_target(run: RunContext) -> None:
    """Split: capture every global batch this rank makes (`Topology.producer_of`) and stream it to drafter
    i % M; after each evaluated step, this rank's share of the held-out batches (target_work says the order)."""
    topology, device, cfg = run.topology, run.device, run.cfg
    side = build_target(run)
    sender = BatchSender(topology, run.rank, cfg.topology.in_flight, device)
    fault = fault_from_env()
    run.clock.report(run.rank, "target")

    def work() -> Iterator[tuple[str, int]]:
        return target_work(
            topology, run.rank, run.plan, run.resume_step, cfg.eval.every, run.split.eval_batches
        )

    with prefetching(side, run, (index for kind, index in work() if kind == "train")):
        for kind, index in work():
            if kind == "eval":
                sender.send(side.capture_heldout(run.split, index, device))
                continue
            maybe_exit_target(fault, run.rank, index)
            sender.send(side.capture(index, device))
    sender.close()


# ---------------------------------------------------------------- split drafter ranks


def run_drafter(run: RunContext) -> int:
    loop = DrafterLoop(run)
    receiver = BatchReceiver(run.topology, run.drafter_index, run.device)
    run.clock.report(run.rank, "drafter")
    return loop.run(receiver.receive, receiver.receive_eval, finish_input=receiver.expect_end)


# ---------------------------------------------------------------- colocated ranks


def run_colocated(run: RunContext) -> int:
    """Capture this rank's own batches (micro-step m: global batch m*K + r) and train on them: no transport.
    The next step's first capture is queued behind each optimizer update (`CaptureAhead`)."""
    side = build_target(run, colocated=True)
    micro_steps = range(run.resume_step * run.plan.accum, run.plan.total_steps * run.plan.accum)
    with prefetching(side, run, (run.topology.batch_for(m, run.drafter_index) for m in micro_steps)):
        loop = DrafterLoop(run)
        fault = fault_from_env()
        run.clock.report(run.rank, "colocated")

        def capture(micro_step: int) -> CapturedBatch:
            index = run.topology.batch_for(micro_step, run.drafter_index)
            maybe_exit_target(fault, run.rank, index)
            return side.capture(index, run.device)

        def heldout_batch(eval_index: int) -> CapturedBatch:
            return side.capture_heldout(run.split, eval_index, run.device)

        # CPU: synchronous
        overlap = overlap_mode(run.cfg.topology.overlap_capture, run.device.type == "cuda")
        stream = torch.cuda.Stream(run.device) if overlap != "off" else None
        start_at = OptimizerStart(loop.optimizer) if overlap == "optimizer" else None
        ahead = CaptureAhead(capture, run.plan.total_steps * run.plan.accum, stream, start_at)
        return loop.run(ahead.next_batch, heldout_batch, prefetch=ahead.prefetch)


# ---------------------------------------------------------------- the drafter side, shared by both


class DrafterLoop:
    """One drafter replica's training: what a split drafter and a colocated rank do alike.

    Built once (drafter, warm-up, DDP over the drafter ranks, optimiser, schedule, RNG, resume), then
    `run(next_batch, heldout_batch)` trains one optimiser step per `optim.grad_accum` micro-batches and scores
    this replica's share of the held-out batches when an evaluation is due; where a batch comes from
    (received, or captured here) is the only thing the topologies differ in. Per-step work: `train_on`.
    A step's numbers are read one step late (`trainer.run.pipeline`): the host never drains the GPU per step.
    """

    def __init__(self, run: RunContext) -> None:
        cfg, device = run.cfg, run.device
        self.run_ctx = run
        self.began = time.monotonic()
        self.index = run.drafter_index
        self.is_first = self.index == 0
        embed, lm_head, hf_config = load_frozen_embeddings(cfg.target.path, cfg.run.seed, device)
        self.model = build_drafter(cfg, hf_config, embed, lm_head, device)
        del embed, lm_head  # the model holds its own (cast) copies
        release_cached_memory(device)
        run.clock.mark("build")
        with compiling(run.link):  # compile here, in the main thread, before the loop
            warmup = warm_up_model(self.model, cfg, device)
        run.clock.mark("compile")
        if run.link is not None:  # started beside the launcher's gate: nothing below runs before its go
            run.link.ready({**warmup, "startup": run.clock.as_dict(), "at": time.time()})
            run.link.wait_for_go()
            run.clock.mark("go wait")
        self.ddp = data_parallel(self.model, run.group, device)
        self.optimizer = build_optimizer(self.model, cfg.optim, device)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, run.plan.total_steps)
        self.anchor_gen = torch.Generator(device=device).manual_seed(
            cfg.run.seed * 1_000_003 + 7 + self.index
        )
        self.state = ckpt.TrainState(self.model, self.optimizer, self.scheduler, self.anchor_gen)
        self.checkpointer, self.heldout = drafter_components(run, self.index)
        if run.resume_step:
            self.checkpointer.restore(self.state, run.resume_step, device)
        first = self.is_first
        self.log = (
            MetricsLog(metrics_path(cfg.output_dir), run.resume_step, metric_sinks(cfg, run.resume_step))
            if first
            else None
        )
        self.progress = Progress(run.plan.total_steps, run.resume_step, cfg.run.log_every) if first else None
        self.machine = MachineSampler(device) if first else None  # each metrics line's GPU and host reading
        if first:
            resuming = f", resuming at step {run.resume_step}" if run.resume_step else ""
            print(
                f"dflash trainer: {run.topology.describe()}, {run.plan.total_steps} steps{resuming}; "
                f"warm-up {warmup['seconds']}s ({warmup['attention']} on {warmup['device']}); "
                f"{run.split.describe_heldout()}",
                flush=True,
            )
        self.fault = fault_from_env()
        self.timer = StepTimer(device)
        self.profiler = StepProfiler(cfg.profile, cfg.output_dir, run.rank, device)
        self.logged_any = False
        self.queued: QueuedStep | None = None  # the last step, its numbers still on their way to the host
        self.prefetch: Callable[[int], None] | None = None
        run.clock.mark("optimizer + DDP")
        self.warmup = {**warmup, "startup": run.clock.as_dict()}  # kept in summary.json with the warm-up

    def run(
        self,
        next_batch: Callable[[int], CapturedBatch],
        heldout_batch: Callable[[int], CapturedBatch],
        finish_input: Callable[[], None] | None = None,
        prefetch: Callable[[int], None] | None = None,
    ) -> int:
        """Every remaining step on `next_batch(micro_step)` (held-out scoring on `heldout_batch(j)` when due);
        then `finish_input`, export, summary. `prefetch(m)`, when given, queues micro-step m's batch early."""
        run = self.run_ctx
        self.prefetch = prefetch
        status, error = "failed", None
        try:
            for step in range(run.resume_step, run.plan.total_steps):
                maybe_hang_drafter(self.fault, self.index, step)
                self.profiler.before(step + 1)
                self.train_on(step, MicroBatches(next_batch, step, run.plan.accum), heldout_batch)
                self.profiler.after(step + 1)
            self.log_queued()
            if finish_input is not None:
                finish_input()
            if self.is_first:
                announce_export(run.cfg, self.model)
            status = "ok"
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, Stopped):
                status = "interrupted"
            with contextlib.suppress(Exception):  # the last step that finished, into the record
                self.log_queued()
            raise
        finally:
            self.close(status, error)
        return 0

    def train_on(self, step: int, feed: MicroBatches, heldout_batch: Callable[[int], CapturedBatch]) -> None:
        """One optimiser step on the step's micro-batches, queued without reading anything back; then the
        previous step's metrics (first drafter), read now that this step's work is queued. A step with a
        held-out evaluation or a checkpoint after it is finished and logged at once."""
        run, cfg = self.run_ctx, self.run_ctx.cfg
        done = step + 1
        evaluate, checkpoint = self.heldout.due(done), self.checkpointer.due(done)
        started = self.timer.mark()
        outs, grad_norm, lr = train_step(
            self.ddp, self.model, feed, cfg, self.anchor_gen, self.optimizer, self.scheduler, run.device
        )
        numbers = StepNumbers(pack_step(outs, feed, grad_norm, run.group))
        # A step's window runs from the previous step's end to this mark: it holds this step's own capture
        # (queued below by the previous step, or captured inline) and never the next step's, so every
        # step's time is real, the last one and those before an evaluation or a checkpoint too.
        ended = self.timer.mark()
        if self.prefetch is not None and not (evaluate or checkpoint):
            self.prefetch(done * run.plan.accum)  # the next step's first capture, behind this update
        since = self.queued.ended if self.queued is not None else started
        window = window_kind(
            done, run.resume_step + 1, run.plan.total_steps, evaluate, checkpoint, self.queued is None
        )
        current = QueuedStep(done, numbers, outs[0].correct.numel(), lr, feed.waited, since, ended, window)
        self.log_queued()
        if not (evaluate or checkpoint):
            self.queued = current
            return
        heldout, heldout_s = None, 0.0
        if evaluate:
            t1 = time.perf_counter()
            heldout = self.heldout.run(self.model, heldout_batch)
            heldout_s = time.perf_counter() - t1
        self.log_step(current, heldout, heldout_s)
        if checkpoint:
            self.checkpointer.save(self.state, done)

    def log_queued(self) -> None:
        """Log the step whose numbers were left on their way (if any)."""
        queued, self.queued = self.queued, None
        if queued is not None:
            self.log_step(queued, None, 0.0)

    def log_step(self, queued: QueuedStep, heldout: HeldoutSums | None, heldout_s: float) -> None:
        """Wait for one step's numbers (not for later work) and, on the first drafter, log them."""
        packed = queued.numbers.read()
        elapsed = self.timer.seconds(queued.since, queued.ended)
        if self.log is None or self.progress is None:
            return
        stats, grad_norm = unpack_step(packed, queued.block, dist.get_world_size(self.run_ctx.group))
        m = step_metrics(
            queued.step,
            stats,
            queued.lr,
            grad_norm,
            elapsed,
            queued.waited,
            heldout,
            heldout_s,
            queued.window,
            self.machine.sample() if self.machine is not None else None,
        )
        self.log.write(m)
        self.progress.update(m)
        if not self.logged_any:  # the launch timeline's last phase: the first metrics line is out
            self.logged_any = True
            self.run_ctx.clock.timeline_mark("first step")

    def close(self, status: str, error: str | None) -> None:
        """The first drafter closes its log and writes summary.json (also when the run failed)."""
        run, cfg = self.run_ctx, self.run_ctx.cfg
        if self.progress is not None:
            self.progress.close()
        if self.log is None:
            return
        self.log.close()
        write_summary(
            cfg.output_dir,
            summarize(
                read_metrics(metrics_path(cfg.output_dir)),
                status,
                time.monotonic() - self.began,
                error=error,
                export_dir=str(cfg.output_dir / EXPORT_DIR) if status == "ok" else None,
                resumed_from=run.resume_step,
                total_steps=run.plan.total_steps,
                sequences_per_step=cfg.optim.batch_size * run.plan.accum * run.topology.drafters,
                warmup=self.warmup,
                topology=run.topology.to_json(),
            ),
        )


def drafter_components(run: RunContext, index: int) -> tuple[ckpt.Checkpointer, HeldoutEvaluator]:
    """A drafter replica's checkpointer and held-out evaluator, each handed its own config section and the
    few values it uses (as torchtitan hands its components theirs), never the whole config."""
    cfg, total_steps = run.cfg, run.plan.total_steps
    checkpointer = ckpt.Checkpointer(
        cfg.checkpoint,
        cfg.output_dir,
        grad_accum=cfg.optim.grad_accum,
        config=cfg.to_dict(),
        topology=run.topology,
        group=run.group,
        index=index,
        total_steps=total_steps,
    )
    heldout = HeldoutEvaluator(
        cfg.eval,
        cfg.precision,
        anchors=cfg.optim.anchors,
        batches=run.split.eval_batches,
        total_steps=total_steps,
        index=index,
        group=run.group,
        device=run.device,
    )
    return checkpointer, heldout


def data_parallel(model: nn.Module, group: dist.ProcessGroup, device: torch.device) -> nn.Module:
    """DDP over the drafter ranks; the model itself when it is the only one.

    One drafter has nothing to average, and DDP would still copy every gradient into its buckets and
    all-reduce them (1.05B fp32 gradients at Qwen3-8B shapes: ~4 GiB moved several times a step, and a
    bucket copy of them held). With several, the gradients are views into the buckets
    (`gradient_as_bucket_view`): one copy less per step and no second set of gradients in memory."""
    if dist.get_world_size(group) == 1:
        return model
    return DistributedDataParallel(
        model,
        process_group=group,
        device_ids=[device.index] if device.type == "cuda" else None,
        gradient_as_bucket_view=True,
    )


class MicroBatches:
    """The batches of one optimizer step (micro-steps step*accum .. step*accum + accum-1), fetched as they
    are needed, with the time spent waiting and the real (non-padding) and supervised tokens they held."""

    def __init__(self, next_batch: Callable[[int], CapturedBatch], step: int, accum: int) -> None:
        self.next_batch, self.step, self.accum = next_batch, step, accum
        self.waited, self.sequences = 0.0, 0
        # Counted on the batches' device, read with the step's other numbers: no host sync per batch.
        self.real_tokens: torch.Tensor | int = 0
        self.supervised_tokens: torch.Tensor | int = 0

    def __iter__(self) -> Iterator[CapturedBatch]:
        for micro in range(self.accum):
            t0 = time.perf_counter()
            batch = self.next_batch(self.step * self.accum + micro)
            self.waited += time.perf_counter() - t0
            self.real_tokens = self.real_tokens + real_tokens(batch.input_ids, batch.loss_mask)
            self.supervised_tokens = self.supervised_tokens + batch.loss_mask.sum()
            self.sequences += batch.batch_size
            yield batch


def announce_export(cfg: TrainConfig, model: DFlashDrafter) -> None:
    """Export the drafter (bf16 unless output.export_dtype = "fp32") and print how to serve it."""
    from trainer.model.export import export_drafter, serve_commands

    dtype = torch.float32 if cfg.output.export_dtype == "fp32" else torch.bfloat16
    exported = export_drafter(
        model, cfg.output_dir / EXPORT_DIR, dtype, cfg.drafter.mask_token_text, cfg.target.path
    )
    print(f"dflash trainer: exported the drafter to {exported}", flush=True)
    for engine, command in serve_commands(cfg.target.path, exported, model.cfg.block_size).items():
        print(f"  serve with {engine}: {command}", flush=True)


def train_step(
    ddp: nn.Module,
    model: nn.Module,
    batches: Iterable[CapturedBatch],
    cfg: TrainConfig,
    anchor_gen: torch.Generator,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    device: torch.device,
) -> tuple[list[LossOutput], torch.Tensor, float]:
    """Per micro-batch (`optim.grad_accum` of them): anchors, forward+backward of loss / accum (DDP averages gradients over the drafters,
    once, on the last micro-batch); then clip, step, schedule. Returns the micro-batches' loss outputs, the
    grad norm before clipping (a 0-dim device tensor: nothing here reads the GPU back) and the lr this step used."""
    outs: list[LossOutput] = []
    accum = cfg.optim.grad_accum
    for micro, batch in enumerate(batches):
        last = micro == accum - 1
        anchors, valid = sample_anchors(
            batch.loss_mask, cfg.optim.anchors, cfg.drafter.block_size, anchor_gen
        )
        no_sync = getattr(
            ddp, "no_sync", None
        )  # DDP: hold the gradient all-reduce until the last micro-batch
        sync = contextlib.nullcontext() if last or no_sync is None else no_sync()
        with sync:
            with autocast_for(cfg.precision, device):
                out: LossOutput = ddp(batch.input_ids, batch.loss_mask, batch.hidden, anchors, valid)
            (out.loss / accum).backward()
        outs.append(out)
    grad_norm = clip_gradients(model, cfg.optim.grad_clip)
    lr = float(optimizer.param_groups[0]["lr"])
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return outs, grad_norm, lr


def metric_sinks(cfg: TrainConfig, resume_step: int) -> list[Any]:
    """TensorBoard and W&B, when `[output]` asks for them (first drafter rank only)."""
    o = cfg.output
    if not (o.tensorboard or o.wandb):
        return []
    return open_sinks(cfg.output_dir, o.tensorboard, o.wandb, cfg.to_dict(), resume_step)
