"""`dflash-doctor eval`: real speculative decoding of prompts with a target and an exported drafter, beside
target-only greedy decoding, and the report that compares them (the algorithm: `trainer.decode.speculative`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from dflash_base.errors import ConfigError
from trainer.decode.compare import (
    Comparison,
    compare_outputs,
    default_tie_tolerance,
)
from trainer.decode.speculative import SpecTarget, greedy_decode, speculative_decode
from trainer.model.drafter import DFlashDrafter
from trainer.spec.data_files import jsonl_records
from trainer.spec.eval_request import EvalRequest, check_eval_prompts
from trainer.spec.export_files import check_export_fits


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


def evaluate(
    target: SpecTarget,
    drafter: DFlashDrafter,
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


@dataclass(frozen=True)
class EvalSetup:
    """What `dflash-doctor eval` was asked for."""

    export_dir: str
    target_path: str
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32


def load_pieces(setup: EvalSetup) -> tuple[SpecTarget, DFlashDrafter]:
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
    request: EvalRequest,
    on_prompt: Callable[[int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> EvalReport:
    """Everything `dflash-doctor eval` does: resolve the target and prompts, load, decode, report."""
    request.check()
    cfg = None
    if request.config is not None:
        from trainer.spec.config import load_config

        cfg = load_config(request.config, list(request.overrides))
    target_path = request.target or (cfg.target.path if cfg is not None else None)
    if target_path is None:
        raise ConfigError("--target: name the target (a folder, tiny, random:qwen3-8b) or give --config")
    from trainer.spec.target_shapes import is_embedded, target_shapes

    shapes = target_shapes(target_path)  # the export and the prompts against it, before anything loads
    check_export_fits(request.export, shapes)
    if request.prompts is not None:
        check_eval_prompts(request.prompts, int(shapes.vocab_size))

    tokenizer = None
    if not is_embedded(target_path):
        from trainer.data.sources import load_tokenizer

        tokenizer = load_tokenizer(target_path)
    kwargs = cfg.data.chat_template_kwargs if cfg is not None else {}
    if request.prompts is not None:
        prompts = prompts_from_file(request.prompts, tokenizer, kwargs)[: request.num_prompts]
    elif cfg is not None:
        prompts = heldout_prompts(cfg, request.prompt_len, request.num_prompts)
    else:
        raise ConfigError("--prompts: give a prompts file, or --config for the run's held-out sequences")
    seed = cfg.run.seed if cfg is not None else 0
    setup = EvalSetup(request.export, target_path, seed, request.device, request.dtype)
    target, drafter = load_pieces(setup)
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if on_start is not None:
        on_start(len(prompts))
    return evaluate(target, drafter, prompts, request.max_new_tokens, eos, on_prompt, request.tie_tolerance)
