"""Load a dflash-doctor DFlash export with the real vLLM, on CPU, and say whether it loaded right.

Run by vLLM's own python (vLLM pins its own torch, so it lives in a venv of its own), never imported by
dflash-doctor (it imports nothing from it): `VLLM_PYTHON dflash_doctor/serving/vllm_loader.py EXPORT_DIR`, as
`dflash-doctor serve-check --engine vllm` does. It prints one JSON verdict as the last line of stdout:
`{"engine", "engine_version", "ok", "parameters": {"equal", "missing", "different", "unused",
"shared_with_target"}, "config": {field: {"engine", "ours", "ok"}}}`, or `{"ok": false, "reason", "error"}`.
Exit 0 the export loaded right; 1 it did not; 2 the folder is not an export; 3 this python has no vLLM;
4 vLLM's internals are not where vLLM 0.33.0 had them (a module, name or attribute this script reads).

What it does, through vLLM's serving path rather than a copy of it:
- builds the engine config from the `vllm serve` command our export's README.md gives, parsed by vLLM's
  own CLI parser (`EngineArgs.add_cli_args`, `create_engine_config`), for a stand-in target: a
  config.json-only Qwen3 sized like the drafter's target (vLLM reads the target's layer count, hidden size
  and vocabulary, never its weights, to build the drafter);
- resolves our `architectures` through vLLM's model registry and builds and loads the drafter with
  `get_model`, the call vLLM's speculative proposer makes (its loader, its safetensors reader, the model's
  own `load_weights`);
- checks every parameter of vLLM's module against our safetensors (vLLM fuses q/k/v into `qkv_proj` and
  gate/up into `gate_up_proj`: ours are concatenated in vLLM's order to compare), and the config values vLLM resolved
  (mask token, target layers, block width, attention mode, RoPE, dtype, the drafter's path) against the
  ones we wrote.

Why not trust `load_weights` alone: vLLM's DFlash `load_weights` returns no set of loaded names, so its
loader's strict "weights not initialized" check never runs; a weight we forgot would be served as
whatever memory held.

vLLM's own CPU platform is forced (`VLLM_TARGET_DEVICE=cpu`) and a one-process gloo group stands in for
the distributed setup its parallel layers ask for.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any, NoReturn

# Before vLLM is imported: the CPU platform, no hub, no usage report, logs on stderr (stdout is the verdict).
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

EXIT_MISLOADED = 1
EXIT_BAD_INPUT = 2
EXIT_ENGINE_MISSING = 3
EXIT_INTERNALS_CHANGED = 4
# Every vLLM name this script imports: checked first, so a vLLM that moved one says so (exit 4), not a crash.
INTERNALS = (
    ("vllm.engine.arg_utils", "EngineArgs"),
    ("vllm.utils.argparse_utils", "FlexibleArgumentParser"),
    ("vllm.distributed", "init_distributed_environment"),
    ("vllm.distributed", "initialize_model_parallel"),
    ("vllm.model_executor.models.qwen3_dflash", "dflash_has_any_non_causal"),
    ("vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils", "get_eagle3_aux_layers_from_config"),
    ("vllm.v1.worker.gpu.spec_decode.utils", "get_parallel_drafting_token_id"),
    ("vllm.config", "set_current_vllm_config"),
    ("vllm.model_executor.model_loader", "get_model"),
    ("vllm.model_executor.model_loader.utils", "get_draft_load_config"),
    ("vllm.model_executor.models.registry", "ModelRegistry"),
)
# Parameters vLLM's drafter has that a DFlash checkpoint may leave out, and what vLLM does then.
SHARED_WITH_TARGET = {
    "model.embed_tokens.weight": "the target's embedding (no embed_tokens in the checkpoint)",
    "lm_head.weight": "the target's LM head (no lm_head in the checkpoint)",
    "model.mask_embedding": "unused: embeds mask slots through mask_token_id (no mask_embedding.pt)",
}
# The config.json fields this script reads (all of them written by our export).
NEEDED_FIELDS = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "rms_norm_eps", "rope_theta", "vocab_size", "torch_dtype", "block_size", "num_target_layers",
    "dflash_config",
)  # fmt: skip
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def stop(code: int, reason: str, message: str, version: str | None = None) -> NoReturn:
    """No verdict on the export (bad input, no vLLM, a vLLM this script does not know): say why and exit."""
    print(json.dumps({"engine": "vllm", "engine_version": version, "ok": False, "reason": reason,
                      "error": message}), flush=True)  # fmt: skip
    sys.exit(code)


def fail_input(message: str) -> NoReturn:
    stop(EXIT_BAD_INPUT, "bad input", message)


def require_vllm() -> str:
    """vLLM's version, after checking that every name this script imports is where vLLM 0.33.0 had it."""
    import importlib

    try:
        import vllm
    except ImportError as err:
        stop(EXIT_ENGINE_MISSING, "engine missing", f"{sys.executable} cannot import vllm ({err})")
    version = str(getattr(vllm, "__version__", "unknown"))
    for module, name in INTERNALS:
        try:
            getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as err:
            stop(EXIT_INTERNALS_CHANGED, "internals changed", f"{module}.{name}: {err}", version)
    return version


