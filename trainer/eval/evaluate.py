"""`dflash-doctor eval`: what a trained drafter is worth. Real greedy speculative decoding of a prompt set with
the target and the exported drafter, beside target-only greedy decoding and prompt lookup: tau over the whole set,
every token checked against the target, and the wall-clock speed-up at the batch sizes people serve at.

Two decoders run it: the engine (trainer.engine: a static KV cache, continuous batching, CUDA graphs; every
prompt at once for tau, fixed batches for the latency table: `evaluate_on_engine`), for the targets it serves,
and the Python loop, one prompt at a time (trainer.eval.speculative: `evaluate`), the reference the engine is
tested against and the path for other targets. Both report through `trainer.eval.figures`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dflash_base.errors import ConfigError
from trainer.engine.target import stop_token_ids
from trainer.eval.compare import Comparison, compare_outputs, default_tie_ulps
from trainer.eval.engine_decoding import TARGET_ONLY, Decoding, EngineDecoders, tau_slots
from trainer.eval.figures import (
    EvalReport,
    GroupRow,
    LatencyRow,
    Walk,
    proposer_report,
    tau_of,
    walk_of_lengths,
)
from trainer.eval.lossless import check_outputs
from trainer.eval.prompts import EvalPrompts, heldout_prompts, labelled_prompts
from trainer.eval.proposers import DFlashProposer, PromptLookup, Proposer
from trainer.eval.speculative import SpecTarget, Stops, greedy_decode, speculative_decode
from trainer.model.drafter import DFlashDrafter
from trainer.runspec.eval_request import (
    DEFAULT_NGRAM_K,
    HELDOUT_PROMPTS,
    EvalRequest,
    check_eval_lengths,
    check_eval_prompts,
)
from trainer.runspec.export_files import check_export_fits

Progress = Callable[[str, int, int], None]  # (phase, done, total): tokens on the engine, prompts in the loop
SYNC_EVERY = 8  # tau runs: decode steps between the host's looks (the latency rows look at every step)


def evaluate(
    target: SpecTarget,
    proposer: Proposer | DFlashDrafter,
    prompts: list[list[int]],
    max_new: int,
    eos: Stops = None,
    on_prompt: Callable[[int], None] | None = None,
    tie_ulps: int | None = None,
    baseline: Proposer | None = None,
) -> EvalReport:
    """The Python loop: every prompt decoded with the target alone and with each proposer (`baseline` beside
    the first), one prompt at a time; each compared with target-only greedy at its first difference."""
    if isinstance(proposer, DFlashDrafter):
        proposer = DFlashProposer(proposer)
    ulps = default_tie_ulps(target.dtype) if tie_ulps is None else tie_ulps
    proposers = [proposer, *([baseline] if baseline is not None else [])]
    walks: dict[str, list[Walk]] = {p.name: [] for p in proposers}
    comparisons: dict[str, list[Comparison]] = {p.name: [] for p in proposers}
    greedy: list[Walk] = []
    for number, prompt in enumerate(prompts, start=1):
        base = greedy_decode(target, prompt, max_new, eos)
        greedy.append(Walk(base.tokens, seconds=base.seconds))
        for p in proposers:
            spec = speculative_decode(target, p, prompt, max_new, eos)
            block = p.max_draft + 1
            walks[p.name].append(
                walk_of_lengths(spec.tokens, spec.accepted, spec.proposed, block, spec.seconds)
            )
            comparisons[p.name].append(
                compare_outputs(base.tokens, base.top, spec.tokens, spec.top, ulps, target.dtype)
            )
        if on_prompt is not None:
            on_prompt(number)
    context = {
        "tie_ulps": ulps,
        "dtype": str(target.dtype).removeprefix("torch."),
        "device": str(target.device),
        "engine": "loop",
        "max_new_tokens": max_new,
    }
    base_s = sum(w.seconds or 0.0 for w in greedy)

    def report(p: Proposer) -> EvalReport:
        mine = walks[p.name]
        spec_s = sum(w.seconds or 0.0 for w in mine)
        rates = (_rate(mine, spec_s), _rate(greedy, base_s))
        return proposer_report(
            p.name, p.max_draft + 1, prompts, mine, greedy, comparisons[p.name], rates, context
        )

    primary = report(proposer)
    if baseline is not None:
        primary.baseline = report(baseline)
    return primary


def _rate(walks: list[Walk], seconds: float) -> float:
    return sum(len(w.tokens) for w in walks) / seconds if seconds else 0.0


def evaluate_on_engine(
    model: Any,
    drafter: DFlashDrafter | None,
    prompts: EvalPrompts,
    request: EvalRequest,
    stops: list[int],
    on_progress: Progress | None = None,
) -> EvalReport:
    """The engine: tau over every prompt at once for target-only greedy, the drafter (or prompt lookup alone)
    and prompt lookup beside it; every token of every output checked against the target; per-group tau; then
    the latency rows (see trainer.eval.engine_decoding)."""
    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    k = request.ngram_k or (drafter.cfg.block_size - 1 if drafter is not None else DEFAULT_NGRAM_K)
    ways = ["dflash" if drafter is not None else "ngram"]
    if drafter is not None and request.baseline:
        ways.append("ngram")
    block = max(drafter.cfg.block_size if drafter is not None else 1, k + 1)
    max_new = request.max_new_tokens
    longest = max(map(len, prompts.ids)) + max_new + block
    decoders = EngineDecoders(model, drafter, longest, stops, (k, request.ngram_min, request.ngram_max))
    slots = tau_slots(device, len(prompts.ids))
    began = time.perf_counter()
    runs = _decode_every_way(decoders, [TARGET_ONLY, *ways], prompts.ids, max_new, slots, on_progress)
    decode_seconds = time.perf_counter() - began
    ulps = default_tie_ulps(dtype) if request.tie_ulps is None else request.tie_ulps
    target_check, _ = check_outputs(model, prompts.ids, runs[TARGET_ONLY].tokens, TARGET_ONLY, ulps)
    context = {
        "tie_ulps": ulps,
        "dtype": str(dtype).removeprefix("torch."),
        "device": str(device),
        "engine": "kv",
        "max_new_tokens": max_new,
        "rows_at_once": slots,
        "target_lossless": target_check,
    }
    reports = {way: _way_report(model, way, decoders, runs, prompts, ulps, context) for way in ways}
    primary = reports[ways[0]]
    primary.decode_seconds = decode_seconds
    if len(ways) > 1:
        primary.baseline = reports[ways[1]]
        primary.groups = _groups(prompts, _walks(runs[ways[0]]), _walks(runs[ways[1]]))
    batches = request.latency_batches(device.type == "cuda")
    primary.latency = _latency(
        decoders, [TARGET_ONLY, *ways], prompts.ids[: request.latency_prompts], max_new, batches
    )
    return primary


def _decode_every_way(
    decoders: EngineDecoders,
    ways: list[str],
    prompts: list[list[int]],
    max_new: int,
    slots: int,
    on_progress: Progress | None,
) -> dict[str, Decoding]:
    """Every prompt decoded each way in turn, the tokens made passed to `on_progress` as they come."""
    total, made = len(prompts) * max_new * len(ways), [0]

    def tell(phase: str) -> Callable[[int], None]:
        def count(tokens: int) -> None:
            made[0] += tokens
            if on_progress is not None:
                on_progress(phase, made[0], total)

        return count

    return {way: decoders.decode_with(way, prompts, max_new, slots, SYNC_EVERY, tell(way)) for way in ways}


def _way_report(
    model: Any,
    way: str,
    decoders: EngineDecoders,
    runs: dict[str, Decoding],
    prompts: EvalPrompts,
    ulps: int,
    context: dict[str, Any],
) -> EvalReport:
    """One way of proposing's figures: its walks against target-only greedy's, every token checked, the
    prompts where it parted from target-only greedy classified by the same forward."""
    run, greedy_run = runs[way], runs[TARGET_ONLY]
    walks, greedy = _walks(run), [Walk(tokens) for tokens in greedy_run.tokens]
    parting = _partings(greedy_run.tokens, run.tokens)
    check, at_parting = check_outputs(model, prompts.ids, run.tokens, way, ulps, parting)
    comparisons = [
        at_parting.get(i) or _comparison(g.tokens, w.tokens)
        for i, (g, w) in enumerate(zip(greedy, walks, strict=True))
    ]
    rates = (run.new_tokens / run.seconds, greedy_run.new_tokens / greedy_run.seconds)
    report = proposer_report(
        way, decoders.block_of(way), prompts.ids, walks, greedy, comparisons, rates, context
    )
    report.lossless = check
    report.groups = _groups(prompts, walks, None)
    return report


def _walks(run: Decoding) -> list[Walk]:
    return [
        Walk(t, f["forwards"], f["drafted"], f["emitted"])
        for t, f in zip(run.tokens, run.figures, strict=True)
    ]


def _partings(greedy: list[list[int]], mine: list[list[int]]) -> dict[int, tuple[int, int, int]]:
    """Per prompt whose output parts from target-only greedy's: (index, greedy's token, this one's)."""
    out = {}
    for i, (a, b) in enumerate(zip(greedy, mine, strict=True)):
        at = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        if at is not None:
            out[i] = (at, a[at], b[at])
    return out


