"""What `dflash-doctor eval` is asked to do, as plain data: one request object, its defaults written once
(the CLI's options take theirs from here), checked before anything loads (the options, the export folder's
files, every line of --prompts). No torch here: the CLI imports it to build its options."""

from __future__ import annotations

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
# Near-tie tolerances, in units in the last place of the top logit; why these values: trainer/eval/compare.py.
TIE_ULPS_LOW_PRECISION = 16  # bf16, fp16
TIE_ULPS_FP32 = 64
MAX_TIE_ULPS = 1 << 16


ENGINES = ("auto", "kv", "loop")  # the KV engine (batched, graphs), the Python loop (one prompt at a time)
HELDOUT_PROMPTS = 16  # held-out prompts decoded when --num-prompts is not given (a prompts file: all of it)
DEFAULT_NGRAM_K = 15  # prompt lookup's tokens a block without a drafter (with one: its block - 1)
MAX_NGRAM = 64  # the most tokens prompt lookup may propose, or match (vLLM's practical range is under 16)
LATENCY_BATCHES_GPU = (1, 8, 32)  # concurrent requests the latency table measures by default on a GPU
MAX_LATENCY_BATCH = 4096


@dataclass(frozen=True)
class EvalRequest:
    """An eval: the drafter's export, where the target and prompts come from, how much to decode."""

    export: str | None  # the drafter's export folder (None: only prompt lookup, `drafter="ngram"`)
    config: str | None = None  # the run's config: its target, seed and held-out sequences
    target: str | None = None  # default: the config's target.path
    prompts: str | None = None  # a JSONL of prompt / messages / input_ids records
    num_prompts: int | None = None  # None: every prompt of --prompts (held-out data: HELDOUT_PROMPTS)
    prompt_len: int = 32  # held-out prompts: the tokens of each kept
    max_new_tokens: int = 128  # the length the figures in README.md and BENCHMARKS.md use
    device: str = "auto"  # auto | cpu | cuda
    overrides: tuple[str, ...] = ()  # --set section.key=value on the config
    tie_ulps: int | None = None  # near-tie tolerance in ulps of the top logit; None: the dtype's default
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32
    drafter: str = "dflash"  # what proposes the blocks: dflash | ngram
    baseline: bool = True  # prompt lookup beside the drafter, on the same prompts (drafter="dflash" only)
    ngram_k: int | None = None  # tokens prompt lookup proposes (default: the drafter's block - 1, else 15)
    ngram_min: int = 1  # shortest n-gram matched
    ngram_max: int = 4  # longest n-gram matched (vLLM: prompt_lookup_min/max)
    engine: str = "auto"  # auto (kv where the target is one the engine serves) | kv | loop
    latency: tuple[int, ...] | None = (
        None  # batch sizes timed; None: LATENCY_BATCHES_GPU on a GPU, none on a CPU
    )
    latency_prompts: int = 64  # the requests each latency row decodes (the set's first N)

    def check(self) -> None:
        """ConfigError naming the option, before anything loads."""
        if self.tie_ulps is not None and not 0 <= self.tie_ulps <= MAX_TIE_ULPS:
            raise ConfigError(
                f"--tie-ulps: {self.tie_ulps} is not a tolerance; give the ulps of the top logit a token may lie "
                f"below it and count as a near-tie, 0..{MAX_TIE_ULPS} (leave it out for the dtype's default: "
                f"{TIE_ULPS_LOW_PRECISION} in bf16/fp16, {TIE_ULPS_FP32} in fp32; 0 accepts only exact ties)"
            )
        if not EVAL_DEVICE.fullmatch(self.device):
            raise ConfigError(
                f"--device {self.device!r}: eval runs on auto, cpu, cuda or cuda:N",
                hint="--device cpu, or --device cuda on a GPU machine (auto: CUDA when torch sees one)",
            )
        if self.dtype not in EVAL_DTYPES:
            raise ConfigError(
                f'--dtype: "{self.dtype}" is not one of {", ".join(EVAL_DTYPES)} (auto: bf16 on CUDA, fp32 on CPU)'
            )
        for option, value in (
            ("--max-new-tokens", self.max_new_tokens),
            ("--num-prompts", self.num_prompts),
            ("--prompt-len", self.prompt_len),
            ("--latency-prompts", self.latency_prompts),
        ):
            if value is not None and value < 1:
                raise ConfigError(f"{option}: must be >= 1, got {value}")
        if self.drafter not in DRAFTERS:
            raise ConfigError(f'--drafter: "{self.drafter}" is not one of {", ".join(DRAFTERS)}')
        if self.engine not in ENGINES:
            raise ConfigError(f'--engine: "{self.engine}" is not one of {", ".join(ENGINES)}')
        if self.drafter == "dflash" and not self.export:
            raise ConfigError(
                "--export: the drafter's export folder is needed for --drafter dflash",
                hint="give --export DIR, or --drafter ngram for prompt lookup alone",
            )
        self._check_ngram()
        for batch in self.latency or ():
            if not 1 <= batch <= MAX_LATENCY_BATCH:
                raise ConfigError(
                    f"--latency: a batch of {batch}; give sizes 1..{MAX_LATENCY_BATCH}, e.g. 1,8,32"
                )
        if self.export:
            check_export(self.export)  # a truncated or empty model.safetensors: exit 2 naming it, first

    def _check_ngram(self) -> None:
        k, low, high = self.ngram_k, self.ngram_min, self.ngram_max
        if (k is not None and not 1 <= k <= MAX_NGRAM) or not 1 <= low <= high <= MAX_NGRAM:
            raise ConfigError(
                f"--ngram-k / --ngram-min / --ngram-max: need 1 <= k <= {MAX_NGRAM} and 1 <= min <= max <= "
                f"{MAX_NGRAM}, got {k}, {low}, {high}",
                hint="vLLM's prompt lookup proposes a few tokens (num_speculative_tokens) from n-grams of a few",
            )

    def latency_batches(self, on_gpu: bool) -> tuple[int, ...]:
        """The batch sizes timed: the asked ones, else the default for the device."""
        if self.latency is not None:
            return self.latency
        return LATENCY_BATCHES_GPU if on_gpu else ()


def check_eval_lengths(prompts: list[list[int]], max_new_tokens: int, context: int, where: list[str]) -> None:
    """Each prompt and its answer within the target's context, before the target loads: ConfigError naming
    --max-new-tokens (when no prompt could fit it) or the prompt's line (`where[i]`)."""
    if max_new_tokens >= context:
        raise ConfigError(
            f"--max-new-tokens {max_new_tokens}: the target's context is {context:,} tokens, prompt and answer "
            "together",
            hint=f"give at most {context - 1} (the README's figures use 128)",
        )
    for prompt, line in zip(prompts, where, strict=True):
        if len(prompt) + max_new_tokens > context:
            raise ConfigError(
                f"{line}: {len(prompt):,} prompt tokens and --max-new-tokens {max_new_tokens} are more than the "
                f"target's context ({context:,} tokens)",
                hint="shorten or drop that prompt, or lower --max-new-tokens",
            )


def check_eval_prompts(path: str, vocab_size: int, field: str = "--prompts") -> None:
    """Every line of a prompts file against the target's vocabulary, before anything loads: ConfigError naming
    the line and what is wrong (an id outside the vocabulary, negative or not an integer, no ids at all).
    `field`: what named the file (`--prompts`, or the config's `eval.prompts`)."""
    for number, record in jsonl_records(Path(path), field):
        problem = eval_prompt_problem(record, vocab_size)
        if problem is not None:
            raise ConfigError(f"{field}: {path} line {number}: {problem}")


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
