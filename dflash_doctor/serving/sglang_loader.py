"""Load a dflash-doctor DFlash export with SGLang's own DFlashDraftModel and weight loader; print a JSON verdict.

Run by SGLang's python, not ours (this file imports nothing from dflash-doctor), as
`dflash-doctor serve-check --engine sglang` does:

    SGLANG_PYTHON dflash_doctor/serving/sglang_loader.py [--dtype auto|bfloat16|float16|float32] EXPORT_DIR

`--dtype` is the server's `--dtype` (default `auto`: the dtype config.json names, except that SGLang reads
float32 as float16); with a dtype given, our tensors are compared after a cast to it.

Why: SGLang's `DFlashDraftModel.load_weights` skips checkpoint names it does not know and never reports a
parameter it did not fill, so a renamed or missing weight would be served as garbage without a word. So every
parameter of SGLang's module is filled with NaN before the load, and after it each must equal our tensor
exactly (the fused `qkv_proj` and `gate_up_proj` split back into q/k/v and gate/up); every tensor of the export
must have been consumed; and the config fields SGLang reads must carry the values we wrote, read back from the
modules SGLang built (heads, RoPE base, norm epsilon, attention type, block size, context features) or from
SGLang's own DFlash config parser (target layers, mask token).

The model is built on CPU with the least SGLang machinery: a published `ServerArgs`, a one-process gloo group
(its parallel linear layers ask for the tensor-parallel group even at TP=1), SGLang's `ModelConfig` (how the
server reads a draft folder, with the given `--dtype`) and its `DefaultModelLoader` (file discovery and the weight
iterator the server uses), as SGLang's own layer tests set themselves up.

Output, one JSON line, the last of stdout: `{"engine", "engine_version", "ok", "parameters": {"equal",
"missing", "different", "unused", ...}, "config": {field: {"engine", "ours", "ok"}}}`, or
`{"ok": false, "reason", "error"}`. Exit 0: the export loads with our values; 1: SGLang mis-loads it;
2: bad input (a folder that is not an export); 3: this python has no SGLang (or one without DFlash);
4: SGLang's internals are not where SGLang 0.5.23 had them (a module, name or attribute this script reads).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

EXIT_MISLOADED = 1
EXIT_BAD_INPUT = 2
EXIT_ENGINE_MISSING = 3
EXIT_INTERNALS_CHANGED = 4
# Every SGLang name this script imports: checked first, so an SGLang that moved one says so (exit 4).
INTERNALS = (
    ("sglang.srt.distributed", "parallel_state"),
    ("sglang.srt.runtime_context", "SpawnRanks"),
    ("sglang.srt.runtime_context", "get_parallel"),
    ("sglang.srt.runtime_context", "publish"),
    ("sglang.srt.runtime_context", "reset_context"),
    ("sglang.srt.server_args", "ServerArgs"),
    ("sglang.srt.layers.rotary_embedding.base", "_is_cpu"),
    ("sglang.srt.configs.device_config", "DeviceConfig"),
    ("sglang.srt.configs.load_config", "LoadConfig"),
    ("sglang.srt.configs.model_config", "ModelConfig"),
    ("sglang.srt.model_loader.loader", "DefaultModelLoader"),
    ("sglang.srt.layers.activation", "SiluAndMul"),
    ("sglang.srt.layers.layernorm", "RMSNorm"),
    ("sglang.srt.layers.radix_attention", "AttentionType"),
    ("sglang.srt.speculative.dflash_utils", "DEFAULT_DFLASH_MASK_TOKEN"),
    ("sglang.srt.speculative.dflash_utils", "parse_dflash_draft_config"),
)

# SGLang's fused parameters and the checkpoint names they are loaded from, in their order along dim 0.
FUSED_PARTS = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


def stop(code: int, reason: str, message: str, version: str | None = None) -> NoReturn:
    """No verdict on the export (bad input, no SGLang, an SGLang this script does not know): say why and exit."""
    print(json.dumps({"engine": "sglang", "engine_version": version, "ok": False, "reason": reason,
                      "error": message}), flush=True)  # fmt: skip
    sys.exit(code)


def require_sglang() -> str:
    """SGLang's version, after checking that its DFlash drafter and every name this script imports are where
    SGLang 0.5.23 had them."""
    import importlib

    try:
        import sglang
    except ImportError as err:
        stop(EXIT_ENGINE_MISSING, "engine missing", f"{sys.executable} cannot import sglang ({err})")
    version = str(getattr(sglang, "__version__", "unknown"))
    try:
        import sglang.srt.models.dflash  # the DFlash drafter: absent before SGLang had DFlash
    except ImportError as err:
        stop(EXIT_ENGINE_MISSING, "engine missing",
             f"SGLang {version} has no DFlash drafter ({err}): install one with sglang/srt/models/dflash.py",
             version)  # fmt: skip
    for module, name in INTERNALS:
        try:
            getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as err:
            stop(EXIT_INTERNALS_CHANGED, "internals changed", f"{module}.{name}: {err}", version)
    return version


def start_single_process_sglang(model_path: Path) -> None:
    """Publish server args and a world-of-one gloo group: SGLang's layers read both at build time. The args'
    model folder must hold a config.json (their resolution reads it): any export does."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 20000))
    from sglang.srt.distributed import parallel_state
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo")
        reset_context()
        publish(
            ServerArgs(model_path=str(model_path), device="cpu"), role="test", ranks=SpawnRanks(world_rank=0)
        )
        get_parallel().override_permanently(world_group=parallel_state._WORLD)
        parallel_state.initialize_model_parallel(backend="gloo")