def read_export(folder: Path) -> dict[str, Any]:
    """Our config.json, checked for the fields this script needs to size the stand-in target."""
    for name in ("config.json", "model.safetensors", "README.md"):
        if not (folder / name).is_file():
            fail_input(
                f"{folder} has no {name}: pass a folder written by trainer.model.export.export_drafter"
            )
    try:
        config = json.loads((folder / "config.json").read_text())
    except json.JSONDecodeError as err:
        fail_input(
            f"{folder / 'config.json'} is not JSON ({err}): re-export with trainer.model.export.export_drafter"
        )
    missing = [k for k in NEEDED_FIELDS if k not in config]
    if missing:
        fail_input(
            f"{folder / 'config.json'} lacks {missing}: re-export with trainer.model.export.export_drafter"
        )
    return config


def write_stand_in_target(export_config: dict[str, Any], folder: Path) -> Path:
    """A config.json-only Qwen3 target with the sizes the drafter was trained against."""
    keys = (
        "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
        "rms_norm_eps", "rope_theta", "vocab_size", "max_position_embeddings", "torch_dtype", "dtype",
    )  # fmt: skip
    target = {k: export_config[k] for k in keys if k in export_config}
    target |= {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "num_hidden_layers": export_config["num_target_layers"],
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(target, indent=2))
    return folder


def serve_arguments(folder: Path) -> list[str]:
    """The arguments after the target in the `vllm serve` command our export's README.md gives."""
    for line in (folder / "README.md").read_text().splitlines():
        if line.startswith("vllm serve "):
            return shlex.split(line)[3:]
    fail_input(
        f"{folder / 'README.md'} has no `vllm serve` line: re-export with trainer.model.export.export_drafter"
    )


def engine_config(target: Path, serve_args: list[str]) -> Any:
    """The VllmConfig that `vllm serve TARGET <our arguments>` builds, parsed by vLLM's own CLI parser;
    eager (nothing to compile), no tokenizer (the stand-in target has none), a short context."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    extra = ["--enforce-eager", "--skip-tokenizer-init", "--max-model-len", "256"]
    args = parser.parse_args(["--model", str(target), *serve_args, *extra])
    return EngineArgs.from_cli_args(args).create_engine_config()


def init_single_process_group(scratch: Path) -> None:
    """The one-rank gloo world and model-parallel groups vLLM's parallel layers query."""
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    init_distributed_environment(
        world_size=1,
        rank=0,
        local_rank=0,
        distributed_init_method=f"file://{scratch / 'dist-init'}",
        backend="gloo",
    )
    initialize_model_parallel(1, 1)


