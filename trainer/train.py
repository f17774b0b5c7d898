"""The training run, one process per device under torchrun. Read top to bottom.

1. `main`: join the process group (torchrun's env), resolve the topology once (trainer/topology.py):
   split (ranks [0, N) targets, [N, N+M) drafters) or colocated (every rank both); agree on the resume
   step (the first drafter reads the newest checkpoint and tells everyone).
2. Split, `run_target`: capture the configured layers for every global batch i with i % N == rank, from
   the resume point on, and stream them to drafter i % M with a bounded number in flight.
3. Split, `run_drafter`: receive batch s*M + d at step s and hand it to the `DrafterLoop`.
4. Colocated, `run_colocated`: build the frozen target and a drafter on this rank, capture batch s*K + r
   at step s and hand it to the same `DrafterLoop` (no transport, no second process per device).
5. `DrafterLoop` (both topologies): build the drafter, compile and warm it in this main thread, wrap it in
   DDP over the drafter ranks, restore a checkpoint if there is one, then per step: sample anchors,
   forward/backward (bf16 autocast on CUDA), clip, step, schedule, metrics, checkpoint. Export at the end.

No thread ever compiles; shapes are static (fixed seq_len, fixed anchors per sequence) and
`fail_on_recompile_limit_hit` is on, so a shape change fails loudly instead of silently going dense.
A rank that dies makes its peers' point-to-point calls fail (or time out after `run.timeout_s`) and torchrun
stops the job with a non-zero status. A rank whose torchrun is gone (killed with SIGKILL) stops itself
(`parent_watch`), so no rank outlives its job.
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dflash_doctor.errors import ConfigError
from dflash_doctor.stopping import Stopped, install_stop_handlers
from trainer import checkpoint as ckpt
from trainer.anchors import sample_anchors
from trainer.batch import CapturedBatch
from trainer.config import TrainConfig
from trainer.data import (
    BatchOrder,
    RunPlan,
    SequenceSource,
    batches_of_target,
    build_source,
    make_batch,
    num_sequences,
    plan_run,
)
from trainer.faults import fault_from_env, maybe_exit_target, maybe_hang_drafter
from trainer.loss import LossOutput, expected_acceptance_length
from trainer.metrics import MetricsLog, Progress, StepMetrics, read_metrics, summarize, write_summary
from trainer.optim import build_optimizer, build_scheduler, clip_gradients
from trainer.parent_watch import watch_parent
from trainer.startup import StartupClock
from trainer.target import (
    CaptureTarget,
    load_capture_target,
    load_frozen_embeddings,
    target_dtype,
    target_hf_config,
)
from trainer.topology import Topology, resolve_topology
from trainer.transport import BatchReceiver, BatchSender, TransportError
from trainer.warmup import autocast_for, build_drafter, resolve_device, warm_up_model, warm_up_target


@dataclass(frozen=True)
class Rank:
    """This process's place in the job (from torchrun's environment)."""

    rank: int
    world_size: int
    local_rank: int

    @classmethod
    def from_environ(cls) -> Rank:
        return cls(
            int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
        )


def main(cfg: TrainConfig) -> int:
    clock = StartupClock()
    me = Rank.from_environ()
    # SIGTERM/SIGINT/SIGHUP (torchrun stops every worker once one has failed; `train` forwards a stop)
    # raise Stopped, so `finally` blocks still run; a rank whose torchrun is gone stops itself.
    install_stop_handlers()
    watch_parent(grace_s=min(cfg.run.timeout_s, 30))
    topology = resolve_topology(cfg.topology, me.world_size)  # ConfigError if torchrun started too many
    device = resolve_device(cfg.run.device, me.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    plan = plan_run(cfg, num_sequences(cfg), topology.drafters)

    dist.init_process_group(
        backend="nccl" if device.type == "cuda" else "gloo", timeout=timedelta(seconds=cfg.run.timeout_s)
    )
    try:
        drafter_group = dist.new_group(topology.drafter_ranks)  # every rank must take part in creating it
        resume_step = agree_on_resume_step(cfg, topology, me.rank, device)
        clock.mark("process group")
        run = RunContext(cfg, plan, topology, me.rank, device, drafter_group, resume_step, clock)
        if topology.colocated:
            return run_colocated(run)
        if topology.is_target(me.rank):
            run_target(run)
            return 0
        return run_drafter(run)
    except TransportError as exc:
        print(f"dflash trainer: rank {me.rank}: {exc}", file=sys.stderr, flush=True)
        return 1
    except Stopped as exc:
        print(f"dflash trainer: rank {me.rank}: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    finally:
        dist.destroy_process_group()


@dataclass(frozen=True)
class RunContext:
    """What every drafter-side function of one rank needs, resolved once in `main`."""

    cfg: TrainConfig
    plan: RunPlan
    topology: Topology
    rank: int
    device: torch.device
    group: dist.ProcessGroup  # the drafter ranks (all ranks when colocated): DDP and metric reductions
    # (a split's target ranks take part in creating it only)
    resume_step: int
    clock: StartupClock

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


def build_target(
    cfg: TrainConfig, device: torch.device, clock: StartupClock, colocated: bool = False
) -> tuple[CaptureTarget, SequenceSource, BatchOrder]:
    """The frozen truncated target (compiled and warmed on CUDA), the data and its order."""
    assert cfg.drafter.target_layer_ids is not None
    dtype = target_dtype(cfg.target.dtype, device)
    target = load_capture_target(
        cfg.target.path,
        cfg.drafter.target_layer_ids,
        cfg.run.seed,
        device,
        dtype,
        compile_layers=cfg.target.compile_layers and device.type == "cuda",
        inference_tensors=not colocated,  # a colocated drafter trains on the captured tensors
    )
    release_cached_memory(device)
    clock.mark("build target" if colocated else "build")
    if target.compiled:
        warm_up_target(target, cfg, device)  # compile now, one rank at a time
        clock.mark("compile target" if colocated else "compile")
    vocab = int(target_hf_config(cfg.target.path).vocab_size)
    source = build_source(cfg, device, vocab)
    order = BatchOrder(len(source), cfg.optim.batch_size, cfg.run.seed)
    clock.mark("data")
    return target, source, order


def capture_batch(
    target: CaptureTarget, source: SequenceSource, order: BatchOrder, index: int, device: torch.device
) -> CapturedBatch:
    """Global batch `index`: its sequences from the data, through the target."""
    input_ids, loss_mask = make_batch(source, order.sequence_ids(index))
    return target.capture(input_ids.to(device), loss_mask.to(device), index)


def run_target(run: RunContext) -> None:
    """Split: capture every global batch i with i % N == rank and stream it to drafter i % M."""
    topology, device = run.topology, run.device
    target, source, order = build_target(run.cfg, device, run.clock)
    sender = BatchSender(topology, run.cfg.topology.in_flight, device)
    fault = fault_from_env()
    first_batch = run.resume_step * topology.drafters  # the data position: global batch index
    run.clock.report(run.rank, "target")
    for index in batches_of_target(run.rank, topology.targets, first_batch, run.plan.total_batches):
        maybe_exit_target(fault, run.rank, index)
        sender.send(capture_batch(target, source, order, index, device))
    sender.close()


# ---------------------------------------------------------------- split drafter ranks


def run_drafter(run: RunContext) -> int:
    loop = DrafterLoop(run)
    receiver = BatchReceiver(run.topology, run.drafter_index, run.device)
    run.clock.report(run.rank, "drafter")
    return loop.run(receiver.receive, finish_input=receiver.expect_end)


# ---------------------------------------------------------------- colocated ranks


def run_colocated(run: RunContext) -> int:
    """Capture this rank's own batches (s*K + r at step s) and train on them: no transport."""
    target, source, order = build_target(run.cfg, run.device, run.clock, colocated=True)
    loop = DrafterLoop(run)
    fault = fault_from_env()
    run.clock.report(run.rank, "colocated")

    def next_batch(step: int) -> CapturedBatch:
        index = run.topology.batch_for(step, run.drafter_index)
        maybe_exit_target(fault, run.rank, index)
        return capture_batch(target, source, order, index, run.device)

    return loop.run(next_batch)


