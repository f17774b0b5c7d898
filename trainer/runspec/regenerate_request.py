"""What `dflash-doctor data regenerate` is asked to do, as plain data: one request object, its defaults
written once (the CLI's options take theirs from here), checked before torch or the target loads. No torch
here: the CLI imports it to build its options. Adding an option is one field here, its Typer parameter, and
one line where the command builds the request by name."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from dflash_base.errors import ConfigError

ENGINES = ("auto", "torch", "vllm")
DEFAULT_TOP_P = 1.0
DEFAULT_SEED = 0
ON_ERROR = ("stop", "skip")


@dataclass(frozen=True, kw_only=True)
class RegenerateRequest:
    """A regeneration job: where the prompts come from and go to, how the answers are decoded and by what."""

    config: str = ""  # the run config: its target and chat template settings
    prompts: Path = Path()
    out: Path = Path()
    overrides: tuple[str, ...] = ()  # --set section.key=value on the config
    max_new_tokens: int = 1024
    limit: int | None = None  # only the first N input records
    engine: str = "auto"  # auto (vLLM when installed) | torch | vllm
    temperature: float = 0.0  # 0: greedy
    top_p: float = DEFAULT_TOP_P
    samples_per_prompt: int = 1  # answers per prompt: sample 0 keeps the prompt's id, sample k is `<id>#<k>`
    seed: int = DEFAULT_SEED  # with (prompt id, sample, turn), what a sampled answer is drawn from
    on_error: str = "stop"  # a bad input line: stop (exit 2) or skip it
    force: bool = False
    devices: str | None = None  # torch engine: e.g. cuda:0,cuda:1 (None: every local GPU, else the CPU)
    batch_size: int | None = None  # torch engine: rows decoded at once (None: the engine's default)
    tensor_parallel: int = 1  # vllm engine: GPUs per model
    commit_every: float = 60.0  # seconds of work per commit to --out
    json_out: bool = False

    def validate(self) -> None:
        """ConfigError naming the option (exit 2), before torch or the target loads."""
        if self.engine not in ENGINES:
            raise ConfigError(f"--engine: must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.on_error not in ON_ERROR:
            raise ConfigError(f"--on-error: must be stop or skip, got {self.on_error!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**64:
            raise ConfigError(f"--seed: {self.seed!r} is not a seed; give an integer from 0 to 2**64 - 1")
        named = (
            ("--max-new-tokens", self.max_new_tokens),
            ("--limit", self.limit),
            ("--samples-per-prompt", self.samples_per_prompt),
        )
        for name, value in named:
            if value is not None and value < 1:
                raise ConfigError(f"{name}: must be >= 1, got {value}")
        for name, value in (("--batch-size", self.batch_size), ("--tensor-parallel", self.tensor_parallel)):
            if value is not None and value < 1:
                raise ConfigError(f"{name}: must be >= 1, got {value}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigError(
                f"--temperature: {self.temperature} is not a sampling temperature; give a finite number "
                ">= 0 (0 is greedy)"
            )
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise ConfigError(f"--top-p: {self.top_p} is outside (0, 1]; give the nucleus's probability mass")
        if not (math.isfinite(self.commit_every) and self.commit_every >= 1):
            raise ConfigError(
                f"--commit-every: {self.commit_every} is not a number of seconds; give a finite number >= 1"
            )
        if self.tensor_parallel > 1 and self.engine == "torch":
            raise ConfigError(
                f"--tensor-parallel {self.tensor_parallel}: only the vllm engine splits a model across GPUs",
                hint="leave it out (the torch engine runs one copy per device in --devices), or --engine vllm",
            )
        self.validate_sampling()

    def validate_paths(self) -> None:
        """`--out ''` (it arrives as ".") or `--prompts ''`: named as such (issue 58, N13)."""
        for name, path in (("--out", self.out), ("--prompts", self.prompts)):
            if str(path) in ("", "."):
                raise ConfigError(
                    f"{name} {str(path)!r}: names no file (empty, or the current folder)",
                    hint=f"give a file path, e.g. {name} {'answers' if name == '--out' else 'prompts'}.jsonl",
                )

    def validate_sampling(self) -> None:
        """Sampling options without sampling are refused, not ignored (issue 58, N8: `--samples-per-prompt 2`
        at temperature 0 wrote each greedy answer twice; `--top-p` and `--seed` did nothing)."""
        if self.temperature > 0:
            return
        greedy_hint = "add --temperature T (e.g. 0.7) to sample, or leave the option out for greedy answers"
        if self.samples_per_prompt > 1:
            raise ConfigError(
                f"--samples-per-prompt {self.samples_per_prompt} at --temperature 0: greedy decoding gives the "
                "same answer every time, so every sample would be a copy of the first",
                hint=greedy_hint,
            )
        for name, value, default in (
            ("--top-p", self.top_p, DEFAULT_TOP_P),
            ("--seed", self.seed, DEFAULT_SEED),
        ):
            if value != default:
                raise ConfigError(
                    f"{name} {value} at --temperature 0: it shapes sampling, and greedy decoding samples nothing",
                    hint=greedy_hint,
                )


DEFAULTS = RegenerateRequest()  # the defaults, for the CLI's options