def expected_tensor(ours: dict[str, Any], vllm_name: str) -> tuple[Any | None, list[str]]:
    """Our tensor for one vLLM parameter (a fused one is ours concatenated in vLLM's order: q, k, v and
    gate, up), and the export names it needed that the export lacks."""
    import torch

    name = vllm_name.removeprefix("model.")
    for fused, parts in FUSED.items():
        if f".{fused}." in name:
            names = [name.replace(fused, part) for part in parts]
            missing = [n for n in names if n not in ours]
            return (None if missing else torch.cat([ours[n] for n in names], dim=0)), missing
    return ours.get(name), [] if name in ours else [name]


def compare_parameters(model: Any, ours: dict[str, Any]) -> dict[str, Any]:
    """Every vLLM parameter against our export: equal, different, not in the export, or shared."""
    import torch

    equal, different, not_loaded, shared = 0, [], [], {}
    vllm_names = set()
    for name, param in model.named_parameters():
        want, missing = expected_tensor(ours, name)
        vllm_names.add(name.removeprefix("model."))
        if want is None:
            if name in SHARED_WITH_TARGET:
                shared[name] = SHARED_WITH_TARGET[name]
            else:
                not_loaded.append(f"{name} (the export lacks {', '.join(missing)})")
            continue
        got = param.detach()
        if tuple(got.shape) == tuple(want.shape) and torch.equal(got, want.to(got.dtype)):
            equal += 1
        else:
            different.append(
                f"{name}: vLLM {tuple(got.shape)} {got.dtype}, ours {tuple(want.shape)} {want.dtype}"
            )
    unfused = {n.replace(f, p) for n in vllm_names for f, ps in FUSED.items() if f".{f}." in n for p in ps}
    return {
        "equal": equal,
        "missing": not_loaded,
        "different": different,
        "unused": sorted(set(ours) - vllm_names - unfused),  # export tensors no vLLM parameter took
        "shared_with_target": shared,
    }


