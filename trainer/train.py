"""The training run, one process per device under torchrun. Read top to bottom.

1. `main`: join the process group (torchrun's env), split roles once: ranks [0, N) targets, [N, N+M)
   drafters; agree on the resume step (the first drafter reads the newest checkpoint and tells everyone).
2. `run_target`: capture the configured layers for every global batch i with i % N == rank, from the
   resume point on, and stream them to drafter i % M with a bounded number in flight.
3. `run_drafter`: build the drafter, compile and warm it in this main thread, wrap it in DDP over the
   drafter-only group, restore a checkpoint if there is one, then per step: receive, sample anchors,
   forward/backward (bf16 autocast on CUDA), clip, step, schedule, metrics, checkpoint. Export at the end.

No thread ever compiles; shapes are static (fixed seq_len, fixed anchors per sequence) and
`fail_on_recompile_limit_hit` is on, so a shape change fails loudly instead of silently going dense.
A rank that dies makes its peers' point-to-point calls fail (or time out after `run.timeout_s`) and torchrun
stops the job with a non-zero status. A rank whose torchrun is gone (killed with SIGKILL) stops itself
(`parent_watch`), so no rank outlives its job.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import time
from collections.abc import Iterable, Iterator
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
    DataSplit,
    RunPlan,
    build_source,
    evaluates_after,
    make_batch,
    plan_run,
    split_data,
    target_work,
)
from trainer.drafter import DFlashDrafter
from trainer.faults import fault_from_env, maybe_exit_target, maybe_hang_drafter
from trainer.heldout import HeldoutSums, evaluate_heldout
from trainer.loss import LossOutput, expected_acceptance_length
from trainer.metric_sinks import open_sinks
from trainer.metrics import (
    MetricsLog,
    Progress,
    StepMetrics,
    read_metrics,
    real_token_count,
    summarize,
    write_summary,
)
from trainer.optim import build_optimizer, build_scheduler, clip_gradients
from trainer.parent_watch import watch_parent
from trainer.startup import StartupClock
from trainer.target import load_capture_target, load_frozen_embeddings, target_dtype, target_hf_config
from trainer.transport import BatchReceiver, BatchSender, Topology, TransportError
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
    if me.world_size != cfg.world_size:
        raise ConfigError(
            f"topology: targets + drafters = {cfg.world_size}, but torchrun started {me.world_size} processes "
            f"(use --nproc-per-node {cfg.world_size})"
        )
    device = resolve_device(cfg.run.device, me.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    topology = Topology(cfg.topology.targets, cfg.topology.drafters)
    split = split_data(cfg)
    plan = plan_run(cfg, len(split.train_ids))

    dist.init_process_group(
        backend="nccl" if device.type == "cuda" else "gloo", timeout=timedelta(seconds=cfg.run.timeout_s)
    )
    try:
        drafter_group = dist.new_group(topology.drafter_ranks)  # every rank must take part in creating it
        resume_step = agree_on_resume_step(cfg, topology, me.rank, device)
        clock.mark("process group")
        if topology.is_target(me.rank):
            run_target(cfg, plan, split, topology, me.rank, device, resume_step, clock)
            return 0
        return run_drafter(cfg, plan, split, topology, me.rank, device, drafter_group, resume_step, clock)
    except TransportError as exc:
        print(f"dflash trainer: rank {me.rank}: {exc}", file=sys.stderr, flush=True)
        return 1
    except Stopped as exc:
        print(f"dflash trainer: rank {me.rank}: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    finally:
        dist.destroy_process_group()


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


# ---------------------------------------------------------------- target ranks


def run_target(
    cfg: TrainConfig,
    plan: RunPlan,
    split: DataSplit,
    topology: Topology,
    rank: int,
    device: torch.device,
    resume_step: int,
    clock: StartupClock,
) -> None:
    assert cfg.drafter.target_layer_ids is not None
    dtype = target_dtype(cfg.target.dtype, device)
    target = load_capture_target(
        cfg.target.path,
        cfg.drafter.target_layer_ids,
        cfg.run.seed,
        device,
        dtype,
        compile_layers=cfg.target.compile_layers and device.type == "cuda",
        keep_head=split.eval_batches > 0,  # held-out batches need the target's own greedy tokens
    )
    release_cached_memory(device)
    clock.mark("build")
    if target.compiled:
        warm_up_target(target, cfg, device)  # compile now, one target rank at a time
        clock.mark("compile")
    vocab = int(target_hf_config(cfg.target.path).vocab_size)
    source = build_source(cfg, device, vocab)
    eval_source = source
    if cfg.data.eval_path is not None and split.eval_batches:
        eval_source = build_source(cfg, device, vocab, cfg.data.eval_path, "data.eval_path")
    order = BatchOrder(split.train_ids, cfg.optim.batch_size, cfg.run.seed)
    sender = BatchSender(topology, cfg.topology.in_flight, device)
    fault = fault_from_env()
    clock.mark("data")
    clock.report(rank, "target")
    work = target_work(rank, topology.targets, plan, resume_step, cfg.eval.every, split.eval_batches)
    for kind, index in work:
        if kind == "eval":
            input_ids, loss_mask = make_batch(eval_source, split.eval_sequence_ids(index))
            sender.send(target.capture_with_greedy(input_ids.to(device), loss_mask.to(device), index))
            continue
        maybe_exit_target(fault, rank, index)
        input_ids, loss_mask = make_batch(source, order.sequence_ids(index))
        batch = target.capture(input_ids.to(device), loss_mask.to(device), index)
        sender.send(batch)
    sender.close()


# ---------------------------------------------------------------- drafter ranks


def run_drafter(
    cfg: TrainConfig,
    plan: RunPlan,
    split: DataSplit,
    topology: Topology,
    rank: int,
    device: torch.device,
    group: dist.ProcessGroup,
    resume_step: int,
    clock: StartupClock,
) -> int:
    began = time.monotonic()
    index = topology.drafter_index(rank)
    is_first = index == 0
    embed, lm_head, hf_config = load_frozen_embeddings(cfg.target.path, cfg.run.seed, device)
    model = build_drafter(cfg, hf_config, embed, lm_head, device)
    del embed, lm_head  # the model holds its own (cast) copies
    release_cached_memory(device)
    clock.mark("build")
    warmup = warm_up_model(model, cfg, device)  # compile here, in the main thread, before the loop
    clock.mark("compile")
    ddp = DistributedDataParallel(
        model, process_group=group, device_ids=[device.index] if device.type == "cuda" else None
    )
    optimizer = build_optimizer(model, cfg.optim, device)
    scheduler = build_scheduler(optimizer, cfg.optim, plan.total_steps)
    anchor_gen = torch.Generator(device=device).manual_seed(cfg.run.seed * 1_000_003 + 7 + index)
    if resume_step:
        restore(cfg, model, optimizer, scheduler, anchor_gen, index, topology, resume_step, device)

    log = (
        MetricsLog(cfg.output_dir / "metrics.jsonl", resume_step, metric_sinks(cfg, resume_step))
        if is_first
        else None
    )
    progress = Progress(plan.total_steps, resume_step, cfg.run.log_every) if is_first else None
    if is_first:
        print(
            f"dflash trainer: {topology.targets} target + {topology.drafters} drafter ranks, {plan.total_steps} steps"
            f"{f', resuming at step {resume_step}' if resume_step else ''}; warm-up {warmup['seconds']}s "
            f"({warmup['attention']} on {warmup['device']})",
            flush=True,
        )
    receiver = BatchReceiver(topology, index, device)
    fault = fault_from_env()
    clock.mark("optimizer + DDP")
    clock.report(rank, "drafter")
    warmup = {**warmup, "startup": clock.as_dict()}  # kept in summary.json with the warm-up
    status, error = "failed", None
    try:
        for step in range(resume_step, plan.total_steps):
            maybe_hang_drafter(fault, index, step)
            t0 = time.perf_counter()
            feed = MicroBatches(receiver, step, plan.accum)
            outs, grad_norm, lr = train_step(ddp, model, feed, cfg, anchor_gen, optimizer, scheduler, device)
            stats = reduce_over_drafters(outs, feed, group)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - t0
            done = step + 1
            heldout, heldout_s = None, 0.0
            if split.eval_batches and evaluates_after(done, plan.total_steps, cfg.eval.every):
                t1 = time.perf_counter()
                heldout = heldout_over_drafters(model, receiver, split, cfg, index, device, group)
                heldout_s = time.perf_counter() - t1
            if log is not None and progress is not None:
                m = step_metrics(done, stats, lr, grad_norm, elapsed, feed.waited, heldout, heldout_s)
                log.write(m)
                progress.update(m)
            every = cfg.checkpoint.every
            if (every and done % every == 0) or done == plan.total_steps:
                save(cfg, model, optimizer, scheduler, anchor_gen, group, index, done)
        receiver.expect_end()
        if is_first:
            announce_export(cfg, model)
        status = "ok"
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, Stopped):
            status = "interrupted"
        raise
    finally:
        if progress is not None:
            progress.close()
        if log is not None:
            log.close()
            write_summary(
                cfg.output_dir,
                summarize(
                    read_metrics(cfg.output_dir / "metrics.jsonl"),
                    status,
                    time.monotonic() - began,
                    error=error,
                    export_dir=str(cfg.output_dir / "export") if status == "ok" else None,
                    resumed_from=resume_step,
                    total_steps=plan.total_steps,
                    sequences_per_step=cfg.optim.batch_size * plan.accum * topology.drafters,
                    heldout_sequences=split.eval_batches * cfg.optim.batch_size,
                    warmup=warmup,
                    topology={"targets": topology.targets, "drafters": topology.drafters},
                ),
            )
    return 0


class MicroBatches:
    """The batches of one optimizer step, received as they are needed, with the time spent waiting and the
    real (non-padding) and supervised tokens they held."""

    def __init__(self, receiver: BatchReceiver, step: int, accum: int) -> None:
        self.receiver, self.step, self.accum = receiver, step, accum
        self.waited, self.real_tokens, self.supervised_tokens, self.sequences = 0.0, 0, 0, 0

    def __iter__(self) -> Iterator[CapturedBatch]:
        for micro in range(self.accum):
            t0 = time.perf_counter()
            batch = self.receiver.receive(self.step * self.accum + micro)
            self.waited += time.perf_counter() - t0
            self.real_tokens += real_token_count(batch.input_ids, batch.loss_mask)
            self.supervised_tokens += int(batch.loss_mask.sum())
            self.sequences += batch.batch_size
            yield batch


def announce_export(cfg: TrainConfig, model: DFlashDrafter) -> None:
    """Export the drafter (bf16 unless output.export_dtype = "fp32") and print how to serve it."""
    from trainer.export import export_drafter, serve_commands

    dtype = torch.float32 if cfg.output.export_dtype == "fp32" else torch.bfloat16
    exported = export_drafter(
        model, cfg.output_dir / "export", dtype, cfg.drafter.mask_token_text, cfg.target.path
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
) -> tuple[list[LossOutput], float, float]:
    """Per micro-batch (`optim.grad_accum` of them): anchors, forward+backward of loss / accum (DDP averages gradients over the drafters,
    once, on the last micro-batch); then clip, step, schedule. Returns the micro-batches' loss outputs, the
    grad norm before clipping and the lr this step used."""
    outs: list[LossOutput] = []
    accum = cfg.optim.grad_accum
    for micro, batch in enumerate(batches):
        last = micro == accum - 1
        anchors, valid = sample_anchors(
            batch.loss_mask, cfg.optim.anchors, cfg.drafter.block_size, anchor_gen
        )
        sync = contextlib.nullcontext() if last or not hasattr(ddp, "no_sync") else ddp.no_sync()
        with sync:
            with autocast_for(cfg, device):
                out: LossOutput = ddp(batch.input_ids, batch.loss_mask, batch.hidden, anchors, valid)
            (out.loss / accum).backward()
        outs.append(out)
    grad_norm = clip_gradients(model, cfg.optim.grad_clip)
    lr = float(optimizer.param_groups[0]["lr"])
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return outs, grad_norm, lr


@dataclass
class StepStats:
    """One step's numbers summed over its micro-batches and the drafter ranks."""

    loss: float  # mean of the micro-batches' losses over the ranks
    correct: torch.Tensor
    counted: torch.Tensor
    accept_len_sum: float
    anchors: float
    sequences: float
    real_tokens: float
    supervised_tokens: float


