"""The run config: TOML -> nested dataclasses, validated before any process group starts.

Every error names the field (`drafter.block_size: must be an integer >= 2, got "sixteen"`) and raises
`ConfigError` (exit code 2). Unknown sections and keys are errors too: a typo must not pass silently.
Defaults that depend on the target (layer ids, mask token id) are filled in by `load_config` once the
target's shape is known.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from dflash_base.errors import ConfigError
from trainer.runspec.config_file import apply_overrides, read_raw, resolve_config_path
from trainer.runspec.data_files import check_data_file, count_records
from trainer.runspec.eval_request import check_eval_prompts
from trainer.runspec.extras import require_extra
from trainer.runspec.fields import (
    BOOKKEEPING,
    GRAPH,
    STEP_TIME,
    Parser,
    _shown,
    betas,
    boolean,
    choice,
    int_list,
    integer,
    integer_or_auto,
    kernel_options,
    number,
    option,
    rules_of,
    table,
    text,
)
from trainer.runspec.mask_token import resolve_mask_token
from trainer.runspec.target_shapes import default_target_layer_ids, is_embedded, target_shapes
from trainer.runspec.topology import (
    COLOCATED,
    LAUNCHERS,
    MODES,
    NODE,
    OVERLAP_MODES,
    PLACEMENTS,
    SPLIT,
    forces_split,
    resolve_topology,
    split_of,
)

# More ranks of one role than any machine room holds: a typo (`drafters=100000`) is refused at once instead
# of planning and printing 100000 ranks (issue 18, row 14). 512 nodes of 8 GPUs.
MAX_RANKS_PER_ROLE = 4096

# More data workers than any host gives a rank: a typo (`workers = 400`) is refused at once.
MAX_DATA_WORKERS = 64

# Each field is declared once: its type, its default, the rule a TOML value must pass and what changing it
# changes (`option(..., effect=...)`: GRAPH, STEP_TIME or BOOKKEEPING; trainer.runspec.field_effects derives
# from them what keys the warm-up's record and which `--set`s keep a measured step time). A field not shown to
# leave the compiled graphs alone counts as GRAPH: a warm-up skipped wrongly leaves every worker to compile cold.


@dataclass(frozen=True)
class TargetSection:
    # "tiny", "random:qwen3-8b", or a local Hugging Face folder
    path: str = option("tiny", text(), effect=GRAPH)
    # auto: bf16 on CUDA, fp32 on CPU
    dtype: str = option("auto", choice("auto", "bf16", "fp16", "fp32"), effect=GRAPH)
    # on CUDA: torch.compile each kept decoder layer's forward
    compile_layers: bool = option(True, boolean(), effect=GRAPH)


@dataclass(frozen=True)
class DrafterSection:
    layers: int = option(1, integer(1), effect=GRAPH)
    block_size: int = option(16, integer(2), effect=GRAPH)
    # default: evenly spaced from 1 to L-3
    target_layer_ids: list[int] | None = option(None, int_list(0), effect=GRAPH)
    # default: resolved by trainer.runspec.mask_token's rules
    mask_token_id: int | None = option(None, integer(0), effect=GRAPH)
    intermediate_size: int | None = option(None, integer(1), effect=GRAPH)  # default: the target's
    # auto: flex on CUDA, sdpa on CPU
    attention: str = option("auto", choice("auto", "flex", "sdpa"), effect=GRAPH)
    # rows of LM head + CE per chunk (its gradient is computed in the same pass)
    loss_chunk: int = option(2048, integer(1), effect=GRAPH)
    # LM head + CE chunk through torch.compile (in the warm-up)
    compile_loss: bool = option(True, boolean(), effect=GRAPH)
    # on CUDA: torch.compile each decoder layer (CPU: eager)
    compile_layers: bool = option(True, boolean(), effect=GRAPH)
    # the layers' torch.compile mode
    compile_mode: str = option("default", choice("default", "max-autotune-no-cudagraphs"), effect=GRAPH)
    # flex_attention's kernel_options, e.g. {USE_TMA = true} (Hopper's tensor memory accelerator); the
    # keys accepted: FLEX_KERNEL_OPTIONS. Empty: torch's own choices.
    flex_kernel_options: dict[str, int | bool] = option(factory=dict, parse=kernel_options(), effect=GRAPH)
    # Filled by load_config (not TOML keys): the mask token's string and the rule that chose its id.
    mask_token_text: str | None = None
    mask_token_rule: str | None = None


@dataclass(frozen=True)
class DataSection:
    # GRAPH but `workers`: the held-out ones decide whether the eval-mode graph is compiled; the others are not
    # known to leave the graphs alone, and the warm-up's record has always keyed on them
    kind: str = option("synthetic", choice("synthetic", "random", "jsonl", "text", "chat"), effect=GRAPH)
    path: str | None = option(None, text(), effect=GRAPH)  # a .jsonl file (jsonl/text/chat)
    seq_len: int = option(128, integer(3), effect=GRAPH)
    num_samples: int = option(512, integer(1), effect=GRAPH)  # synthetic / random only
    # synthetic only: random prompt tokens (not supervised)
    prompt_len: int = option(8, integer(1), effect=GRAPH)
    # synthetic only: sampling temperature of the tiny target
    temperature: float = option(0.5, number(above=0.0), effect=GRAPH)
    # chat only: handed to the tokenizer's chat template, e.g. {enable_thinking = false}, so the data are
    # rendered the way the target will be served
    chat_template_kwargs: dict[str, Any] = option(factory=dict, parse=table(), effect=GRAPH)
    # chat only: an answer that ends in a repetition loop is trained on whole ("keep": the target wrote it),
    # up to its loop's first period ("cut") or not at all ("drop"); trainer/data/answer_ends.py
    loops: str = option("keep", choice("keep", "cut", "drop"), effect=GRAPH)
    # Held-out sequences the drafters score but never train on: a share of the data (fixed by run.seed),
    # or a separate file of the same kind. Either one turns held-out evaluation on ([eval]).
    eval_fraction: float = option(0.0, number(0.0, 0.5), effect=GRAPH)
    eval_path: str | None = option(None, text(), effect=GRAPH)
    # text/chat only: processes that make first-epoch sequences ahead of the training thread
    # (trainer/data/prefetch.py). "auto": 0 on CPU (the cores train there), else min(4, usable cores / ranks on
    # this host - 1)
    workers: int | str = option("auto", integer_or_auto(0, MAX_DATA_WORKERS), effect=STEP_TIME)

    @property
    def holds_out(self) -> bool:
        return self.eval_fraction > 0 or self.eval_path is not None


@dataclass(frozen=True)
class EvalSection:
    # steps between held-out evaluations (0: only after the last step); needs held-out data
    every: int = option(500, integer(0), effect=BOOKKEEPING)
    # The drafter's floor: once the run succeeded, `train` decodes the export with `eval` on this prompts file
    # (what `eval --prompts` reads) at `max_new_tokens`, records tau beside prompt lookup's, and fails the run
    # (exit 1, the export kept) when tau is below `min_tau` (0: decode and record only)
    prompts: str | None = option(None, text(), effect=BOOKKEEPING)
    min_tau: float = option(0.0, number(0.0), effect=BOOKKEEPING)
    max_new_tokens: int = option(128, integer(1), effect=BOOKKEEPING)


@dataclass(frozen=True)
class TopologySection:
    # split: N target ranks stream to M drafter ranks; colocated: every rank captures and trains;
    # auto: the launcher picks the faster that fits (trainer/runspec/topology.py, dflash_doctor/launch/topology.py)
    mode: str = option("auto", choice(*MODES), effect=GRAPH)
    # split only; setting targets or drafters forces a split (unset: 1). With several nodes: each node's
    # (placement "node", the default) or the whole run's (placement "world")
    targets: int | None = option(None, integer(1, MAX_RANKS_PER_ROLE), effect=GRAPH)
    drafters: int | None = option(None, integer(1, MAX_RANKS_PER_ROLE), effect=GRAPH)
    # a split over several nodes: "node" = every node runs its own targets and drafters and hidden states stay
    # on it (only the drafters' gradient all-reduce crosses the network); "world" = one list over all nodes
    # (ranks [0, N) targets, [N, N+M) drafters), for nodes too small to hold both roles: batches cross nodes
    placement: str = option(NODE, choice(*PLACEMENTS), effect=STEP_TIME)
    # processes in all nodes together (default: every GPU the launch sees; 1 on CPU)
    ranks: int | None = option(None, integer(1, MAX_RANKS_PER_ROLE), effect=GRAPH)
    # batches a target rank may have sent and not yet seen received
    in_flight: int = option(4, integer(1), effect=GRAPH)
    # Colocated on CUDA: capture the next step's batch on a second stream (trainer/run/pipeline.py), beside what
    # is left of this step ("step": as soon as it is queued) or beside its optimizer update only
    # ("optimizer": the memory-bound AdamW next to the capture's matmuls). "auto": "step" on CUDA (measured
    # faster: BENCHMARKS.md), "off" on CPU (trainer.runspec.topology.overlap_mode).
    overlap_capture: str = option("auto", choice(*OVERLAP_MODES), effect=STEP_TIME)
    # "auto": one process in all (one node, world size 1) starts without torchrun; "torchrun": always torchrun
    launcher: str = option("auto", choice(*LAUNCHERS), effect=GRAPH)


@dataclass(frozen=True)
class OptimSection:
    lr: float = option(6e-4, number(above=0.0), effect=BOOKKEEPING)
    warmup_ratio: float = option(0.04, number(0.0, 1.0), effect=BOOKKEEPING)
    min_lr_ratio: float = option(0.1, number(0.0, 1.0), effect=BOOKKEEPING)
    schedule: str = option("cosine", choice("cosine"), effect=BOOKKEEPING)
    grad_clip: float = option(1.0, number(above=0.0), effect=STEP_TIME)
    steps: int | None = option(None, integer(1), effect=BOOKKEEPING)  # exactly one of steps / epochs
    epochs: float | None = option(None, number(above=0.0), effect=BOOKKEEPING)
    batch_size: int = option(1, integer(1), effect=GRAPH)  # sequences per drafter rank per micro-step
    # micro-steps per optimizer step: sequences per step = batch_size x grad_accum x drafters
    grad_accum: int = option(1, integer(1), effect=STEP_TIME)
    anchors: int = option(512, integer(1), effect=GRAPH)  # anchors per sequence per step
    # loss decay; default chosen by the drafter from the block size
    gamma: float | None = option(None, number(above=0.0), effect=GRAPH)
    weight_decay: float = option(0.0, number(0.0), effect=STEP_TIME)
    betas: tuple[float, float] = option((0.9, 0.95), betas(), effect=STEP_TIME)


@dataclass(frozen=True)
class PrecisionSection:
    # auto: bf16 on CUDA, off on CPU
    autocast: str = option("auto", choice("auto", "bf16", "off"), effect=GRAPH)


@dataclass(frozen=True)
class CheckpointSection:
    every: int = option(500, integer(0), effect=BOOKKEEPING)  # steps between checkpoints (0: only at the end)
    keep: int = option(3, integer(1), effect=BOOKKEEPING)


@dataclass(frozen=True)
class OutputSection:
    dir: str = option("runs/dflash", text(), effect=BOOKKEEPING)
    # the export's weights: bf16 (what engines serve) | fp32 (the master weights)
    export_dtype: str = option("bf16", choice("bf16", "fp32"), effect=BOOKKEEPING)
    # event files in <dir>/tensorboard (the `tensorboard` extra)
    tensorboard: bool = option(False, boolean(), effect=BOOKKEEPING)
    # a Weights & Biases project to log to (the `wandb` extra; WANDB_MODE=offline works)
    wandb: str | None = option(None, text(), effect=BOOKKEEPING)


@dataclass(frozen=True)
class RunSection:
    seed: int = option(0, integer(0), effect=BOOKKEEPING)  # values (init, data order), never shapes
    device: str = option("auto", choice("auto", "cpu", "cuda"), effect=GRAPH)
    log_every: int = option(10, integer(1), effect=BOOKKEEPING)
    # process-group timeout: how long a rank waits on a silent peer
    timeout_s: int = option(300, integer(1), effect=BOOKKEEPING)


@dataclass(frozen=True)
class ProfileSection:
    # torch.profiler over steps start .. start + steps - 1 (1-based), every rank (trainer/run/profiling.py)
    start: int = option(10, integer(1), effect=BOOKKEEPING)
    steps: int = option(0, integer(0), effect=BOOKKEEPING)  # 0: off


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
        """The processes `python -m trainer` starts when not under torchrun (trainer/runspec/topology.py)."""
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


# Keys that existed once: a config that still sets one gets this hint instead of "unknown key".
REMOVED_KEYS = {
    "drafter.flex_tma": (
        "removed; write drafter.flex_kernel_options = {USE_TMA = true} instead of flex_tma = true "
        "(flex_tma = false: delete the line)"
    ),
}

# The sections and their keys, derived from the dataclasses above: {section: (class, {key: rule})}.
SCHEMA: dict[str, tuple[type, dict[str, Parser]]] = {
    f.name: (f.default_factory, rules_of(fields(f.default_factory)))  # type: ignore[misc, arg-type]
    for f in fields(TrainConfig)
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
    if cfg.eval.min_tau > 0 and cfg.eval.prompts is None:
        raise ConfigError(
            f"eval.min_tau: a floor of {cfg.eval.min_tau:g} needs eval.prompts, the prompts the export is decoded on",
            hint='e.g. prompts = "runs/smollm2-135m/prompts/humaneval.jsonl" in [eval]',
        )
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
    if d.loops != "keep" and d.kind != "chat":
        raise ConfigError(f'data.loops: only for data.kind = "chat", got "{d.kind}"')
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


def load_config(
    name_or_path: str | Path,
    overrides: list[str] | None = None,
    check_data: bool = True,
    drafter: bool = True,
    split: bool = True,
) -> TrainConfig:
    """Read, validate, and complete a config. Raises ConfigError naming the field; starts nothing.
    `check_data=False` for commands that make the data file rather than read it (`data regenerate`);
    `drafter=False` for those that use the target alone (`data regenerate` generates with it): the drafter's
    defaults that depend on the target (its mask token, its layer ids) are left unresolved. `split=False`
    for those that read the data file but not the training split (`data preview`): the held-out and step
    rules, which are about the split, are left to the commands that use it."""
    raw = apply_overrides(read_raw(resolve_config_path(name_or_path)), overrides or [])
    cfg = parse_config(raw)
    if cfg.output_dir.exists() and not cfg.output_dir.is_dir():
        raise ConfigError(
            f"output.dir: {cfg.output.dir} exists and is not a folder",
            hint="choose a folder for the run's output",
        )
    shapes = target_shapes(cfg.target.path)
    completed = complete_with_target(cfg, shapes) if drafter else cfg
    if check_data and cfg.data.path is not None:
        kwargs = dict(cfg.data.chat_template_kwargs)
        check_data_file(cfg.data.kind, cfg.data.path, int(shapes.vocab_size), template_kwargs=kwargs)
    if check_data and cfg.data.eval_path is not None:
        check_data_file(
            cfg.data.kind,
            cfg.data.eval_path,
            int(shapes.vocab_size),
            field="data.eval_path",
            template_kwargs=dict(cfg.data.chat_template_kwargs),
        )
    if check_data and cfg.eval.prompts is not None:  # the floor's prompts, before any process starts
        check_eval_prompts(cfg.eval.prompts, int(shapes.vocab_size), field="eval.prompts")
    if check_data and split:
        total = num_sequences(completed)
        held = heldout_sequences(completed, total)
        check_step_fits(completed, total if cfg.data.eval_path is not None else total - held)
    return completed


def check_step_fits(cfg: TrainConfig, training: int) -> None:
    """One optimizer step takes optim.batch_size x optim.grad_accum sequences on each drafter: a step larger
    than the whole training split is a typo (grad_accum = 100000000: 800M sequences of a 461-sequence split),
    refused before it is planned."""
    o = cfg.optim
    step = o.batch_size * o.grad_accum
    if step <= training:
        return
    field = "optim.grad_accum" if o.grad_accum > 1 else "optim.batch_size"
    raise ConfigError(
        f"{field}: one step is optim.batch_size {o.batch_size} x optim.grad_accum {o.grad_accum} = {step:,} "
        f"sequences on each drafter, more than the {training:,} of the training split",
        hint="lower optim.grad_accum (or optim.batch_size): one step should be a small share of the data",
    )


def num_sequences(cfg: TrainConfig) -> int:
    """How many sequences the training data holds, cheaply (every rank plans the run from it)."""
    if cfg.data.kind in ("synthetic", "random"):
        return cfg.data.num_samples
    return count_records(str(cfg.data.path))


def heldout_sequences(cfg: TrainConfig, total: int | None = None) -> int:
    """How many sequences held-out evaluation scores (0: none held out), given the training data's `total`
    (counted when not given). Counts only, no torch. A share smaller than one batch is scored too: the last
    held-out batch is padded to the compiled shape with unsupervised rows (issue 38, D8)."""
    d = cfg.data
    if d.eval_path is not None:
        return count_records(d.eval_path, "data.eval_path")
    if d.eval_fraction > 0:
        total = num_sequences(cfg) if total is None else total
        return max(1, round(total * d.eval_fraction))
    return 0