def _comparison(greedy: list[int], mine: list[int]) -> Comparison:
    """Identical, or one output a prefix of the other (one stopped early): no pair of tokens to rate."""
    if greedy == mine:
        return Comparison("identical")
    return Comparison("different", first_diff=min(len(greedy), len(mine)))


def _groups(prompts: EvalPrompts, walks: list[Walk], baseline: list[Walk] | None) -> list[GroupRow]:
    """tau per group the prompts file names, the baseline's beside it."""
    rows = []
    for name, members in prompts.groups().items():
        tau = tau_of([walks[i] for i in members])
        base = tau_of([baseline[i] for i in members]) if baseline is not None else None
        rows.append(GroupRow(name, len(members), round(tau, 4), None if base is None else round(base, 4),
                             round(tau / base, 4) if base else None))  # fmt: skip
    return rows


def _latency(
    decoders: EngineDecoders,
    ways: list[str],
    prompts: list[list[int]],
    max_new: int,
    batches: tuple[int, ...],
) -> list[LatencyRow]:
    """Generated tok/s per batch and way, after a warm-up; the speed-up over target-only at that batch."""
    rows = []
    for batch in batches:
        base = None
        for way in ways:
            run = decoders.latency(way, prompts, max_new, batch)
            rate = run.new_tokens / run.seconds
            base = rate if way == TARGET_ONLY else base
            tau = tau_of(_walks(run)) if way != TARGET_ONLY else None
            step_ms = 1000 * run.decode_seconds / run.steps if run.steps else 0.0
            rows.append(LatencyRow(batch, way, round(rate, 3), round(rate / base, 4) if base else 0.0,
                                   len(prompts), run.new_tokens, round(run.seconds, 3),
                                   None if tau is None else round(tau, 4), round(step_ms, 3)))  # fmt: skip
    return rows


