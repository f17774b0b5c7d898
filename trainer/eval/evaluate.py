"""`dflash-doctor eval`: real speculative decoding of prompts with a target and an exported drafter, beside
target-only greedy decoding, and the report that compares them (the algorithm: `trainer.eval.speculative`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from dflash_base.errors import ConfigError
from trainer.engine.target import stop_token_ids
from trainer.eval.compare import Comparison, compare_outputs, default_tie_tolerance
from trainer.eval.prompts import heldout_prompts, prompts_from_file
from trainer.eval.proposers import DFlashProposer, PromptLookup, Proposer
from trainer.eval.speculative import SpecTarget, Stops, greedy_decode, speculative_decode
from trainer.model.drafter import DFlashDrafter
from trainer.runspec.eval_request import EvalRequest, check_eval_prompts
from trainer.runspec.export_files import check_export_fits

if TYPE_CHECKING:
    pass


@dataclass
class PromptReport:
    prompt_tokens: int
    new_tokens: int
    identical: bool  # speculative output == target-only greedy output, token for token (bitwise)
    accept_len: float
    target_forwards: int
    baseline_forwards: int
    seconds: float
    baseline_seconds: float
    comparison: Comparison  # identical, a near-tie flip (tie) or a real difference; where and by how much


@dataclass
class EvalReport:
    """One proposer (the drafter, or prompt lookup) over every prompt, against target-only greedy decoding."""

    prompts: int
    mean_accept_len: float  # tau: emitted tokens per verify forward (bonus token included), over all forwards
    target_forwards: int
    baseline_forwards: int  # target-only greedy: one forward per token
    new_tokens: int
    tok_s: float
    baseline_tok_s: float
    speedup: float
    identical: bool  # every prompt's output bitwise identical to target-only greedy's
    ties: int  # prompts whose outputs differ only by a near-tie flip (rounding, not the drafter)
    differences: int  # prompts whose outputs really differ (a bug)
    tie_tolerance: float  # logits, relative to max(1, |logit|)
    dtype: str
    block_size: int  # tokens a verify forward checks at most: the proposal + the last accepted token
    device: str
    per_prompt: list[PromptReport]
    drafter: str = "dflash"  # dflash | ngram (prompt lookup)
    # How far into a block verification gets: [i] = the share of verify forwards that accepted slot i + 1
    # (what a block size and a draft depth are chosen with), and how many forwards emitted 1, 2, ... B tokens.
    accept_by_position: list[float] = field(default_factory=list)
    accept_length_histogram: list[int] = field(default_factory=list)
    baseline: EvalReport | None = None  # prompt lookup on the same prompts and target, when asked for
    # The figure as vLLM logs it ("Mean acceptance length": 1 + accepted / drafts, a draft counted only when
    # it proposed a token): tau over the verify forwards that proposed something; None when none did. Equal
    # to tau for the drafter (it always proposes); above it for prompt lookup, whose empty proposals tau counts.
    mean_accept_len_proposed: float | None = None
    forwards_without_proposal: int = 0  # verify forwards that proposed nothing (one plain decoding step each)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def exit_code(self, strict: bool = False) -> int:
        """1 on a real difference (or, `strict`, on anything not bitwise identical), else 0; the baseline's
        output goes through the same verify loop, so a difference there is the same bug."""
        own = 1 if self.differences or (strict and not self.identical) else 0
        return max(own, self.baseline.exit_code(strict) if self.baseline is not None else 0)


def acceptance_shape(accepted: list[int], block: int) -> tuple[list[float], list[int]]:
    """(share of forwards accepting each slot 1..B-1, count of forwards per acceptance length 1..B)."""
    forwards = max(len(accepted), 1)
    by_position = [sum(a > slot for a in accepted) / forwards for slot in range(1, block)]
    histogram = [sum(a == length for a in accepted) for length in range(1, block + 1)]
    return by_position, histogram


def evaluate(
    target: SpecTarget,
    proposer: Proposer | DFlashDrafter,
    prompts: list[list[int]],
    max_new: int,
    eos: Stops = None,
    on_prompt: Callable[[int], None] | None = None,
    tie_tolerance: float | None = None,
    baseline: Proposer | None = None,
) -> EvalReport:
    """Decode every prompt with the target alone and with each proposer (`baseline` beside the first); the
    report compares each with target-only greedy (tie_tolerance None: the dtype's default)."""
    if isinstance(proposer, DFlashDrafter):
        proposer = DFlashProposer(proposer)
    tolerance = default_tie_tolerance(target.dtype) if tie_tolerance is None else tie_tolerance
    proposers = [proposer, *([baseline] if baseline is not None else [])]
    rows: dict[str, list[PromptReport]] = {p.name: [] for p in proposers}
    accepted: dict[str, list[int]] = {p.name: [] for p in proposers}
    proposed: dict[str, list[int]] = {p.name: [] for p in proposers}
    seconds: dict[str, float] = {p.name: 0.0 for p in proposers}
    base_s = 0.0
    for number, prompt in enumerate(prompts, start=1):
        base = greedy_decode(target, prompt, max_new, eos)
        base_s += base.seconds
        for p in proposers:
            spec = speculative_decode(target, p, prompt, max_new, eos)
            accepted[p.name].extend(spec.accepted)
            proposed[p.name].extend(spec.proposed)
            seconds[p.name] += spec.seconds
            rows[p.name].append(
                PromptReport(
                    prompt_tokens=len(prompt),
                    new_tokens=len(spec.tokens),
                    identical=spec.tokens == base.tokens,
                    accept_len=sum(spec.accepted) / max(len(spec.accepted), 1),
                    target_forwards=spec.target_forwards,
                    baseline_forwards=base.target_forwards,
                    seconds=spec.seconds,
                    baseline_seconds=base.seconds,
                    comparison=compare_outputs(base.tokens, base.top, spec.tokens, spec.top, tolerance),
                )
            )
        if on_prompt is not None:
            on_prompt(number)

    def report(p: Proposer) -> EvalReport:
        mine, spec_s = rows[p.name], seconds[p.name]
        new_tokens = sum(r.new_tokens for r in mine)
        block = p.max_draft + 1
        by_position, histogram = acceptance_shape(accepted[p.name], block)
        drafted = [a for a, n in zip(accepted[p.name], proposed[p.name], strict=True) if n]
        return EvalReport(
            prompts=len(prompts),
            mean_accept_len=sum(accepted[p.name]) / max(len(accepted[p.name]), 1),
            target_forwards=sum(r.target_forwards for r in mine),
            baseline_forwards=sum(r.baseline_forwards for r in mine),
            new_tokens=new_tokens,
            tok_s=new_tokens / spec_s if spec_s else 0.0,
            baseline_tok_s=new_tokens / base_s if base_s else 0.0,
            speedup=base_s / spec_s if spec_s else 0.0,
            identical=all(r.identical for r in mine),
            ties=sum(r.comparison.verdict == "tie" for r in mine),
            differences=sum(r.comparison.verdict == "different" for r in mine),
            tie_tolerance=tolerance,
            dtype=str(target.dtype).removeprefix("torch."),
            block_size=block,
            device=str(target.device),
            per_prompt=mine,
            drafter=p.name,
            accept_by_position=[round(x, 4) for x in by_position],
            accept_length_histogram=histogram,
            mean_accept_len_proposed=sum(drafted) / len(drafted) if drafted else None,
            forwards_without_proposal=len(accepted[p.name]) - len(drafted),
        )

    primary = report(proposer)
    if baseline is not None:
        primary.baseline = report(baseline)
    return primary


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


def run_eval(
    request: EvalRequest,
    on_prompt: Callable[[int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> EvalReport:
    """Everything `dflash-doctor eval` does: resolve the target and prompts, load, decode, report."""
    request.check()
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
    kwargs = cfg.data.chat_template_kwargs if cfg is not None else {}
    if request.prompts is not None:
        prompts = prompts_from_file(request.prompts, tokenizer, kwargs)[: request.num_prompts]
    elif cfg is not None:
        prompts = heldout_prompts(cfg, request.prompt_len, request.num_prompts, tokenizer)
    else:
        raise ConfigError("--prompts: give a prompts file, or --config for the run's held-out sequences")
    seed = cfg.run.seed if cfg is not None else 0
    setup = EvalSetup(request.export or "", target_path, seed, request.device, request.dtype)
    drafter = None
    if request.drafter == "dflash":
        target, drafter = load_pieces(setup)
    else:
        target = SpecTarget(load_eval_target(setup), [])  # prompt lookup reads no layers
    k = request.ngram_k or (drafter.cfg.block_size - 1 if drafter is not None else 15)
    lookup = PromptLookup(k, request.ngram_min, request.ngram_max)
    primary: Proposer = DFlashProposer(drafter) if drafter is not None else lookup
    baseline = lookup if drafter is not None and request.baseline else None
    # Where an answer ends, as `data regenerate` reads it: the generation config's eos ids and the tokenizer's.
    eos = stop_token_ids(tokenizer, getattr(target.model, "generation_config", None)) if tokenizer else None
    if on_start is not None:
        on_start(len(prompts))
    return evaluate(
        target, primary, prompts, request.max_new_tokens, eos, on_prompt, request.tie_tolerance, baseline
    )