# ---------------------------------------------------------------- the drafter side, shared by both


class DrafterLoop:
    """One drafter replica's training: what a split drafter and a colocated rank do alike.

    Built once (drafter, warm-up, DDP over the drafter ranks, optimiser, schedule, RNG, resume), then
    `run(next_batch)` trains one step per batch; where a batch comes from (received, or captured here)
    is the only thing the topologies differ in. Per-step work lives in `train_on`.
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
        warmup = warm_up_model(self.model, cfg, device)  # compile here, in the main thread, before the loop
        run.clock.mark("compile")
        self.ddp = DistributedDataParallel(
            self.model, process_group=run.group, device_ids=[device.index] if device.type == "cuda" else None
        )
        self.optimizer = build_optimizer(self.model, cfg.optim, device)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, run.plan.total_steps)
        self.anchor_gen = torch.Generator(device=device).manual_seed(
            cfg.run.seed * 1_000_003 + 7 + self.index
        )
        if run.resume_step:
            restore(
                cfg,
                self.model,
                self.optimizer,
                self.scheduler,
                self.anchor_gen,
                self.index,
                run.topology,
                run.resume_step,
                device,
            )
        first = self.is_first
        self.log = MetricsLog(cfg.output_dir / "metrics.jsonl", run.resume_step) if first else None
        self.progress = Progress(run.plan.total_steps, run.resume_step, cfg.run.log_every) if first else None
        if first:
            resuming = f", resuming at step {run.resume_step}" if run.resume_step else ""
            print(
                f"dflash trainer: {run.topology.describe()}, {run.plan.total_steps} steps{resuming}; "
                f"warm-up {warmup['seconds']}s ({warmup['attention']} on {warmup['device']})",
                flush=True,
            )
        self.fault = fault_from_env()
        run.clock.mark("optimizer + DDP")
        self.warmup = {**warmup, "startup": run.clock.as_dict()}  # kept in summary.json with the warm-up

    def run(
        self, next_batch: Callable[[int], CapturedBatch], finish_input: Callable[[], None] | None = None
    ) -> int:
        """Every remaining step on `next_batch(step)`; then `finish_input`, export, summary."""
        run = self.run_ctx
        status, error = "failed", None
        try:
            for step in range(run.resume_step, run.plan.total_steps):
                maybe_hang_drafter(self.fault, self.index, step)
                t0 = time.perf_counter()
                batch = next_batch(step)
                self.train_on(step, batch, t0, waited=time.perf_counter() - t0)
            if finish_input is not None:
                finish_input()
            if self.is_first:
                from trainer.export import export_drafter

                exported = export_drafter(self.model, run.cfg.output_dir / "export")
                print(f"dflash trainer: exported the drafter to {exported}", flush=True)
            status = "ok"
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, Stopped):
                status = "interrupted"
            raise
        finally:
            self.close(status, error)
        return 0

    def train_on(self, step: int, batch: CapturedBatch, began: float, waited: float) -> None:
        """One optimiser step on `batch`; metrics (first drafter) and checkpoints as the config says."""
        run, cfg = self.run_ctx, self.run_ctx.cfg
        out, grad_norm, lr = train_step(
            self.ddp, self.model, batch, cfg, self.anchor_gen, self.optimizer, self.scheduler, run.device
        )
        stats = reduce_over_drafters(out, run.group)
        if run.device.type == "cuda":
            torch.cuda.synchronize(run.device)
        elapsed = time.perf_counter() - began
        done = step + 1
        if self.log is not None and self.progress is not None:
            m = step_metrics(done, stats, lr, grad_norm, batch, run.topology, elapsed, waited)
            self.log.write(m)
            self.progress.update(m)
        every = cfg.checkpoint.every
        if (every and done % every == 0) or done == run.plan.total_steps:
            save(
                cfg,
                self.model,
                self.optimizer,
                self.scheduler,
                self.anchor_gen,
                run.group,
                self.index,
                done,
                run.topology,
            )

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
                read_metrics(cfg.output_dir / "metrics.jsonl"),
                status,
                time.monotonic() - self.began,
                error=error,
                export_dir=str(cfg.output_dir / "export") if status == "ok" else None,
                resumed_from=run.resume_step,
                total_steps=run.plan.total_steps,
                warmup=self.warmup,
                topology=run.topology.to_json(),
            ),
        )


def train_step(
    ddp: nn.Module,
    model: nn.Module,
    batch: CapturedBatch,
    cfg: TrainConfig,
    anchor_gen: torch.Generator,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    device: torch.device,
) -> tuple[LossOutput, float, float]:
    """Anchors, forward+backward (DDP averages gradients over the drafters), clip, step, schedule.
    Returns the loss output, the grad norm before clipping and the lr this step used."""
    anchors, valid = sample_anchors(batch.loss_mask, cfg.optim.anchors, cfg.drafter.block_size, anchor_gen)
    with autocast_for(cfg, device):
        out: LossOutput = ddp(batch.input_ids, batch.loss_mask, batch.hidden, anchors, valid)
    out.loss.backward()
    grad_norm = clip_gradients(model, cfg.optim.grad_clip)
    lr = float(optimizer.param_groups[0]["lr"])
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return out, grad_norm, lr


@dataclass
class StepStats:
    """One step's numbers summed over the drafter ranks."""

    loss: float  # mean of the ranks' losses
    correct: torch.Tensor
    counted: torch.Tensor
    accept_len_sum: float
    anchors: float