# ---------------------------------------------------------------- building the pieces


@dataclass(frozen=True)
class EvalSetup:
    """What `dflash-doctor eval` was asked for."""

    export_dir: str
    target_path: str
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32


def load_eval_target(setup: EvalSetup) -> Any:  # a Hugging Face causal LM
    """The full target (causal LM with its head) on the eval's device and dtype."""
    from trainer.model.device import resolve_device, target_dtype
    from trainer.target_model.load import load_target_model

    if setup.device.startswith("cuda") and not torch.cuda.is_available():  # the option, not `run.device`
        raise ConfigError(
            f"--device {setup.device}: torch sees no CUDA device here", hint="--device cpu, or --device auto"
        )
    device = resolve_device(setup.device)
    return load_target_model(setup.target_path, setup.seed, device, target_dtype(setup.dtype, device))


def load_pieces(setup: EvalSetup) -> tuple[SpecTarget, DFlashDrafter]:
    """The full target and the exported drafter (with the target's frozen embedding and head), on one device."""
    from trainer.model.export import ExportError, load_drafter

    model = load_eval_target(setup)
    device, dtype = model.device, model.dtype
    embed = model.model.embed_tokens.weight.detach()
    head = model.lm_head.weight.detach()
    try:
        drafter = load_drafter(setup.export_dir, embed, head, attention="sdpa")
    except ExportError as exc:
        raise ConfigError(f"--export: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"--export: cannot read {setup.export_dir}: {exc}") from exc
    drafter = drafter.to(device=device, dtype=dtype).eval()
    if drafter.cfg.vocab_size != model.config.vocab_size:
        raise ConfigError(
            f"--export: the drafter's vocabulary ({drafter.cfg.vocab_size}) is not the target's "
            f"({model.config.vocab_size}); evaluate it with the target it was trained for"
        )
    return SpecTarget(model, drafter.cfg.target_layer_ids), drafter


def run_eval(request: EvalRequest, on_progress: Progress | None = None) -> EvalReport:
    """Everything `dflash-doctor eval` does with a checked request (`EvalRequest.check`): resolve the target
    and prompts (every bad line refused before the target loads), load, decode, report."""
    began = time.perf_counter()
    cfg = None
    if request.config is not None:
        from trainer.runspec.config import load_config

        # --prompts replaces the held-out sequences: the data file and its split rule apply only without it
        cfg = load_config(request.config, list(request.overrides), check_data=request.prompts is None)
    target_path = request.target or (cfg.target.path if cfg is not None else None)
    if target_path is None:
        raise ConfigError("--target: name the target (a folder, tiny, random:qwen3-8b) or give --config")
    from trainer.runspec.target_shapes import is_embedded, target_shapes

    shapes = target_shapes(target_path)  # the export and the prompts against it, before anything loads
    if request.drafter == "dflash" and request.export:
        check_export_fits(request.export, shapes)
    if request.prompts is not None:
        check_eval_prompts(request.prompts, int(shapes.vocab_size))
    tokenizer = None
    if not is_embedded(target_path):
        from trainer.target_model.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(target_path)
    prompts = _prompts(request, cfg, tokenizer)
    check_eval_lengths(
        prompts.ids, request.max_new_tokens, int(shapes.max_position_embeddings), prompts.where
    )
    seed = cfg.run.seed if cfg is not None else 0
    setup = EvalSetup(request.export or "", target_path, seed, request.device, request.dtype)
    drafter = None
    if request.drafter == "dflash":
        target, drafter = load_pieces(setup)
    else:
        target = SpecTarget(load_eval_target(setup), [])  # prompt lookup reads no layers
    # Where an answer ends, as `data regenerate` reads it: the generation config's eos ids and the tokenizer's.
    generation = getattr(target.model, "generation_config", None)
    stops = stop_token_ids(tokenizer, generation) if tokenizer else []
    if _engine(request, target.model) == "kv":
        target.close()
        report = evaluate_on_engine(target.model, drafter, prompts, request, stops, on_progress)
    else:
        report = _evaluate_in_loop(request, target, drafter, prompts, stops, on_progress)
    report.seconds = time.perf_counter() - began
    return report


def _prompts(request: EvalRequest, cfg: Any, tokenizer: Any) -> EvalPrompts:
    """--prompts (every prompt unless --num-prompts narrows it), else the run's held-out conversations."""
    kwargs = cfg.data.chat_template_kwargs if cfg is not None else {}
    if request.prompts is not None:
        return labelled_prompts(request.prompts, tokenizer, kwargs).first(request.num_prompts)
    if cfg is not None:
        count = request.num_prompts or HELDOUT_PROMPTS
        ids = heldout_prompts(cfg, request.prompt_len, count, tokenizer)
        return EvalPrompts(ids, [f"held-out prompt {i + 1} of --config" for i in range(len(ids))])
    raise ConfigError("--prompts: give a prompts file, or --config for the run's held-out sequences")


def _engine(request: EvalRequest, model: Any) -> str:
    """kv where the engine serves this target (`--engine auto`), or as asked; kv asked for a target it does not
    serve is refused, naming why."""
    from trainer.engine.support import unsupported_reason

    why = unsupported_reason(model.config, getattr(model, "generation_config", None))
    if request.engine == "kv" and why is not None:
        raise ConfigError(f"--engine kv: the engine does not serve this target: {why}", hint="--engine loop")
    if request.engine == "loop" or why is not None:
        return "loop"
    return "kv"


def _evaluate_in_loop(
    request: EvalRequest,
    target: SpecTarget,
    drafter: DFlashDrafter | None,
    prompts: EvalPrompts,
    stops: list[int],
    on_progress: Progress | None,
) -> EvalReport:
    k = request.ngram_k or (drafter.cfg.block_size - 1 if drafter is not None else DEFAULT_NGRAM_K)
    lookup = PromptLookup(k, request.ngram_min, request.ngram_max)
    primary: Proposer = DFlashProposer(drafter) if drafter is not None else lookup
    baseline = lookup if drafter is not None and request.baseline else None
    total = len(prompts.ids)

    def on_prompt(done: int) -> None:
        if on_progress is not None:
            on_progress("prompts", done, total)

    return evaluate(
        target,
        primary,
        prompts.ids,
        request.max_new_tokens,
        stops or None,
        on_prompt,
        request.tie_ulps,
        baseline,
    )
