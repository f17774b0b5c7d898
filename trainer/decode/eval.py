"""Real greedy block speculative decoding with a target and an exported drafter, against target-only greedy.

`python -m trainer.decode.eval --export DIR --config RUN.toml` (or `dflash-doctor eval`, the same code).

The loop, per prompt:
1. the target prefills the prompt (one forward): its greedy token is the first new token, and the
   captured layers' outputs are the drafter's context for every prompt position;
2. the drafter proposes a block from the last accepted token (slot 0 = that token, slots 1.. = the mask
   token; its context: the captured features of every position before it), one forward;
3. the target verifies the block in one forward (the last accepted token + the B-1 drafted ones);
4. the longest prefix of drafted tokens equal to the target's own greedy choices is accepted, plus the
   target's next token (the bonus token): 1..B tokens per verify forward, the acceptance length;
5. the KV cache is cut back to the accepted tokens, the drafter's context grows by their features;
   repeat until --max-new-tokens (or the end-of-sequence token).

The tokens equal target-only greedy decoding's by construction (every emitted token is the target's
greedy choice after the emitted prefix), exactly so in fp32. In bf16 a B-token verify forward and a 1-token
forward round differently and can flip a near-tie; both decodes keep the target's top-k logits at every
emitted token, and `trainer.decode.compare` tells such a flip (`tie`) from a real difference (`different`).
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from dflash_base.errors import ConfigError, DoctorError
from trainer.decode.compare import (
    TIE_TOLERANCE_FP32,
    TIE_TOLERANCE_LOW_PRECISION,
    TOP_K,
    Comparison,
    TopChoices,
    compare_outputs,
    default_tie_tolerance,
)
from trainer.spec.data_files import jsonl_records
from trainer.target.capture import LayerOutputs
from trainer.target.load import cache_argument, returned_cache


@dataclass
class Decoded:
    """One prompt decoded one way."""

    tokens: list[int]
    target_forwards: int
    seconds: float
    accepted: list[int] = field(default_factory=list)  # per verify forward: tokens it accepted (1..B)
    top: list[TopChoices] = field(default_factory=list)  # per token: the target's top-k where it chose it


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
    prompts: int
    mean_accept_len: float  # accepted tokens per verify forward (bonus token included), over all forwards
    target_forwards: int
    baseline_forwards: int
    new_tokens: int
    tok_s: float
    baseline_tok_s: float
    speedup: float
    identical: bool  # every prompt's output bitwise identical to target-only greedy's
    ties: int  # prompts whose outputs differ only by a near-tie flip (rounding, not the drafter)
    differences: int  # prompts whose outputs really differ (a bug)
    tie_tolerance: float  # logits, relative to max(1, |logit|)
    dtype: str
    block_size: int
    device: str
    per_prompt: list[PromptReport]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def exit_code(self, strict: bool = False) -> int:
        """1 on a real difference (or, `strict`, on anything not bitwise identical), else 0."""
        return 1 if self.differences or (strict and not self.identical) else 0


@dataclass
class TargetStep:
    """One target forward, reduced to what decoding needs (per input position)."""

    greedy: Tensor  # (L,) the target's greedy next token
    top_logits: Tensor  # (L, k) its k highest logits, highest first
    top_ids: Tensor  # (L, k)
    features: Tensor  # (1, L, F) the captured layers' outputs
    cache: Any

    def top(self, rows: slice) -> list[TopChoices]:
        """The top-k at these positions, on the host."""
        logits, ids = self.top_logits[rows].float().tolist(), self.top_ids[rows].tolist()
        return [TopChoices(tuple(i), tuple(v)) for i, v in zip(ids, logits, strict=True)]


class SpecTarget:
    """The full target (causal LM) with forward hooks on the drafter's captured layers."""

    def __init__(self, model: nn.Module, layer_ids: list[int]) -> None:
        self.model = model.eval().requires_grad_(False)
        self.layer_ids = list(layer_ids)
        self.outputs = LayerOutputs(model.model.layers, self.layer_ids)
        self.cache_name = cache_argument(model)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def logits(self, ids: Tensor, cache: Any) -> tuple[Tensor, Tensor, Any]:
        """(logits (L, V), captured features (1, L, F), the cache) for `ids` (1, L) after the cache."""
        self.outputs.clear()
        out = self.model(
            input_ids=ids, use_cache=True, **({self.cache_name: cache} if cache is not None else {})
        )
        return out.logits[0], self.outputs.take(), returned_cache(out, self.cache_name)

    def forward(self, ids: Tensor, cache: Any) -> TargetStep:
        """The greedy token and top-k logits per position (a topk on rows computed anyway), features, cache."""
        logits, features, cache = self.logits(ids, cache)
        top = logits.topk(TOP_K, dim=-1)
        return TargetStep(logits.argmax(-1), top.values, top.indices, features, cache)


