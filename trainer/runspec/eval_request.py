"""What `dflash-doctor eval` is asked to do, as plain data: one request object, its defaults written once
(the CLI's options take theirs from here), checked before anything loads (the options, the export folder's
files, every line of --prompts). No torch here: the CLI imports it to build its options."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_base.errors import ConfigError
from trainer.runspec.data_files import jsonl_records
from trainer.runspec.export_files import check_export
from trainer.runspec.messages import fields_problem, messages_problem, text_problem

EVAL_DTYPES = ("auto", "bf16", "fp32")
EVAL_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")  # what eval can run on (`tpu` ran on the CPU, exit 0)
DRAFTERS = ("dflash", "ngram")  # the exported drafter; prompt lookup (vLLM's `ngram` method, training-free)
# Near-tie tolerances (logits, relative to max(1, |logit|)); why these values: trainer/decode/compare.py.
TIE_TOLERANCE_LOW_PRECISION = 2.0**-5
TIE_TOLERANCE_FP32 = 1e-4


@dataclass(frozen=True)
class EvalRequest:
    """An eval: the drafter's export, where the target and prompts come from, how much to decode."""

    export: str | None  # the drafter's export folder (None: only prompt lookup, `drafter="ngram"`)
    config: str | None = None  # the run's config: its target, seed and held-out sequences
    target: str | None = None  # default: the config's target.path
    prompts: str | None = None  # a JSONL of prompt / messages / input_ids records
    num_prompts: int = 16
    prompt_len: int = 32  # held-out prompts: the tokens of each kept
    max_new_tokens: int = 64
    device: str = "auto"  # auto | cpu | cuda
    overrides: tuple[str, ...] = ()  # --set section.key=value on the config
    tie_tolerance: float | None = None  # None: the compute dtype's default
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32
    drafter: str = "dflash"  # what proposes the blocks: dflash | ngram
    baseline: bool = True  # prompt lookup beside the drafter, on the same prompts (drafter="dflash" only)
    ngram_k: int | None = None  # tokens prompt lookup proposes (default: the drafter's block - 1, else 15)
    ngram_min: int = 1  # shortest n-gram matched
    ngram_max: int = 4  # longest n-gram matched (vLLM: prompt_lookup_min/max)

    def check(self) -> None:
        """ConfigError naming the option, before anything loads."""
        check_tie_tolerance(self.tie_tolerance)
        if not EVAL_DEVICE.fullmatch(self.device):
            raise ConfigError(
                f"--device {self.device!r}: eval runs on auto, cpu, cuda or cuda:N",
                hint="--device cpu, or --device cuda on a GPU machine (auto: CUDA when torch sees one)",
            )
        if self.dtype not in EVAL_DTYPES:
            raise ConfigError(
                f'--dtype: "{self.dtype}" is not one of {", ".join(EVAL_DTYPES)} (auto: bf16 on CUDA, fp32 on CPU)'
            )
        for name, value in (
            ("--max-new-tokens", self.max_new_tokens),
            ("--num-prompts", self.num_prompts),
            ("--prompt-len", self.prompt_len),
        ):
            if value < 1:  # the one that is, by name (issue 58, N13: all three were named)
                raise ConfigError(f"{name}: must be >= 1, got {value}")
        if self.drafter not in DRAFTERS:
            raise ConfigError(f'--drafter: "{self.drafter}" is not one of {", ".join(DRAFTERS)}')
        if self.drafter == "dflash" and not self.export:
            raise ConfigError(
                "--export: the drafter's export folder is needed for --drafter dflash",
                hint="give --export DIR, or --drafter ngram for prompt lookup alone",
            )
        if (self.ngram_k is not None and self.ngram_k < 1) or not 1 <= self.ngram_min <= self.ngram_max:
            raise ConfigError(
                f"--ngram-k / --ngram-min / --ngram-max: need k >= 1 and 1 <= min <= max, got "
                f"{self.ngram_k}, {self.ngram_min}, {self.ngram_max}"
            )
        if self.export:
            check_export(self.export)  # a truncated or empty model.safetensors: exit 2 naming it, first


def check_eval_prompts(path: str, vocab_size: int) -> None:
    """Every line of `--prompts` against the target's vocabulary, before anything loads: ConfigError naming
    the line and what is wrong (an id outside the vocabulary, negative or not an integer, no ids at all)."""
    for number, record in jsonl_records(Path(path), "--prompts"):
        problem = eval_prompt_problem(record, vocab_size)
        if problem is not None:
            raise ConfigError(f"--prompts: {path} line {number}: {problem}")


def eval_prompt_problem(record: dict[str, Any], vocab_size: int) -> str | None:
    """What is wrong with one eval prompt record (None: nothing)."""
    both = fields_problem(record, ("input_ids", "prompt", "messages"))
    if both is not None:  # was: input_ids, else prompt, used without a word
        return both
    if "input_ids" in record:
        ids = record["input_ids"]
        if not isinstance(ids, list) or not ids:
            return f"input_ids must be a non-empty list of token ids, got {json_of(ids)}"
        for i, token in enumerate(ids):
            if not isinstance(token, int) or isinstance(token, bool):
                return f"input_ids[{i}] is {json_of(token)}, not a token id (an integer)"
            if not 0 <= token < vocab_size:
                return f"input_ids[{i}] is {token}, outside the target's vocabulary (0..{vocab_size - 1})"
        return None
    if "prompt" in record:
        return text_problem(record["prompt"], "prompt")
    if "messages" in record:
        return messages_problem(record["messages"])
    return 'needs "prompt", "messages" or "input_ids"'


def json_of(value: Any) -> str:
    import json

    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


DEFAULTS = EvalRequest(export=None)  # the defaults, for the CLI's options


def check_tie_tolerance(tolerance: float | None) -> None:
    """--tie-tolerance: a finite number >= 0 (None: the compute dtype's default)."""
    if tolerance is not None and not (math.isfinite(tolerance) and tolerance >= 0):
        raise ConfigError(
            f"--tie-tolerance: {tolerance} is not a logit tolerance; give a number >= 0, relative to "
            f"max(1, |logit|) (leave it out for the dtype's default: {TIE_TOLERANCE_LOW_PRECISION} in "
            f"bf16/fp16, {TIE_TOLERANCE_FP32} in fp32; 0 accepts only exact ties)"
        )