def use_native_rope_kernel() -> None:
    """On a machine without CUDA, SGLang's RotaryEmbedding picks vLLM's CUDA kernel unless its platform flag
    says CPU; its real CPU engine (`SGLANG_USE_CPU_ENGINE=1`) needs the sgl-kernel CPU build, which PyPI does
    not ship. Loading never runs the kernel: set only the rotary module's flag, to its native torch path."""
    from sglang.srt.layers.rotary_embedding import base

    base._is_cpu = True


def load_with_sglang(folder: Path, dtype: str) -> tuple[Any, Any]:
    """SGLang's ModelConfig for `folder` as a DFLASH draft, and its model with every parameter loaded through
    SGLang's loader after a NaN fill (so a parameter the loader skipped stays NaN)."""
    import torch
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import DefaultModelLoader

    use_native_rope_kernel()
    model_config = ModelConfig(str(folder), is_draft_model=True, dtype=dtype, speculative_algorithm="DFLASH")
    loader = DefaultModelLoader(LoadConfig())
    cpu = torch.device("cpu")
    model = loader.initialize_model_for_startup(model_config=model_config, device_config=DeviceConfig("cpu"))
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(float("nan"))
    loader.load_weights_and_postprocess(model, loader._get_all_weights(model_config, model), cpu)
    return model_config, model


def unfused(name: str, value: Any, model: Any) -> dict[str, Any]:
    """SGLang parameter `name` as the checkpoint tensors it was loaded from (TP=1: whole rows)."""
    for fused, parts in FUSED_PARTS.items():
        if f".{fused}." not in name:
            continue
        if fused == "qkv_proj":
            layer = int(name.split(".")[1])
            attn = model.layers[layer].self_attn
            pieces = value.split([attn.q_size, attn.kv_size, attn.kv_size], dim=0)
        else:
            pieces = value.chunk(2, dim=0)
        return {name.replace(fused, part): piece for part, piece in zip(parts, pieces, strict=True)}
    return {name: value}


def compare_parameters(model: Any, ours: dict[str, Any]) -> dict[str, Any]:
    """Every SGLang parameter against our tensors; and which of our tensors no parameter took."""
    import torch

    not_loaded: list[str] = []
    different: list[str] = []
    wrong_dtype: list[str] = []
    missing_in_export: list[str] = []
    consumed: set[str] = set()
    checked = equal = 0
    for name, param in model.named_parameters():
        pieces = unfused(name, param.detach(), model)
        problems_before = len(not_loaded) + len(different) + len(wrong_dtype) + len(missing_in_export)
        if torch.isnan(param).any():
            not_loaded.append(name)
        for source, value in pieces.items():
            checked += 1
            if source not in ours:
                missing_in_export.append(source)
                continue
            consumed.add(source)
            if value.dtype != ours[source].dtype:
                wrong_dtype.append(f"{source}: sglang {value.dtype}, export {ours[source].dtype}")
            elif value.shape != ours[source].shape or not torch.equal(value, ours[source]):
                different.append(source)
        if len(not_loaded) + len(different) + len(wrong_dtype) + len(missing_in_export) == problems_before:
            equal += 1
    return {
        "equal": equal,
        # a parameter SGLang left unfilled, and the export tensor it wanted (absent from the export)
        "missing": not_loaded + [f"{source} (absent from the export)" for source in missing_in_export],
        "different": different + wrong_dtype,
        "unused": sorted(set(ours) - consumed),  # export tensors SGLang skipped without a word
        "engine_parameters": len(dict(model.named_parameters())),
        "tensors_compared": checked,
        "export_tensors": len(ours),
    }