def keep_first(cache: Any, length: int) -> None:
    """Cut a transformers cache back to its first `length` positions (the rejected draft's are dropped)."""
    remove = cache.get_seq_length() - length
    if remove <= 0:
        return
    if "tokens_to_remove" in inspect.signature(cache.crop).parameters:
        cache.crop(-remove)  # transformers >= 5: a negative count
    else:
        cache.crop(length)  # older: the length to keep


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _finish(tokens: list[int], max_new: int, eos: int | None) -> int:
    """How many of the emitted tokens count: at most max_new, up to and including the first eos."""
    tokens = tokens[:max_new]
    return tokens.index(eos) + 1 if eos is not None and eos in tokens else len(tokens)


@torch.inference_mode()
def greedy_decode(target: SpecTarget, prompt: list[int], max_new: int, eos: int | None) -> Decoded:
    """Target-only greedy decoding with a KV cache: one forward per token."""
    device = target.device
    _sync(device)
    began = time.perf_counter()
    step = target.forward(torch.tensor([prompt], device=device), None)
    tokens, top = [int(step.greedy[-1])], step.top(slice(-1, None))
    forwards = 1
    while len(tokens) < max_new and tokens[-1] != eos:
        step = target.forward(torch.tensor([[tokens[-1]]], device=device), step.cache)
        tokens.append(int(step.greedy[-1]))
        top += step.top(slice(-1, None))
        forwards += 1
    _sync(device)
    n = _finish(tokens, max_new, eos)
    return Decoded(tokens[:n], forwards, time.perf_counter() - began, top=top[:n])


@torch.inference_mode()
def speculative_decode(
    target: SpecTarget, drafter: nn.Module, prompt: list[int], max_new: int, eos: int | None
) -> Decoded:
    """Greedy block speculative decoding (see the module docstring)."""
    device = target.device
    block = drafter.cfg.block_size
    _sync(device)
    began = time.perf_counter()
    step = target.forward(torch.tensor([prompt], device=device), None)
    features, cache = step.features, step.cache
    ids, top = [*prompt, int(step.greedy[-1])], step.top(slice(-1, None))
    forwards, accepted = 1, []
    one = torch.ones(1, 1, dtype=torch.bool, device=device)
    while len(ids) - len(prompt) < max_new and ids[-1] != eos:
        n = len(ids)  # the last token (n - 1) is the anchor; features exist for 0..n-2
        context = torch.cat([features, features.new_zeros(1, 1, features.shape[-1])], dim=1)
        anchor = torch.tensor([[n - 1]], device=device)
        draft = drafter.draft_tokens(torch.tensor([ids], device=device), context, anchor, one)[0, 0].tolist()
        verify = torch.tensor([[ids[-1], *draft]], device=device)
        step = target.forward(verify, cache)
        cache = step.cache
        choices = step.greedy.tolist()  # the target's choice after each block position
        k = 0
        while k < block - 1 and draft[k] == choices[k]:
            k += 1
        ids.extend([*draft[:k], choices[k]])
        top += step.top(slice(0, k + 1))  # the rows that chose the k + 1 emitted tokens
        features = torch.cat([features, step.features[:, : k + 1]], dim=1)
        keep_first(cache, n + k)
        forwards += 1
        accepted.append(k + 1)
    _sync(device)
    tokens = ids[len(prompt) :]
    n = _finish(tokens, max_new, eos)
    return Decoded(tokens[:n], forwards, time.perf_counter() - began, accepted, top[:n])