def reduce_over_drafters(outs: list[LossOutput], feed: MicroBatches, group: dist.ProcessGroup) -> StepStats:
    block = outs[0].correct.numel()
    packed = torch.cat(
        [
            torch.stack([o.loss.detach().float() for o in outs]).mean().view(1),
            torch.stack([o.correct.float() for o in outs]).sum(0),
            torch.stack([o.counted.float() for o in outs]).sum(0),
            torch.stack([o.accept_len_sum.float() for o in outs]).sum().view(1),
            torch.stack([o.anchors.float() for o in outs]).sum().view(1),
            outs[0].loss.new_tensor(
                [feed.sequences, feed.real_tokens, feed.supervised_tokens], dtype=torch.float32
            ),
        ]
    )
    dist.all_reduce(packed, group=group)
    packed = packed.cpu()
    world = dist.get_world_size(group)
    return StepStats(
        float(packed[0]) / world,
        packed[1 : 1 + block],
        packed[1 + block : 1 + 2 * block],
        float(packed[-5]),
        float(packed[-4]),
        float(packed[-3]),
        float(packed[-2]),
        float(packed[-1]),
    )


def heldout_over_drafters(
    model: nn.Module,
    receiver: BatchReceiver,
    split: DataSplit,
    cfg: TrainConfig,
    index: int,
    device: torch.device,
    group: dist.ProcessGroup,
) -> HeldoutSums:
    """This drafter scores its share of the held-out batches (j % drafters == index); summed over ranks."""
    mine = range(index, split.eval_batches, dist.get_world_size(group))
    with autocast_for(cfg, device):
        sums = evaluate_heldout(
            model, (receiver.receive_eval(j) for j in mine), cfg.optim.anchors, cfg.run.seed
        )
    packed = sums.as_tensor(device)
    dist.all_reduce(packed, group=group)
    return HeldoutSums.from_tensor(packed)