def config_as_read(model_config: Any, model: Any, ours: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each config field SGLang uses: {"ours": what config.json says, "engine": what SGLang built or parsed}."""
    read = sglang_values(model_config, model, ours)
    return {field: {"engine": v["sglang"], "ours": v["ours"], "ok": v["sglang"] == v["ours"]}
            for field, v in read.items()}  # fmt: skip


def sglang_values(model_config: Any, model: Any, ours: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The values behind `config_as_read`, field by field."""
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.layers.radix_attention import AttentionType
    from sglang.srt.speculative.dflash_utils import DEFAULT_DFLASH_MASK_TOKEN, parse_dflash_draft_config

    dflash = ours["dflash_config"]
    parsed = parse_dflash_draft_config(draft_hf_config=model_config.hf_config)
    attn = model.layers[0].self_attn
    rope = attn.rotary_emb
    layers = list(model.layers)
    return {
        "architecture": {"ours": ours["architectures"][0], "sglang": type(model).__name__},
        "dtype": {"ours": ours["dtype"], "sglang": str(model_config.dtype).removeprefix("torch.")},
        "num_hidden_layers": {"ours": ours["num_hidden_layers"], "sglang": len(layers)},
        "hidden_size": {"ours": ours["hidden_size"], "sglang": model.fc.out_features},
        "num_attention_heads": {"ours": ours["num_attention_heads"], "sglang": attn.total_num_heads},
        "num_key_value_heads": {"ours": ours["num_key_value_heads"], "sglang": attn.total_num_kv_heads},
        "head_dim": {"ours": ours["head_dim"], "sglang": attn.head_dim},
        "intermediate_size": {
            "ours": ours["intermediate_size"],
            "sglang": model.layers[0].mlp.down_proj.input_size,
        },
        "rms_norm_eps": {"ours": ours["rms_norm_eps"], "sglang": model.norm.variance_epsilon},
        "plain_rms_norm (not Gemma's 1+w)": {"ours": True, "sglang": type(model.norm) is RMSNorm},
        "hidden_act silu": {
            "ours": ours["hidden_act"] == "silu",
            "sglang": isinstance(layers[0].mlp.act_fn, SiluAndMul),
        },
        "rope_theta": {"ours": ours["rope_theta"], "sglang": rope.base},
        "rotary_dim": {"ours": ours["head_dim"], "sglang": rope.rotary_dim},
        "rope neox style (rotate_half)": {"ours": True, "sglang": rope.is_neox_style},
        "non-causal attention in every layer": {
            "ours": True,
            "sglang": all(layer.self_attn.attn_type == AttentionType.ENCODER_ONLY for layer in layers),
        },
        "no sliding window": {
            "ours": True,
            "sglang": all(layer.self_attn.sliding_window_size == -1 for layer in layers),
        },
        "block_size": {"ours": ours["block_size"], "sglang": model.block_size},
        "num_target_layers": {"ours": ours["num_target_layers"], "sglang": parsed.num_target_layers},
        "target_layer_ids": {"ours": dflash["target_layer_ids"], "sglang": parsed.target_layer_ids},
        "context features (fc input / hidden_size)": {
            "ours": len(dflash["target_layer_ids"]),
            "sglang": model.fc.in_features // model.fc.out_features,
        },
        "mask_token_id": {"ours": dflash["mask_token_id"], "sglang": parsed.mask_token_id},
        # SGLang puts its default string in place of a null mask_token; with mask_token_id set it only uses the
        # string to cross-check the target tokenizer's id for it.
        "mask_token": {
            "ours": dflash.get("mask_token") or DEFAULT_DFLASH_MASK_TOKEN,
            "sglang": parsed.mask_token,
        },
        "vocab_size": {"ours": ours["vocab_size"], "sglang": model_config.vocab_size},
    }


def check_export(folder: Path, dtype: str, version: str) -> dict[str, Any]:
    """The export's verdict. `dtype` other than "auto": SGLang is told to serve in it, and ours is cast to it."""
    import torch
    from safetensors.torch import load_file

    ours_config = json.loads((folder / "config.json").read_text())
    ours_weights = load_file(str(folder / "model.safetensors"))
    if dtype != "auto":
        ours_config["dtype"] = dtype
        ours_weights = {name: t.to(getattr(torch, dtype)) for name, t in ours_weights.items()}
    verdict: dict[str, Any] = {"engine": "sglang", "engine_version": version, "ok": False, "dtype": dtype}
    try:
        model_config, model = load_with_sglang(folder, dtype)
    except Exception as err:  # SGLang refused the export: that is the verdict, not a crash
        return verdict | {"error": f"model load: {type(err).__name__}: {err}"}
    try:  # SGLang built the model: an attribute we read off it that is gone means SGLang changed
        config = config_as_read(model_config, model, ours_config)
        parameters = compare_parameters(model, ours_weights)
    except AttributeError as err:
        stop(EXIT_INTERNALS_CHANGED, "internals changed", f"reading SGLang's model: {err}", version)
    ok = not (parameters["missing"] or parameters["different"] or parameters["unused"]) and all(
        field["ok"] for field in config.values()
    )
    return verdict | {"ok": ok, "parameters": parameters, "config": config}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Load a DFlash export with SGLang; print a JSON verdict.")
    parser.add_argument("export", type=Path, help="a folder written by trainer.model.export.export_drafter")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"])
    args = parser.parse_args(argv)  # bad usage: argparse's message and exit 2
    folder = args.export.resolve()
    absent = [name for name in ("config.json", "model.safetensors") if not (folder / name).is_file()]
    if absent:
        stop(EXIT_BAD_INPUT, "bad input", f"{folder} is not a DFlash export: it lacks {', '.join(absent)}; "
             "write one with trainer.model.export.export_drafter")  # fmt: skip
    version = require_sglang()
    start_single_process_sglang(folder)
    verdict = check_export(folder, args.dtype, version)
    print(json.dumps(verdict, default=str), flush=True)  # one line, the last: the verdict
    return 0 if verdict["ok"] else EXIT_MISLOADED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