def reduce_over_drafters(out: LossOutput, group: dist.ProcessGroup) -> StepStats:
    block = out.correct.numel()
    packed = torch.cat(
        [
            out.loss.detach().float().view(1),
            out.correct.float(),
            out.counted.float(),
            out.accept_len_sum.float().view(1),
            out.anchors.float().view(1),
        ]
    )
    dist.all_reduce(packed, group=group)
    packed = packed.cpu()
    world = dist.get_world_size(group)
    return StepStats(
        float(packed[0]) / world,
        packed[1 : 1 + block],
        packed[1 + block : 1 + 2 * block],
        float(packed[-2]),
        float(packed[-1]),
    )


def step_metrics(
    step: int,
    s: StepStats,
    lr: float,
    grad_norm: float,
    batch: CapturedBatch,
    topology: Topology,
    elapsed: float,
    waited: float,
) -> StepMetrics:
    accuracy = (s.correct / s.counted.clamp(min=1)).tolist()
    samples = batch.batch_size * topology.drafters
    return StepMetrics(
        step=step,
        loss=s.loss,
        lr=lr,
        grad_norm=grad_norm,
        accuracy=[round(a, 5) for a in accuracy],
        accept_len=s.accept_len_sum / max(s.anchors, 1.0),
        accept_len_from_accuracy=expected_acceptance_length(s.correct, s.counted),
        tok_s=samples * batch.seq_len / elapsed,
        samples_s=samples / elapsed,
        step_time_s=elapsed,
        data_wait_s=waited,
    )