def step_metrics(
    step: int,
    s: StepStats,
    lr: float,
    grad_norm: float,
    elapsed: float,
    waited: float,
    heldout: HeldoutSums | None,
    heldout_s: float,
) -> StepMetrics:
    accuracy = (s.correct / s.counted.clamp(min=1)).tolist()
    return StepMetrics(
        step=step,
        loss=s.loss,
        lr=lr,
        grad_norm=grad_norm,
        accuracy=[round(a, 5) for a in accuracy],
        accept_len=s.accept_len_sum / max(s.anchors, 1.0),
        accept_len_from_accuracy=expected_acceptance_length(s.correct, s.counted),
        tok_s=s.real_tokens / elapsed,
        supervised_tok_s=s.supervised_tokens / elapsed,
        samples_s=s.sequences / elapsed,
        step_time_s=elapsed,
        data_wait_s=waited,
        heldout_accept_len=heldout.accept_len_target if heldout else None,
        heldout_accept_len_labels=heldout.accept_len_labels if heldout else None,
        heldout_s=heldout_s if heldout else None,
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
        "next_batch": step * cfg.optim.grad_accum * cfg.topology.drafters,
        "config": cfg.to_dict(),
    }
    meta = {"next_batch": state["next_batch"], "drafters": cfg.topology.drafters}
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
            f"this run has {topology.drafters}; resume with the same topology or a new output.dir"
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


def metric_sinks(cfg: TrainConfig, resume_step: int) -> list[Any]:
    """TensorBoard and W&B, when `[output]` asks for them (first drafter rank only)."""
    o = cfg.output
    if not (o.tensorboard or o.wandb):
        return []
    return open_sinks(cfg.output_dir, o.tensorboard, o.wandb, cfg.to_dict(), resume_step)