def evaluate(
    target: SpecTarget,
    drafter: nn.Module,
    prompts: list[list[int]],
    max_new: int,
    eos: int | None = None,
    on_prompt: Callable[[int], None] | None = None,
    tie_tolerance: float | None = None,
) -> EvalReport:
    """Decode every prompt both ways; the report compares them (tie_tolerance None: the dtype's default)."""
    tolerance = default_tie_tolerance(target.dtype) if tie_tolerance is None else tie_tolerance
    rows: list[PromptReport] = []
    all_accepted: list[int] = []
    spec_s = base_s = 0.0
    new_tokens = 0
    for number, prompt in enumerate(prompts, start=1):
        base = greedy_decode(target, prompt, max_new, eos)
        spec = speculative_decode(target, drafter, prompt, max_new, eos)
        all_accepted.extend(spec.accepted)
        spec_s, base_s = spec_s + spec.seconds, base_s + base.seconds
        new_tokens += len(spec.tokens)
        rows.append(
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
    return EvalReport(
        prompts=len(prompts),
        mean_accept_len=sum(all_accepted) / max(len(all_accepted), 1),
        target_forwards=sum(r.target_forwards for r in rows),
        baseline_forwards=sum(r.baseline_forwards for r in rows),
        new_tokens=new_tokens,
        tok_s=new_tokens / spec_s if spec_s else 0.0,
        baseline_tok_s=new_tokens / base_s if base_s else 0.0,
        speedup=base_s / spec_s if spec_s else 0.0,
        identical=all(r.identical for r in rows),
        ties=sum(r.comparison.verdict == "tie" for r in rows),
        differences=sum(r.comparison.verdict == "different" for r in rows),
        tie_tolerance=tolerance,
        dtype=str(target.dtype).removeprefix("torch."),
        block_size=int(drafter.cfg.block_size),
        device=str(target.device),
        per_prompt=rows,
    )


# ---------------------------------------------------------------- building the pieces


EVAL_DTYPES = ("auto", "bf16", "fp32")


@dataclass(frozen=True)
class EvalSetup:
    """What `dflash-doctor eval` was asked for."""

    export_dir: str
    target_path: str
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32


def load_pieces(setup: EvalSetup) -> tuple[SpecTarget, nn.Module]:
    """The full target and the exported drafter (with the target's frozen embedding and head), on one device."""
    from trainer.model.device import resolve_device, target_dtype
    from trainer.model.export import ExportError, load_drafter
    from trainer.target.load import load_target_model

    device = resolve_device(setup.device)
    dtype = target_dtype(setup.dtype, device)
    model = load_target_model(setup.target_path, setup.seed, device, dtype)
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


def prompts_from_file(path: str, tokenizer: Any, template_kwargs: dict[str, Any]) -> list[list[int]]:
    """A JSONL of {"input_ids": [...]}, {"prompt": "..."} or {"messages": [...]} (rendered with the chat
    template's generation prompt) records."""
    out = []
    for number, record in jsonl_records(Path(path), "--prompts"):
        where = f"--prompts: {path} line {number}"
        if isinstance(record.get("input_ids"), list) and record["input_ids"]:
            out.append([int(t) for t in record["input_ids"]])
            continue
        if tokenizer is None:
            raise ConfigError(f'{where}: this target has no tokenizer; give "input_ids"')
        if isinstance(record.get("prompt"), str):
            out.append(list(tokenizer(record["prompt"], add_special_tokens=True)["input_ids"]))
        elif isinstance(record.get("messages"), list):
            from trainer.decode.generation import prompt_ids

            out.append(prompt_ids(tokenizer, record["messages"], template_kwargs))
        else:
            raise ConfigError(f'{where}: needs "prompt", "messages" or "input_ids"')
    return out


def heldout_prompts(cfg: Any, prompt_len: int, count: int) -> list[list[int]]:
    """The first `prompt_len` tokens of the run's first `count` held-out sequences (never trained on)."""
    from trainer.data.sources import build_source, split_data
    from trainer.spec.target_shapes import target_shapes

    split = split_data(cfg)
    if not split.eval_ids:
        raise ConfigError("--config: this run holds no data out (set data.eval_fraction or data.eval_path)")
    vocab = target_shapes(cfg.target.path).vocab_size
    if cfg.data.eval_path is not None:
        source = build_source(cfg, torch.device("cpu"), vocab, cfg.data.eval_path, "data.eval_path")
    else:
        source = build_source(cfg, torch.device("cpu"), vocab)
    prompts = []
    for j in split.eval_ids[:count]:
        ids, _ = source.get(j)
        prompts.append(ids[:prompt_len].tolist())
    return prompts


def run_eval(
    export_dir: str,
    config: str | None,
    target_path: str | None,
    prompts_path: str | None,
    num_prompts: int,
    prompt_len: int,
    max_new_tokens: int,
    device: str,
    overrides: list[str] | None = None,
    on_prompt: Callable[[int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    tie_tolerance: float | None = None,
    dtype: str = "auto",
) -> EvalReport:
    """Everything `dflash-doctor eval` does: resolve the target and prompts, load, decode, report."""
    check_tie_tolerance(tie_tolerance)
    if dtype not in EVAL_DTYPES:
        raise ConfigError(
            f'--dtype: "{dtype}" is not one of {", ".join(EVAL_DTYPES)} (auto: bf16 on CUDA, fp32 on CPU)'
        )
    cfg = None
    if config is not None:
        from trainer.spec.config import load_config

        cfg = load_config(config, overrides or [])
    target_path = target_path or (cfg.target.path if cfg is not None else None)
    if target_path is None:
        raise ConfigError("--target: name the target (a folder, tiny, random:qwen3-8b) or give --config")
    if max_new_tokens < 1 or num_prompts < 1 or prompt_len < 1:
        raise ConfigError("--max-new-tokens, --num-prompts and --prompt-len: must be >= 1")
    from trainer.spec.target_shapes import is_embedded

    tokenizer = None
    if not is_embedded(target_path):
        from trainer.data.sources import load_tokenizer

        tokenizer = load_tokenizer(target_path)
    kwargs = cfg.data.chat_template_kwargs if cfg is not None else {}
    if prompts_path is not None:
        prompts = prompts_from_file(prompts_path, tokenizer, kwargs)[:num_prompts]
    elif cfg is not None:
        prompts = heldout_prompts(cfg, prompt_len, num_prompts)
    else:
        raise ConfigError("--prompts: give a prompts file, or --config for the run's held-out sequences")
    seed = cfg.run.seed if cfg is not None else 0
    target, drafter = load_pieces(EvalSetup(export_dir, target_path, seed, device, dtype))
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if on_start is not None:
        on_start(len(prompts))
    return evaluate(target, drafter, prompts, max_new_tokens, eos, on_prompt, tie_tolerance)


def check_tie_tolerance(tolerance: float | None) -> None:
    """--tie-tolerance: a finite number >= 0 (None: the compute dtype's default)."""
    if tolerance is not None and not (math.isfinite(tolerance) and tolerance >= 0):
        raise ConfigError(
            f"--tie-tolerance: {tolerance} is not a logit tolerance; give a number >= 0, relative to "
            f"max(1, |logit|) (leave it out for the dtype's default: {TIE_TOLERANCE_LOW_PRECISION} in "
            f"bf16/fp16, {TIE_TOLERANCE_FP32} in fp32; 0 accepts only exact ties)"
        )


def _rates(path: str, pick: int | None, other: int | None, margin: float | None) -> str:
    if margin is None:
        return f"{path} path has {other} outside its top {TOP_K}"
    return f"{path} path rates {other} {margin:.4g} below {pick}"


def _difference_line(number: int, row: PromptReport) -> str:
    """Where one prompt's outputs part, and how close the target's two choices were there."""
    c = row.comparison
    where = f"  prompt {number}: {c.verdict} at new token index {c.first_diff}"
    if c.greedy_token is None:
        return f"{where}: one output stops early"
    a, b = c.greedy_token, c.spec_token
    allowed = "" if c.allowed_margin is None else f" (a tie allows {c.allowed_margin:.4g})"
    return (
        f"{where}: greedy {a} vs speculative {b}; {_rates('greedy', a, b, c.greedy_margin)}, "
        f"{_rates('speculative', b, a, c.spec_margin)}{allowed}"
    )


def _verdict_line(report: EvalReport) -> str:
    if report.identical:
        return "output tokens identical to target-only greedy decoding (bitwise)"
    ties = (
        f"{report.ties} differ only by a near-tie flip ({report.dtype} rounding between a "
        f"{report.block_size}-token and a 1-token forward, not the drafter; tolerance "
        f"{report.tie_tolerance:g} x max(1, |logit|))"
    )
    if not report.differences:
        return (
            f"output tokens match target-only greedy decoding: {report.prompts - report.ties} bitwise, {ties}"
        )
    return (
        f"output tokens DIFFERENT from target-only greedy decoding in {report.differences} of "
        f"{report.prompts} prompts (a token the target did not choose: a bug)"
    ) + (f"; {ties}" if report.ties else "")


def format_report(report: EvalReport) -> str:
    lines = [
        f"prompts {report.prompts}, new tokens {report.new_tokens}, block {report.block_size}, "
        f"{report.device}, {report.dtype}",
        f"mean acceptance length {report.mean_accept_len:.3f} tokens per target forward",
        f"target forwards {report.target_forwards} (target-only greedy: {report.baseline_forwards})",
        f"{report.tok_s:,.1f} tok/s vs {report.baseline_tok_s:,.1f} tok/s target-only: "
        f"speed-up {report.speedup:.2f}x",
        _verdict_line(report),
    ]
    lines += [_difference_line(n, r) for n, r in enumerate(report.per_prompt, 1) if not r.identical]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.decode.eval", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--export", required=True, help="the drafter's export folder")
    parser.add_argument("--config", help="the run's config: its target, seed and held-out sequences")
    parser.add_argument("--target", help="the target (default: the config's target.path)")
    parser.add_argument("--prompts", help="a JSONL of prompt / messages / input_ids records")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=32, help="held-out prompts: tokens kept")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--tie-tolerance", type=float, help="near-tie flip tolerance (default: by dtype)")
    parser.add_argument("--strict", action="store_true", help="exit 1 on anything not bitwise identical")
    parser.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        report = run_eval(
            args.export, args.config, args.target, args.prompts, args.num_prompts, args.prompt_len,
            args.max_new_tokens, args.device, args.overrides, tie_tolerance=args.tie_tolerance,
            dtype=args.dtype,
        )  # fmt: skip
    except DoctorError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(report.to_json(), indent=2) if args.json else format_report(report))
    return report.exit_code(args.strict)


if __name__ == "__main__":
    sys.exit(main())