def config_checks(
    vllm_config: Any, model: Any, export: Path, ours: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """The DFlash values vLLM resolved from our config.json, beside the ones we meant."""
    from vllm.model_executor.models.qwen3_dflash import dflash_has_any_non_causal
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config
    from vllm.v1.worker.gpu.spec_decode.utils import get_parallel_drafting_token_id

    spec = vllm_config.speculative_config
    draft_hf = spec.draft_model_config.hf_config
    dflash = ours["dflash_config"]
    layer_ids = dflash["target_layer_ids"]
    attn0 = model.model.layers[0].self_attn
    rope = attn0.rotary_emb
    checks = {
        # vLLM counts a captured layer's output as aux layer i + 1 (the input of layer i + 1).
        "aux_hidden_state_layers": (
            list(get_eagle3_aux_layers_from_config(spec) or []),
            [i + 1 for i in layer_ids],
        ),
        "fc_input_size": (model.model.fc.input_size, len(layer_ids) * ours["hidden_size"]),
        "mask_token_id (proposer)": (get_parallel_drafting_token_id(draft_hf), dflash["mask_token_id"]),
        "mask_token_id (model)": (model.model.mask_token_id, dflash["mask_token_id"]),
        "draft_model_path": (spec.draft_model_config.model, str(export)),
        "num_speculative_tokens": (spec.num_speculative_tokens, ours["block_size"] - 1),
        "parallel_drafting": (spec.parallel_drafting, True),
        "non_causal_attention": (dflash_has_any_non_causal(draft_hf), True),
        "layer_causal": (model.get_draft_attn_causal(), [False] * ours["num_hidden_layers"]),
        "num_layers": (len(model.model.layers), ours["num_hidden_layers"]),
        "num_heads": (attn0.total_num_heads, ours["num_attention_heads"]),
        "num_kv_heads": (attn0.total_num_kv_heads, ours["num_key_value_heads"]),
        "head_dim": (attn0.head_dim, ours["head_dim"]),
        "rms_norm_eps": (attn0.q_norm.variance_epsilon, ours["rms_norm_eps"]),
        "rope_theta": (float(rope.base), float(ours["rope_theta"])),
        "rope_neox_style": (rope.is_neox_style, True),  # our rotate-half layout
        "uses_aux_hidden_states": (model.model.use_aux_hidden_state, True),
        "own_embed_tokens": (bool(getattr(model, "has_own_embed_tokens", False)), False),
        "own_lm_head": (bool(getattr(model, "has_own_lm_head", False)), False),
        # vLLM serves the draft in the target's dtype; the stand-in target carries ours.
        "dtype": (str(spec.draft_model_config.dtype).removeprefix("torch."), ours["torch_dtype"]),
    }
    return {name: {"engine": got, "ours": want, "ok": got == want} for name, (got, want) in checks.items()}


def check_export(export: Path, ours_config: dict[str, Any], scratch: Path, version: str) -> dict[str, Any]:
    """Build and load the drafter the way vLLM serves it; the verdict as a dict."""
    import torch
    from safetensors.torch import load_file
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model
    from vllm.model_executor.model_loader.utils import get_draft_load_config
    from vllm.model_executor.models.registry import ModelRegistry

    verdict: dict[str, Any] = {
        "engine": "vllm", "engine_version": version, "ok": False, "torch": torch.__version__,
    }  # fmt: skip
    stage = "engine config"
    try:
        target = write_stand_in_target(ours_config, scratch / "target")
        vllm_config = engine_config(target, serve_arguments(export))
        draft_config = vllm_config.speculative_config.draft_model_config
        stage = "model registry"
        model_cls, arch = ModelRegistry.resolve_model_cls(draft_config.architectures, draft_config)
        verdict |= {"architecture": arch, "model_class": f"{model_cls.__module__}.{model_cls.__qualname__}"}
        stage = "model load"
        with set_current_vllm_config(vllm_config):
            init_single_process_group(scratch)
            model = get_model(
                vllm_config=vllm_config,
                model_config=draft_config,
                load_config=get_draft_load_config(vllm_config),
            )
    except Exception as err:  # vLLM refused the export: that is the verdict, not a crash
        return verdict | {"error": f"{stage}: {type(err).__name__}: {err}"}
    try:  # vLLM built the model: an attribute we read off it that is gone means vLLM changed, not our export
        parameters = compare_parameters(model, load_file(str(export / "model.safetensors")))
        config = config_checks(vllm_config, model, export, ours_config)
    except AttributeError as err:
        stop(EXIT_INTERNALS_CHANGED, "internals changed", f"reading vLLM's model: {err}", version)
    ok = not (parameters["different"] or parameters["missing"] or parameters["unused"]) and all(
        check["ok"] for check in config.values()
    )
    return verdict | {"ok": ok, "parameters": parameters, "config": config}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Load a dflash-doctor DFlash export with vLLM on CPU.")
    parser.add_argument("export", type=Path, help="a folder written by trainer.model.export.export_drafter")
    export = parser.parse_args(argv).export.resolve()
    ours_config = read_export(export)
    version = require_vllm()
    with tempfile.TemporaryDirectory(prefix="vllm-interop-") as scratch_name:
        scratch = Path(scratch_name)
        # vLLM keeps a model-info cache under ~/.cache/vllm: keep it in the scratch folder instead.
        os.environ["VLLM_CACHE_ROOT"] = str(scratch / "vllm-cache")
        os.environ["VLLM_CONFIG_ROOT"] = str(scratch / "vllm-config")
        verdict = check_export(export, ours_config, scratch, version)
    print(json.dumps(verdict, default=str), flush=True)  # one line, the last: the verdict
    return 0 if verdict["ok"] else EXIT_MISLOADED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
