"""Estimate each role's peak GPU memory from a training config, before anything is launched.

Both topologies: a split's target and drafter ranks, or a colocated rank holding both (`plan(p, colocated)`).

A pure function of shapes: target weights and inference activations on target ranks; drafter
parameters, gradients, AdamW state, saved activations, attention workspace and the LM-head chunk on
drafter ranks; plus the CUDA context every process pays. The per-token activation terms follow what
`trainer/model/drafter.py` keeps for backward (fp32 norms and RoPE under bf16 autocast); their constants are
calibrated against the peaks measured on an H200 at both recipes (see BENCHMARKS.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

GIB = 1024**3
MIB = 1024**2
HOST_AVAILABLE = "host.available"  # the check context's key for the host memory a launch is judged against


def host_available_bytes() -> int:
    """Memory a new process can still get on this host (psutil's `available`). The gate reads it once, before
    it starts anything (the deep probe, the warm-up, a lone rank that builds its models beside the gate), so
    `launch.memory` never counts the launch's own processes against it."""
    import psutil

    return int(psutil.virtual_memory().available)


# Measured on an H200 (torch 2.11 cu130): context + cuBLAS + cuDNN workspaces of one process
# (shared/reference/h200-torch211-cu130-env.json). A lock or the deep probe can supply this machine's.
DEFAULT_CUDA_CONTEXT_BYTES = int(746.8 * MIB)


@dataclass(frozen=True)
class ModelShape:
    """The few numbers of a Qwen3-style target that decide memory."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool = False

    @property
    def layer_params(self) -> int:
        attn = self.hidden * self.heads * self.head_dim * 2 + self.hidden * self.kv_heads * self.head_dim * 2
        return attn + 3 * self.hidden * self.intermediate + 2 * self.hidden + 2 * self.head_dim


@dataclass(frozen=True)
class PlanInputs:
    target: ModelShape
    captured_layers: list[int]
    drafter_layers: int
    drafter_intermediate: int
    block_size: int
    anchors: int
    seq_len: int
    batch_size: int
    in_flight: int
    loss_chunk: int
    bf16: bool = True
    cuda_context_bytes: int = DEFAULT_CUDA_CONTEXT_BYTES  # on CPU: the process's own overhead
    on_gpu: bool = True
    compiled_layers: bool = True  # drafter.compile_layers (compiled on CUDA only; CPU runs stay eager)
    # Held-out evaluation on (data.eval_fraction or data.eval_path): target ranks keep the whole target and
    # its LM head to score the target's own greedy tokens (trainer/target_model/capture.py::capture_with_greedy).
    heldout: bool = False
    heldout_chunk: int = 2048  # positions of logits at a time in capture_with_greedy
    # topology.overlap_capture (colocated, CUDA): the next batch's capture runs beside this step's training
    overlap_capture: bool = False  # any mode but "off"

    @property
    def overhead_part(self) -> str:
        """A CPU rank has no CUDA context: its fixed cost is the process (torch + transformers)."""
        return "cuda_context" if self.on_gpu else "process_overhead"


@dataclass
class RoleEstimate:
    role: str
    parts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def to_json(self) -> dict[str, object]:
        return {"role": self.role, "total_bytes": self.total, "parts": dict(self.parts)}


# Bytes kept for backward per query token per drafter layer, in units of hidden/intermediate width,
# with the layers compiled (the default on CUDA): the fp32 residual and norm inputs, bf16 projections
# and attention output, SwiGLU's gate/up in bf16 (Inductor recomputes the cheap elementwise results).
# Calibrated against the H200 peaks of both recipes (BENCHMARKS.md), rounded up; eager layers keep
# more (measured 33.1 GiB at qwen3-8b-b16 against this plan's 28.8: -13%).
ACT_PER_TOKEN_HIDDEN = 22
ACT_PER_TOKEN_INTERMEDIATE = 8
# Per context token per drafter layer: the context's k/v projections' inputs and outputs and the
# k-norm/RoPE of the context keys, in units of the KV width.
CTX_PER_TOKEN_KV = 10


def target_weights(p: PlanInputs) -> int:
    """Embedding, the kept layers and the final norm; with held-out evaluation on, every layer and the LM
    head (a tied head shares the embedding's storage)."""
    t, elt = p.target, 2 if p.bf16 else 4
    if p.heldout:
        kept = t.layers
        head = 0 if t.tied_embeddings else t.vocab * t.hidden
    else:
        kept = max(p.captured_layers) + 1  # layers past the last captured one are dropped
        head = 0
    return (t.vocab * t.hidden + kept * t.layer_params + t.hidden + head) * elt


def heldout_logits(p: PlanInputs) -> int:
    """One chunk of the target's held-out logits (bf16 on GPU), alive while its greedy tokens are taken."""
    if not p.heldout:
        return 0
    return min(p.heldout_chunk, p.batch_size * p.seq_len) * p.target.vocab * (2 if p.bf16 else 4)


def target_estimate(p: PlanInputs) -> RoleEstimate:
    t, elt = p.target, 2 if p.bf16 else 4
    tokens = p.batch_size * p.seq_len
    captured = tokens * len(p.captured_layers) * t.hidden * elt
    # The largest transient inside one layer: SwiGLU holds gate, up and their product (3 x I) beside
    # the residual stream; attention (flash/SDPA) needs O(S) only.
    transient = tokens * (3 * t.intermediate + 3 * t.hidden) * elt
    logits = heldout_logits(p)
    return RoleEstimate(
        "target",
        {
            "weights": target_weights(p),
            "layer_transient": transient,
            "captured_states": captured,
            "send_buffers": captured * p.in_flight,
            **({"heldout_logits_chunk": logits} if logits else {}),
            p.overhead_part: p.cuda_context_bytes,
        },
    )


def drafter_params(p: PlanInputs) -> int:
    t = p.target
    layer = ModelShape(
        t.hidden, p.drafter_intermediate, 1, t.heads, t.kv_heads, t.head_dim, t.vocab
    ).layer_params
    return p.drafter_layers * layer + len(p.captured_layers) * t.hidden * t.hidden + 2 * t.hidden


def first_layer_input_grad(p: PlanInputs) -> int:
    """The gradient of the first drafter layer's input, held briefly in backward with compiled layers.

    `trainer/model/drafter.py::run_layers` makes that input (the frozen embedding, cast to the parameters'
    fp32) need a gradient so that every layer shares one compiled graph; the shared backward graph then
    returns the gradient of its input for the first layer too: a (B, Q, H) tensor in fp32 (the input's
    dtype, not autocast's), Q = anchors x block_size, freed once it is summed into the zero scalar that
    made it needed. Eager layers (and CPU runs, never compiled) compute no such gradient."""
    if not (p.on_gpu and p.compiled_layers):
        return 0
    return p.batch_size * p.anchors * p.block_size * p.target.hidden * 4


def drafter_estimate(p: PlanInputs) -> RoleEstimate:
    t, elt = p.target, 2 if p.bf16 else 4
    params = drafter_params(p)
    queries = p.batch_size * p.anchors * p.block_size
    context = p.batch_size * p.seq_len
    kv_width = t.kv_heads * t.head_dim
    per_layer = queries * (
        ACT_PER_TOKEN_HIDDEN * t.hidden + ACT_PER_TOKEN_INTERMEDIATE * p.drafter_intermediate
    )
    per_layer += context * CTX_PER_TOKEN_KV * kv_width
    incoming = context * len(p.captured_layers) * t.hidden * elt
    chunk_rows = min(p.loss_chunk, queries)
    input_grad = first_layer_input_grad(p)
    return RoleEstimate(
        "drafter",
        {
            "parameters_fp32": params * 4,
            "gradients_fp32": params * 4,
            "adamw_state": params * 8,
            "frozen_embed_and_head": 2 * t.vocab * t.hidden * elt,  # bf16 on GPU (trainer/run/warmup.py)
            "incoming_batches": incoming * (1 + p.in_flight),
            "context_fused": context * t.hidden * (4 + elt),
            "activations": p.drafter_layers * per_layer,
            # Q x (S + Q) scores never exist with flex; the block mask and LSE are small.
            "attention_workspace": queries * t.heads * 4 * 2,
            # One chunk's logits in fp32, their softmax and gradient.
            "lm_head_chunk": chunk_rows * t.vocab * 4 * 3,
            **({"first_layer_input_grad": input_grad} if input_grad else {}),
            p.overhead_part: p.cuda_context_bytes,
        },
    )


def colocated_estimate(p: PlanInputs) -> RoleEstimate:
    """One device holding both roles: the target's weights, one captured batch (no send or receive
    queues), the drafter's state and activations, one CUDA context. The capture's layer transient and the
    drafter's training transients never coexist (capture ends before the forward), so only the capture's
    excess over them counts; so does a held-out logits chunk, which exists only during a capture. With
    `overlap_capture` the next capture runs beside training: its transient counts whole, and two captured
    batches (the one in training, the one being captured) are held."""
    target = target_estimate(p).parts
    drafter = drafter_estimate(p).parts
    training_transient = (
        drafter["activations"]
        + drafter["attention_workspace"]
        + drafter["lm_head_chunk"]
        + drafter.get("first_layer_input_grad", 0)
    )
    # one process: its fixed cost once (was: on a CPU the drafter's `process_overhead` kept beside a
    # `cuda_context`, 0.5 GiB counted twice)
    kept = {k: v for k, v in drafter.items() if k not in ("incoming_batches", p.overhead_part)}
    capture_transient = max(target["layer_transient"], target.get("heldout_logits_chunk", 0))
    beside = p.overlap_capture and p.on_gpu
    return RoleEstimate(
        "colocated",
        {
            "target_weights": target["weights"],
            "capture_transient": capture_transient
            if beside
            else max(0, capture_transient - training_transient),
            "captured_states": target["captured_states"] * (2 if beside else 1),
            **kept,
            p.overhead_part: p.cuda_context_bytes,
        },
    )


# On a CPU the plan is a floor, not a peak: its per-token constants are the compiled-layer ones calibrated on an
# H200, while a CPU run is eager and fp32 throughout, and the process's RSS also keeps what the allocator freed.
# Measured (issue 39 U16, this 2-core box, smollm2-135m at batch 4 x accum 2, seq 1024, colocated, held-out on):
# planned 4.6 GiB (5.1 before the colocated process overhead stopped being counted twice); the worker's RSS
# 8.2 GB (7.6 GiB) in issue 39's run, the warm-up child's 7.1 GiB here (psutil, every 0.5 s): 1.5-1.7x.
CPU_FLOOR_NOTE = (
    "a floor on CPU, not the peak: the plan is calibrated on GPUs with compiled layers, a CPU run is eager and "
    "fp32 and its RSS keeps freed memory (smollm2-135m at batch 4 x 2, seq 1024: planned 4.6 GiB, 7.1-7.6 GiB "
    "RSS measured, 1.5-1.7x); keep about twice the planned figure free"
)


def is_floor(p: PlanInputs) -> bool:
    """True where the plan is a lower bound (CPU), not the peak it is calibrated to be on a GPU."""
    return not p.on_gpu


def plan(p: PlanInputs, colocated: bool = False) -> dict[str, RoleEstimate]:
    """Each role's peak: `target` and `drafter` for a split, `colocated` for ranks that hold both."""
    if colocated:
        return {"colocated": colocated_estimate(p)}
    return {"target": target_estimate(p), "drafter": drafter_estimate(p)}


def to_json(estimates: dict[str, RoleEstimate], inputs: PlanInputs) -> dict[str, object]:
    return {"inputs": asdict(inputs), "roles": {k: v.to_json() for k, v in estimates.items()}}