# ---------------------------------------------------------------- checkpoints


def _rng_state(anchor_gen: torch.Generator, device: torch.device) -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "anchor": anchor_gen.get_state(),
        "python": random.getstate(),
    }


def save(
    cfg: TrainConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    anchor_gen: torch.Generator,
    group: dist.ProcessGroup,
    index: int,
    step: int,
    topology: Topology,
) -> None:
    """Gather every drafter's RNG state; the first drafter writes the checkpoint atomically."""
    device = next(model.parameters()).device
    rng_states: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(rng_states, _rng_state(anchor_gen, device), group=group)
    if index != 0:
        return
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": rng_states,  # one entry per drafter rank, in drafter order
        "step": step,
        "next_batch": step * topology.drafters,
        "config": cfg.to_dict(),
    }
    # A colocated run on K ranks and a split with K drafters read the same batches: either resumes the other.
    meta = {"next_batch": step * topology.drafters, "drafters": topology.drafters, "mode": topology.mode}
    ckpt.save_checkpoint(cfg.output_dir, step, state, meta, cfg.checkpoint.keep)


def restore(
    cfg: TrainConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    anchor_gen: torch.Generator,
    index: int,
    topology: Topology,
    step: int,
    device: torch.device,
) -> None:
    """Put weights, optimiser, schedule and this rank's RNG streams back as they were after `step`."""
    folder = ckpt.checkpoints_root(cfg.output_dir) / ckpt.checkpoint_name(step)
    state = ckpt.load_checkpoint(folder, map_location=device)
    if len(state["rng"]) != topology.drafters:
        raise ConfigError(
            f"topology.drafters: the checkpoint in {folder} was written by {len(state['rng'])} drafters, "
            f"this run has {topology.drafters}; resume with as many drafters (colocated: ranks) or a new output.dir"
        )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    rng = state["rng"][index]
    torch.set_rng_state(rng["torch"].cpu())
    if rng["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(rng["cuda"].cpu(), device)
    anchor_gen.set_state(rng["anchor"].cpu())
    random.setstate(rng["python"])
