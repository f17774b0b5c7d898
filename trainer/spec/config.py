"""The run config: TOML -> nested dataclasses, validated before any process group starts.

Every error names the field (`drafter.block_size: must be an integer >= 2, got "sixteen"`) and raises
`ConfigError` (exit code 2). Unknown sections and keys are errors too: a typo must not pass silently.
Defaults that depend on the target (layer ids, mask token id) are filled in by `load_config` once the
target's shape is known.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import tomllib

from dflash_base.errors import ConfigError
from trainer.run.metric_sinks import require_extra
from trainer.spec.data_files import check_data_file, count_records
from trainer.spec.mask_token import resolve_mask_token
from trainer.spec.target_shapes import default_target_layer_ids, is_embedded, target_shapes
from trainer.spec.topology import (
    COLOCATED,
    MODES,
    OVERLAP_MODES,
    SPLIT,
    forces_split,
    resolve_topology,
    split_of,
)

SHIPPED_CONFIGS = Path(__file__).resolve().parents[1] / "configs"  # trainer/configs


@dataclass(frozen=True)
class TargetSection:
    path: str = "tiny"  # "tiny", "random:qwen3-8b", or a local Hugging Face folder
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp16 | fp32
    compile_layers: bool = True  # on CUDA: torch.compile each kept decoder layer's forward


@dataclass(frozen=True)
class DrafterSection:
    layers: int = 1
    block_size: int = 16
    target_layer_ids: list[int] | None = None  # default: evenly spaced from 1 to L-3
    mask_token_id: int | None = None  # default: resolved by trainer.spec.mask_token's rules
    intermediate_size: int | None = None  # default: the target's
    attention: str = "auto"  # auto (flex on CUDA, sdpa on CPU) | flex | sdpa
    loss_chunk: int = 2048  # rows of LM head + CE per chunk (its gradient is computed in the same pass)
    compile_loss: bool = True  # LM head + CE chunk through torch.compile (compiled once, in the warm-up)
    compile_layers: bool = True  # on CUDA: torch.compile each decoder layer (CPU runs stay eager)
    compile_mode: str = "default"  # default | max-autotune-no-cudagraphs (the layers' torch.compile mode)
    # flex_attention's kernel_options, e.g. {USE_TMA = true} (Hopper's tensor memory accelerator); the
    # keys accepted: FLEX_KERNEL_OPTIONS. Empty: torch's own choices.
    flex_kernel_options: dict[str, int | bool] = field(default_factory=dict)
    # Filled by load_config (not TOML keys): the mask token's string and the rule that chose its id.
    mask_token_text: str | None = None
    mask_token_rule: str | None = None


@dataclass(frozen=True)
class DataSection:
    kind: str = "synthetic"  # synthetic | random | jsonl | text | chat
    path: str | None = None  # a .jsonl file (jsonl/text/chat)
    seq_len: int = 128
    num_samples: int = 512  # synthetic / random only
    prompt_len: int = 8  # synthetic only: random prompt tokens (not supervised)
    temperature: float = 0.5  # synthetic only: sampling temperature of the tiny target
    # chat only: handed to the tokenizer's chat template, e.g. {enable_thinking = false}, so the data are
    # rendered the way the target will be served
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # Held-out sequences the drafters score but never train on: a share of the data (fixed by run.seed),
    # or a separate file of the same kind. Either one turns held-out evaluation on ([eval]).
    eval_fraction: float = 0.0
    eval_path: str | None = None

    @property
    def holds_out(self) -> bool:
        return self.eval_fraction > 0 or self.eval_path is not None


@dataclass(frozen=True)
class EvalSection:
    every: int = 500  # steps between held-out evaluations (0: only after the last step); needs held-out data


@dataclass(frozen=True)
class TopologySection:
    # split: N target ranks stream to M drafter ranks; colocated: every rank captures and trains;
    # auto: the launcher picks the faster that fits (trainer/spec/topology.py, dflash_doctor/launch/topology.py)
    mode: str = "auto"
    targets: int | None = None  # split only; setting targets or drafters forces a split (unset: 1)
    drafters: int | None = None
    ranks: int | None = None  # processes in all nodes together (default: every GPU the launch sees; 1 on CPU)
    in_flight: int = 4  # batches a target rank may have sent and not yet seen received
    # Colocated on CUDA: capture the next step's batch on a second stream (trainer/run/pipeline.py), beside what
    # is left of this step ("step": as soon as it is queued) or beside its optimizer update only
    # ("optimizer": the memory-bound AdamW next to the capture's matmuls). "off" until measured faster.
    overlap_capture: str = "off"


@dataclass(frozen=True)
class OptimSection:
    lr: float = 6e-4
    warmup_ratio: float = 0.04
    min_lr_ratio: float = 0.1
    schedule: str = "cosine"
    grad_clip: float = 1.0
    steps: int | None = None  # exactly one of steps / epochs
    epochs: float | None = None
    batch_size: int = 1  # sequences per drafter rank per micro-step
    grad_accum: int = (
        1  # micro-steps per optimizer step: sequences per step = batch_size x grad_accum x drafters
    )
    anchors: int = 512  # anchors per sequence per step
    gamma: float | None = None  # loss decay; default chosen by the drafter from the block size
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)


@dataclass(frozen=True)
class PrecisionSection:
    autocast: str = "auto"  # auto (bf16 on CUDA, off on CPU) | bf16 | off


@dataclass(frozen=True)
class CheckpointSection:
    every: int = 500  # steps between checkpoints (0: only at the end)
    keep: int = 3


@dataclass(frozen=True)
class OutputSection:
    dir: str = "runs/dflash"
    export_dtype: str = "bf16"  # the export's weights: bf16 (what engines serve) | fp32 (the master weights)
    tensorboard: bool = False  # event files in <dir>/tensorboard (the `tensorboard` extra)
    wandb: str | None = (
        None  # a Weights & Biases project to log to (the `wandb` extra; WANDB_MODE=offline works)
    )


@dataclass(frozen=True)
class RunSection:
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    log_every: int = 10
    timeout_s: int = 300  # process-group timeout: how long a rank waits on a silent peer


@dataclass(frozen=True)
class ProfileSection:
    # torch.profiler over steps start .. start + steps - 1 (1-based), every rank (trainer/run/profiling.py)
    start: int = 10
    steps: int = 0  # 0: off


@dataclass(frozen=True)
class TrainConfig:
    target: TargetSection = field(default_factory=TargetSection)
    drafter: DrafterSection = field(default_factory=DrafterSection)
    data: DataSection = field(default_factory=DataSection)
    eval: EvalSection = field(default_factory=EvalSection)
    topology: TopologySection = field(default_factory=TopologySection)
    optim: OptimSection = field(default_factory=OptimSection)
    precision: PrecisionSection = field(default_factory=PrecisionSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    output: OutputSection = field(default_factory=OutputSection)
    run: RunSection = field(default_factory=RunSection)
    profile: ProfileSection = field(default_factory=ProfileSection)

    @property
    def world_size(self) -> int:
        """The processes `python -m trainer` starts when not under torchrun (trainer/spec/topology.py)."""
        return resolve_topology(self.topology).world_size

    @property
    def output_dir(self) -> Path:
        return Path(self.output.dir)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _section_dict(getattr(self, f.name)) for f in fields(self)}


def _section_dict(section: Any) -> dict[str, Any]:
    out = {}
    for f in fields(section):
        value = getattr(section, f.name)
        if isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, dict):
            value = dict(value)  # a copy: the section is frozen, its table must not change through this
        out[f.name] = value
    return out


# ---------------------------------------------------------------- field parsers: (name, value) -> value

Parser = Callable[[str, Any], Any]


def _shown(value: Any) -> str:
    try:
        return json.dumps(value)
    except TypeError:
        return repr(value)


def _fail(name: str, expected: str, value: Any) -> ConfigError:
    return ConfigError(f"{name}: must be {expected}, got {_shown(value)}")


def integer(minimum: int | None = None, maximum: int | None = None) -> Parser:
    expected = "an integer" + (f" >= {minimum}" if minimum is not None else "")
    expected += f" <= {maximum}" if maximum is not None else ""

    def parse(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(name, expected, value)
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise _fail(name, expected, value)
        return value

    return parse


def number(minimum: float | None = None, maximum: float | None = None, above: float | None = None) -> Parser:
    parts = ["a number"]
    if above is not None:
        parts.append(f"> {above}")
    if minimum is not None:
        parts.append(f">= {minimum}")
    if maximum is not None:
        parts.append(f"<= {maximum}")
    expected = " ".join(parts)

    def parse(name: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise _fail(name, expected, value)
        too_low = (minimum is not None and value < minimum) or (above is not None and value <= above)
        if too_low or (maximum is not None and value > maximum):
            raise _fail(name, expected, value)
        return float(value)

    return parse


def choice(*options: str) -> Parser:
    expected = "one of " + ", ".join(f'"{o}"' for o in options)

    def parse(name: str, value: Any) -> str:
        if value not in options:
            raise _fail(name, expected, value)
        return value

    return parse


def boolean() -> Parser:
    def parse(name: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise _fail(name, "true or false", value)
        return value

    return parse


def text() -> Parser:
    def parse(name: str, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise _fail(name, "a non-empty string", value)
        return value

    return parse


def int_list(minimum: int = 0) -> Parser:
    expected = f"a non-empty list of distinct integers >= {minimum}"

    def parse(name: str, value: Any) -> list[int]:
        if not isinstance(value, list) or not value:
            raise _fail(name, expected, value)
        if any(isinstance(v, bool) or not isinstance(v, int) or v < minimum for v in value):
            raise _fail(name, expected, value)
        if len(set(value)) != len(value):  # only now: a list of lists is unhashable
            raise _fail(name, expected, value)
        return list(value)

    return parse


def betas() -> Parser:
    expected = "two numbers in [0, 1), like [0.9, 0.95]"

    def parse(name: str, value: Any) -> tuple[float, float]:
        if not isinstance(value, list) or len(value) != 2:
            raise _fail(name, expected, value)
        if any(isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 1 for v in value):
            raise _fail(name, expected, value)
        return (float(value[0]), float(value[1]))

    return parse


def power_of_two(minimum: int, maximum: int) -> Parser:
    expected = f"a power of two from {minimum} to {maximum}"

    def parse(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(name, expected, value)
        if not minimum <= value <= maximum or value & (value - 1):
            raise _fail(name, expected, value)
        return value

    return parse


def int_choice(*options: int) -> Parser:
    expected = "one of " + ", ".join(str(o) for o in options)

    def parse(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value not in options:
            raise _fail(name, expected, value)
        return value

    return parse


def table() -> Parser:
    """A TOML table of plain values (strings, numbers, booleans, lists), e.g. {enable_thinking = false}."""
    expected = "a table of plain values, like {enable_thinking = false}"

    def parse(name: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict) or any(isinstance(v, dict) for v in value.values()):
            raise _fail(name, expected, value)
        return dict(value)

    return parse


# flex_attention's kernel_options that a config may set (torch.nn.attention.flex_attention.FlexKernelOptions).
# A `fwd_`/`bwd_` prefix applies an option to the forward/backward kernel only (torch strips the prefix
# there); the backward kernel has two block pairs (M1/N1: the dK/dV loop, M2/N2: the dQ loop).
_FLAG = boolean()
_BLOCK = power_of_two(16, 128)
_WARPS = int_choice(1, 2, 4, 8, 16)
_STAGES = integer(1, 8)
FLEX_KERNEL_OPTIONS: dict[str, Parser] = {
    "USE_TMA": _FLAG,
    "PRESCALE_QK": _FLAG,
    "BLOCKS_ARE_CONTIGUOUS": _FLAG,
    "BLOCK_M": _BLOCK,
    "BLOCK_N": _BLOCK,
    "num_warps": _WARPS,
    "num_stages": _STAGES,
    "fwd_USE_TMA": _FLAG,
    "fwd_BLOCK_M": _BLOCK,
    "fwd_BLOCK_N": _BLOCK,
    "fwd_num_warps": _WARPS,
    "fwd_num_stages": _STAGES,
    "bwd_USE_TMA": _FLAG,
    "bwd_BLOCK_M1": _BLOCK,
    "bwd_BLOCK_N1": _BLOCK,
    "bwd_BLOCK_M2": _BLOCK,
    "bwd_BLOCK_N2": _BLOCK,
    "bwd_num_warps": _WARPS,
    "bwd_num_stages": _STAGES,
}
# Real kernel options refused on purpose, with the reason.
REFUSED_KERNEL_OPTIONS = {
    "ROWS_GUARANTEED_SAFE": (
        "it made flex return NaN with the DFlash block mask on an H200 (bench/kernels/flex_sweep.py, seed-b32, row "
        "'rows safe'), for a 0.3% gain; remove it"
    ),
}


def kernel_options() -> Parser:
    """A table of flex_attention kernel options: known keys only, each value checked by its own rule."""
    parsers = FLEX_KERNEL_OPTIONS
    expected = "a table of flex_attention kernel options, like {USE_TMA = true, BLOCK_M = 64}"

    def parse(name: str, value: Any) -> dict[str, int | bool]:
        if not isinstance(value, dict):
            raise _fail(name, expected, value)
        refused = [key for key in value if key in REFUSED_KERNEL_OPTIONS]
        if refused:
            raise ConfigError(f"{name}.{refused[0]}: refused: {REFUSED_KERNEL_OPTIONS[refused[0]]}")
        unknown = [key for key in value if key not in parsers]
        if unknown:
            raise ConfigError(
                f"{name}: must be {expected}, got {_shown(value)}: unknown option {_shown(unknown[0])} "
                f"(known: {', '.join(parsers)}); remove it or correct its spelling"
            )
        return {key: parsers[key](f"{name}.{key}", v) for key, v in value.items()}

    return parse


# Keys that existed once: a config that still sets one gets this hint instead of "unknown key".
REMOVED_KEYS = {
    "drafter.flex_tma": (
        "removed; write drafter.flex_kernel_options = {USE_TMA = true} instead of flex_tma = true "
        "(flex_tma = false: delete the line)"
    ),
}


# More ranks of one role than any machine room holds: a typo (`drafters=100000`) is refused at once instead
# of planning and printing 100000 ranks (issue 18, row 14). 512 nodes of 8 GPUs.
MAX_RANKS_PER_ROLE = 4096

SCHEMA: dict[str, tuple[type, dict[str, Parser]]] = {
    "target": (
        TargetSection,
        {
            "path": text(),
            "dtype": choice("auto", "bf16", "fp16", "fp32"),
            "compile_layers": boolean(),
        },
    ),
    "drafter": (
        DrafterSection,
        {
            "layers": integer(1),
            "block_size": integer(2),
            "target_layer_ids": int_list(0),
            "mask_token_id": integer(0),
            "intermediate_size": integer(1),
            "attention": choice("auto", "flex", "sdpa"),
            "loss_chunk": integer(1),
            "compile_loss": boolean(),
            "compile_layers": boolean(),
            "compile_mode": choice("default", "max-autotune-no-cudagraphs"),
            "flex_kernel_options": kernel_options(),
        },
    ),
    "data": (
        DataSection,
        {
            "kind": choice("synthetic", "random", "jsonl", "text", "chat"),
            "path": text(),
            "seq_len": integer(3),
            "num_samples": integer(1),
            "prompt_len": integer(1),
            "temperature": number(above=0.0),
            "chat_template_kwargs": table(),
            "eval_fraction": number(0.0, 0.5),
            "eval_path": text(),
        },
    ),
    "eval": (EvalSection, {"every": integer(0)}),
    "topology": (
        TopologySection,
        {
            "mode": choice(*MODES),
            "targets": integer(1, MAX_RANKS_PER_ROLE),
            "drafters": integer(1, MAX_RANKS_PER_ROLE),
            "ranks": integer(1, MAX_RANKS_PER_ROLE),
            "in_flight": integer(1),
            "overlap_capture": choice(*OVERLAP_MODES),
        },
    ),
    "optim": (
        OptimSection,
        {
            "lr": number(above=0.0),
            "warmup_ratio": number(0.0, 1.0),
            "min_lr_ratio": number(0.0, 1.0),
            "schedule": choice("cosine"),
            "grad_clip": number(above=0.0),
            "steps": integer(1),
            "epochs": number(above=0.0),
            "batch_size": integer(1),
            "grad_accum": integer(1),
            "anchors": integer(1),
            "gamma": number(above=0.0),
            "weight_decay": number(0.0),
            "betas": betas(),
        },
    ),
    "precision": (PrecisionSection, {"autocast": choice("auto", "bf16", "off")}),
    "checkpoint": (CheckpointSection, {"every": integer(0), "keep": integer(1)}),
    "output": (
        OutputSection,
        {"dir": text(), "export_dtype": choice("bf16", "fp32"), "tensorboard": boolean(), "wandb": text()},
    ),
    "run": (
        RunSection,
        {
            "seed": integer(0),
            "device": choice("auto", "cpu", "cuda"),
            "log_every": integer(1),
            "timeout_s": integer(1),
        },
    ),
    "profile": (ProfileSection, {"start": integer(1), "steps": integer(0)}),
}


def parse_config(raw: dict[str, Any]) -> TrainConfig:
    """Validate a parsed TOML document field by field (no target lookup yet)."""
    sections: dict[str, Any] = {}
    for section_name, body in raw.items():
        if section_name not in SCHEMA:
            known = ", ".join(f"[{s}]" for s in SCHEMA)
            raise ConfigError(f"{section_name}: unknown section (known: {known})")
        if not isinstance(body, dict):
            raise ConfigError(f"{section_name}: must be a table ([{section_name}]), got {_shown(body)}")
        cls, parsers = SCHEMA[section_name]
        values = {}
        for key, value in body.items():
            name = f"{section_name}.{key}"
            if name in REMOVED_KEYS:
                raise ConfigError(f"{name}: {REMOVED_KEYS[name]}")
            if key not in parsers:
                raise ConfigError(f"{name}: unknown key (known: {', '.join(parsers)})")
            values[key] = parsers[key](name, value)
        sections[section_name] = cls(**values)
    cfg = TrainConfig(**sections)
    _check_relations(cfg)
    return cfg


def _check_relations(cfg: TrainConfig) -> None:
    """Rules that tie several fields together."""
    o, d = cfg.optim, cfg.data
    if cfg.output.tensorboard:
        require_extra("tensorboard", "output.tensorboard")
    if cfg.output.wandb:
        require_extra("wandb", "output.wandb")
    if (o.steps is None) == (o.epochs is None):
        raise ConfigError("optim.steps: set exactly one of optim.steps and optim.epochs")
    p = cfg.profile
    if p.steps and o.steps is not None and p.start + p.steps - 1 > o.steps:
        raise ConfigError(
            f"profile.start: steps {p.start}-{p.start + p.steps - 1} do not all run (optim.steps = {o.steps}); "
            "profile earlier steps or fewer"
        )
    if d.kind in ("jsonl", "text", "chat") and d.path is None:
        raise ConfigError(f'data.path: required when data.kind = "{d.kind}"')
    if d.kind == "synthetic" and cfg.target.path != "tiny":
        raise ConfigError(
            'data.kind: "synthetic" needs target.path = "tiny" (the tiny target writes the data)'
        )
    if d.kind in ("text", "chat") and is_embedded(cfg.target.path):
        raise ConfigError(f'data.kind: "{d.kind}" needs a target folder with a tokenizer (target.path)')
    if d.seq_len <= cfg.drafter.block_size:
        raise ConfigError(
            f"data.seq_len: must be > drafter.block_size ({cfg.drafter.block_size}), got {d.seq_len}"
        )
    if d.kind in ("synthetic", "random") and d.prompt_len >= d.seq_len:
        raise ConfigError(f"data.prompt_len: must be < data.seq_len ({d.seq_len}), got {d.prompt_len}")
    if d.eval_fraction > 0 and d.eval_path is not None:
        raise ConfigError("data.eval_path: set data.eval_fraction or data.eval_path, not both")
    if d.eval_path is not None and d.kind not in ("jsonl", "text", "chat"):
        raise ConfigError(f'data.eval_path: needs data.kind "jsonl", "text" or "chat", got "{d.kind}"')
    if d.chat_template_kwargs and d.kind != "chat":
        raise ConfigError(f'data.chat_template_kwargs: only for data.kind = "chat", got "{d.kind}"')
    _check_topology(cfg.topology)
    ids = cfg.drafter.target_layer_ids
    if ids is not None and ids != sorted(ids):
        raise ConfigError(f"drafter.target_layer_ids: must be increasing, got {_shown(ids)}")


def _check_topology(t: TopologySection) -> None:
    if t.mode == COLOCATED and forces_split(t):
        key = "targets" if t.targets is not None else "drafters"
        raise ConfigError(
            f'topology.{key}: sets a split, but topology.mode = "colocated" (every rank holds both roles); '
            f'remove topology.{key}, or set topology.mode = "split"'
        )
    if t.ranks is not None and (t.mode == SPLIT or forces_split(t)):
        split = split_of(t)
        if t.ranks != split.world_size:
            raise ConfigError(
                f"topology.ranks: {t.ranks}, but the split {split.targets} + {split.drafters} is "
                f"{split.world_size} ranks; remove topology.ranks or make them agree"
            )


# ---------------------------------------------------------------- target-dependent defaults


def complete_with_target(cfg: TrainConfig, target_config: Any) -> TrainConfig:
    """Fill in the defaults that depend on the target and check the fields that must fit it."""
    num_layers = int(target_config.num_hidden_layers)
    vocab = int(target_config.vocab_size)
    dr = cfg.drafter
    ids = dr.target_layer_ids
    if ids is None:
        if num_layers < 4:
            raise ConfigError(
                f"drafter.target_layer_ids: the target has {num_layers} layers, too few for the default spacing; "
                "set the ids"
            )
        ids = default_target_layer_ids(num_layers, dr.layers)
    elif max(ids) >= num_layers - 1:
        raise ConfigError(
            f"drafter.target_layer_ids: must be <= {num_layers - 2} (L-2 of the target's {num_layers} layers), "
            f"got {_shown(ids)}: the engines capture layer L-1 after the final norm (hidden_states[L]) where "
            "training captures it before, and SGLang's capture loop never reaches it"
        )
    mask = resolve_mask_token(
        cfg.target.path,
        str(getattr(target_config, "model_type", "")),
        vocab,
        dr.mask_token_id,
        is_embedded(cfg.target.path),
    )
    max_pos = int(getattr(target_config, "max_position_embeddings", 1 << 30))
    if cfg.data.seq_len > max_pos:
        raise ConfigError(
            f"data.seq_len: must be <= the target's max_position_embeddings {max_pos}, got {cfg.data.seq_len}"
        )
    drafter = replace(
        dr, target_layer_ids=ids, mask_token_id=mask.id, mask_token_text=mask.text, mask_token_rule=mask.rule
    )
    return replace(cfg, drafter=drafter)


# ---------------------------------------------------------------- loading


def resolve_config_path(name_or_path: str | Path) -> Path:
    """A path to a TOML file, or the name of a shipped config (`tiny-cpu` or `tiny-cpu.toml`).

    Only a bare name falls back to the shipped configs: `some/dir/tiny-cpu.toml` that does not exist is
    an error, never silently the shipped `tiny-cpu` (issue 18, row 3).
    """
    path = Path(name_or_path)
    if path.is_file():
        return path
    names = ", ".join(sorted(p.stem for p in SHIPPED_CONFIGS.glob("*.toml")))
    if path.exists():
        raise ConfigError(f"config: {str(name_or_path)!r} is not a file", hint="give a TOML file")
    if len(path.parts) != 1:
        raise ConfigError(
            f"config: no such file {str(name_or_path)!r}",
            hint=f"check the path; a shipped config is named without a folder ({names})",
        )
    shipped = SHIPPED_CONFIGS / f"{path.name.removesuffix('.toml')}.toml"
    if shipped.is_file():
        return shipped
    raise ConfigError(
        f"config: no file {str(name_or_path)!r} and no shipped config of that name (shipped: {names})"
    )


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`section.key=value` strings (value in TOML syntax, bare words taken as strings) on top of the file."""
    for item in overrides:
        dotted, sep, value_text = item.partition("=")
        section, dot, key = dotted.strip().partition(".")
        if not sep or not dot or not section or not key:
            raise ConfigError(f"--set {item}: must look like section.key=value")
        try:
            value = tomllib.loads(f"v = {value_text.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = value_text.strip()
        body = raw.setdefault(section, {})
        if not isinstance(body, dict):
            raise ConfigError(f"{section}: must be a table ([{section}]), got {_shown(body)}")
        body[key] = value
    return raw


def config_to_toml(raw: dict[str, Any]) -> str:
    """A raw config (sections of scalars, lists and inline tables) as TOML text that `read_raw` reads back.
    The launcher and the benches write configs with overrides applied; tomllib only reads TOML."""
    lines = []
    for section, body in raw.items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in body.items())
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    """JSON's scalars and lists are valid TOML; a table (drafter.flex_kernel_options) needs `key = value`."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)


def read_raw(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_bytes().decode("utf-8-sig"))  # a BOM (Windows editors) is fine
    except OSError as exc:
        raise ConfigError(f"config: cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config: {path} is not UTF-8 text (byte {exc.start}: {exc.reason})",
            hint="TOML files are UTF-8; save it as UTF-8",
        ) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config: {path} is not valid TOML: {exc}") from exc


def load_config(
    name_or_path: str | Path, overrides: list[str] | None = None, check_data: bool = True
) -> TrainConfig:
    """Read, validate, and complete a config. Raises ConfigError naming the field; starts nothing.
    `check_data=False` for commands that make the data file rather than read it (`data regenerate`)."""
    raw = apply_overrides(read_raw(resolve_config_path(name_or_path)), overrides or [])
    cfg = parse_config(raw)
    if cfg.output_dir.exists() and not cfg.output_dir.is_dir():
        raise ConfigError(
            f"output.dir: {cfg.output.dir} exists and is not a folder",
            hint="choose a folder for the run's output",
        )
    shapes = target_shapes(cfg.target.path)
    completed = complete_with_target(cfg, shapes)
    if check_data and cfg.data.path is not None:
        check_data_file(cfg.data.kind, cfg.data.path, vocab_size=int(shapes.vocab_size))
    if check_data and cfg.data.eval_path is not None:
        check_data_file(cfg.data.kind, cfg.data.eval_path, int(shapes.vocab_size), field="data.eval_path")
    if check_data:
        heldout_sequences(completed)  # ConfigError: fewer than one batch held out
    return completed


def num_sequences(cfg: TrainConfig) -> int:
    """How many sequences the training data holds, cheaply (every rank plans the run from it)."""
    if cfg.data.kind in ("synthetic", "random"):
        return cfg.data.num_samples
    return count_records(str(cfg.data.path))


def heldout_sequences(cfg: TrainConfig, total: int | None = None) -> int:
    """How many sequences held-out evaluation scores (0: none held out), given the training data's `total`
    (counted when not given). Counts only, no torch. Raises ConfigError when the share is smaller than one
    batch: held-out scoring runs whole batches, so it would score nothing (the launch refuses that before
    any worker starts)."""
    d = cfg.data
    if d.eval_path is not None:
        held = count_records(d.eval_path, "data.eval_path")
        where = f"data.eval_path: {d.eval_path} holds {held} records"
    elif d.eval_fraction > 0:
        total = num_sequences(cfg) if total is None else total
        held = max(1, round(total * d.eval_fraction))
        where = f"data.eval_fraction: holds out {held} of {total} sequences"
    else:
        return 0
    if held < cfg.optim.batch_size:
        raise ConfigError(
            f"{where}, fewer than one batch of optim.batch_size = {cfg.optim.batch_size}",
            hint="hold out more (data.eval_fraction, data.eval_path) or lower optim.batch_size",
        )
    return held
