"""Export the drafter as a Hugging Face-style folder that SGLang and vLLM DFlash loaders read, and load it back.

The folder holds `config.json` and `model.safetensors`:
- config.json: `architectures: ["DFlashDraftModel"]`, `model_type: "qwen3"`, the usual Qwen3 size fields,
  `block_size`, `num_target_layers` and `dflash_config: {mask_token_id, target_layer_ids}`;
- model.safetensors: the drafter's own weights under the names the engines' `load_weights` map
  (`layers.{i}.self_attn.{q,k,v,o}_proj.weight`, `...q_norm/k_norm`, `layers.{i}.mlp.{gate,up,down}_proj`,
  `layers.{i}.input_layernorm`, `...post_attention_layernorm`, `fc.weight`, `hidden_norm.weight`,
  `norm.weight`), no `model.` prefix. The embedding and LM head are the target's and are not exported:
  SGLang's DFlashDraftModel has neither; vLLM's loader skips `embed_tokens` when absent and shares the
  target's.

Weights are bf16 by default (what the engines serve in; SGLang's `dtype="auto"` would turn fp32 into fp16,
a dtype the drafter never trained in); `dtype=torch.float32` keeps the fp32 master weights. config.json says
the dtype twice (`torch_dtype` for older readers, `dtype` for newer ones) and carries the mask token's string
beside its id. A README.md holds the exact vLLM and SGLang serve commands.

The write is atomic: everything goes into a temp folder beside the destination, is fsynced, made readable
by other users (folder 0755, files 0644: a server in a container may run as another user), then renamed
into place (an existing export is moved aside first and deleted after the swap). A disk too full for it is
one error (`dflash_base.disk.NoSpace`) naming the weights file and the bytes it needs, with the temp folder
removed and an earlier export left in place.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from dflash_base.atomic import fsync_dir, fsync_file
from dflash_base.disk import require_space, writing
from trainer.model.drafter import AttentionKind, DFlashDrafter, DrafterConfig
from trainer.runspec.export_files import ARCHITECTURE, CONFIG_NAME, WEIGHTS_NAME

README_NAME = "README.md"


# Besides the weights: safetensors' header (one JSON entry per tensor), config.json and README.md
# (tiny-cpu: 433,831 bytes in all for 427,136 bytes of bf16 weights).
EXPORT_OVERHEAD_BYTES = 64 * 1024


class ExportError(ValueError):
    """An export folder that cannot be read back as a DFlash drafter."""


def hf_config(cfg: DrafterConfig, dtype: torch.dtype, mask_token: str | None = None) -> dict[str, Any]:
    """The config.json a serving engine reads (Qwen3 fields plus the DFlash ones)."""
    dtype_name = str(dtype).removeprefix("torch.")
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "layer_types": ["full_attention"] * cfg.num_hidden_layers,
        "initializer_range": 0.02,
        "torch_dtype": dtype_name,
        "dtype": dtype_name,
        "block_size": cfg.block_size,
        "num_target_layers": cfg.num_target_layers,
        "dflash_config": {
            "mask_token_id": cfg.mask_token_id,
            "mask_token": mask_token,
            "target_layer_ids": list(cfg.target_layer_ids),
        },
    }


def serve_commands(target: str, export_dir: str | Path, block_size: int) -> dict[str, str]:
    """The commands that serve `target` with this drafter: vLLM must be told `"method": "dflash"` (else it
    picks draft_model), SGLang `--speculative-algorithm DFLASH`. A target folder given relative to the
    working directory (a config's `runs/smollm2-135m/target`) is named by its absolute path: the commands
    are pasted from the export's README, from anywhere."""
    if Path(target).is_dir():
        target = str(Path(target).resolve())
    spec = json.dumps(
        {"method": "dflash", "model": str(export_dir), "num_speculative_tokens": block_size - 1}
    )
    return {
        "vllm": f"vllm serve {shlex.quote(target)} --speculative-config {shlex.quote(spec)}",
        "sglang": (
            f"python -m sglang.launch_server --model-path {shlex.quote(target)} --speculative-algorithm DFLASH "
            f"--speculative-draft-model-path {shlex.quote(str(export_dir))} --dtype bfloat16"
        ),
    }


def _readme(commands: dict[str, str], target: str) -> str:
    return (
        "# DFlash drafter (exported by dflash-doctor's trainer)\n\n"
        f"Trained for the target `{target}`; serve it beside that target.\n\n"
        f"vLLM:\n\n```\n{commands['vllm']}\n```\n\nSGLang:\n\n```\n{commands['sglang']}\n```\n"
    )


def drafter_config_from_hf(config: dict[str, Any]) -> DrafterConfig:
    """Read a DFlash config.json (ours or a published one) back into a DrafterConfig."""
    if ARCHITECTURE not in (config.get("architectures") or []):
        raise ExportError(
            f"config.json architectures {config.get('architectures')} do not include {ARCHITECTURE!r}"
        )
    dflash = config.get("dflash_config") or {}
    try:
        rope_theta = config.get("rope_theta") or (config.get("rope_parameters") or {}).get(
            "rope_theta", 1_000_000.0
        )
        heads = int(config["num_attention_heads"])
        return DrafterConfig(
            hidden_size=int(config["hidden_size"]),
            intermediate_size=int(config["intermediate_size"]),
            num_hidden_layers=int(config["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            vocab_size=int(config["vocab_size"]),
            max_position_embeddings=int(config.get("max_position_embeddings", 32768)),
            block_size=int(dflash.get("block_size", config.get("block_size", 16))),
            target_layer_ids=[int(i) for i in dflash["target_layer_ids"]],
            mask_token_id=int(dflash["mask_token_id"]),
            num_target_layers=int(dflash.get("num_target_layers", config["num_target_layers"])),
        )
    except KeyError as missing:
        raise ExportError(f"config.json lacks the field {missing}") from None


def export_drafter(
    model: DFlashDrafter,
    out_dir: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    mask_token: str | None = None,
    target: str = "TARGET",
) -> Path:
    """Write config.json, model.safetensors and README.md to `out_dir` atomically; returns the folder.

    `dtype`: the weights' dtype (bf16 for serving; torch.float32 keeps the master weights, so a reload
    reproduces the model bit for bit). `mask_token`: the mask token's string, written beside its id.
    `target`: the target's path or name, for the serve commands in README.md.
    """
    out = Path(out_dir).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    tensors: dict[str, Tensor] = {name: t.detach().to("cpu", dtype).contiguous() for name, t in state.items()}

    needed = sum(t.nelement() * t.element_size() for t in tensors.values()) + EXPORT_OVERHEAD_BYTES
    require_space(out / WEIGHTS_NAME, needed)  # names the file; measured on the folder it goes in
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    with writing(out / WEIGHTS_NAME, needed, cleanup=lambda: shutil.rmtree(staging, ignore_errors=True)):
        save_file(tensors, str(staging / WEIGHTS_NAME), metadata={"format": "pt"})
        config = hf_config(model.cfg, dtype, mask_token)
        (staging / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
        (staging / README_NAME).write_text(_readme(serve_commands(target, out, model.cfg.block_size), target))
        for name in (WEIGHTS_NAME, CONFIG_NAME, README_NAME):
            fsync_file(staging / name)
            os.chmod(staging / name, 0o644)
        os.chmod(staging, 0o755)  # mkdtemp made it 0700: a server running as another user could not read it
        fsync_dir(staging)
        _swap_into_place(staging, out)
    return out


def load_drafter(
    export_dir: str | Path, embed_weight: Tensor, lm_head_weight: Tensor, attention: AttentionKind = "sdpa"
) -> DFlashDrafter:
    """A drafter rebuilt from an export folder (fp32 parameters), with the target's frozen weights."""
    folder = Path(export_dir)
    try:
        config = json.loads((folder / CONFIG_NAME).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ExportError(f"cannot read {folder / CONFIG_NAME}: {err}") from None
    model = DFlashDrafter(drafter_config_from_hf(config), embed_weight, lm_head_weight, attention=attention)
    weights = {name.removeprefix("model."): t for name, t in load_file(str(folder / WEIGHTS_NAME)).items()}
    expected = model.state_dict()
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise ExportError(
            f"{folder / WEIGHTS_NAME}: missing weights {missing[:5]}, unexpected {unexpected[:5]}"
        )
    for name, tensor in weights.items():
        if tensor.shape != expected[name].shape:
            raise ExportError(
                f"{name} has shape {tuple(tensor.shape)}, expected {tuple(expected[name].shape)}"
            )
    model.load_state_dict({name: t.to(expected[name].dtype) for name, t in weights.items()})
    return model


def _swap_into_place(staging: Path, out: Path) -> None:
    """Rename `staging` to `out`; an existing `out` is moved aside first and removed after the swap."""
    previous = None
    if out.exists():
        previous = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
        previous.rmdir()
        out.rename(previous)
    try:
        staging.rename(out)
    except BaseException:
        if previous is not None:
            previous.rename(out)  # put the old export back
        raise
    fsync_dir(out.parent)
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)
