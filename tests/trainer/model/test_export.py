"""Export: the folder serving engines read, written atomically, and a bit-exact round trip."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from tests.trainer.drafter_fixtures import tiny_batch, tiny_config, tiny_drafter
from trainer.model.drafter import DFlashDrafter
from trainer.model.export import ExportError, export_drafter, load_drafter, serve_commands


def trained_looking_drafter() -> DFlashDrafter:
    """A drafter whose every weight (norms included) differs from its initial value."""
    model = tiny_drafter(tiny_config(block_size=4))
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=gen))
    return model


def test_round_trip_gives_identical_outputs(tmp_path: Path) -> None:
    model = trained_looking_drafter()
    folder = export_drafter(model, tmp_path / "drafter", dtype=torch.float32)  # the master weights
    fresh = load_drafter(folder, model.embed_weight, model.lm_head_weight)
    assert fresh.cfg == model.cfg
    batch = tiny_batch(model.cfg)
    with torch.no_grad():
        args = (batch["input_ids"], batch["hidden"], batch["anchors"], batch["anchor_valid"])
        assert torch.equal(fresh.draft_hidden(*args), model.draft_hidden(*args))
        assert torch.equal(fresh(**batch).loss, model(**batch).loss)


def test_config_carries_the_dflash_fields(tmp_path: Path) -> None:
    model = trained_looking_drafter()
    folder = export_drafter(model, tmp_path / "drafter")
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["model_type"] == "qwen3"
    assert config["block_size"] == 4 and config["num_hidden_layers"] == 2 and config["num_target_layers"] == 4
    assert config["dflash_config"] == {"mask_token_id": 96, "mask_token": None, "target_layer_ids": [1, 2]}
    assert config["num_key_value_heads"] == 2 and config["head_dim"] == 8 and config["hidden_act"] == "silu"
    # transformers (what vLLM and SGLang parse configs with) reads it as a Qwen3 config with the extras.
    parsed = AutoConfig.from_pretrained(folder)
    assert parsed.model_type == "qwen3" and parsed.hidden_size == 32
    assert parsed.block_size == 4 and parsed.dflash_config["target_layer_ids"] == [1, 2]


def test_weights_use_serving_names_without_embed_or_head(tmp_path: Path) -> None:
    model = trained_looking_drafter()
    folder = export_drafter(model, tmp_path / "drafter")
    weights = load_file(str(folder / "model.safetensors"))
    assert set(weights) == set(model.state_dict())
    assert "fc.weight" in weights and "hidden_norm.weight" in weights and "norm.weight" in weights
    assert "layers.1.self_attn.k_norm.weight" in weights and "layers.0.mlp.down_proj.weight" in weights
    assert not any(name.startswith("model.") or "embed" in name or "lm_head" in name for name in weights)


def test_bf16_export_for_serving_by_default(tmp_path: Path) -> None:
    model = trained_looking_drafter()
    folder = export_drafter(model, tmp_path / "drafter", mask_token="<|mask|>")
    config = json.loads((folder / "config.json").read_text())
    assert config["torch_dtype"] == config["dtype"] == "bfloat16"
    assert config["dflash_config"]["mask_token"] == "<|mask|>"
    assert all(t.dtype == torch.bfloat16 for t in load_file(str(folder / "model.safetensors")).values())
    fresh = load_drafter(folder, model.embed_weight, model.lm_head_weight)
    torch.testing.assert_close(fresh.fc.weight, model.fc.weight, rtol=1e-2, atol=1e-2)


def test_export_replaces_an_old_one_and_leaves_no_temp_behind(tmp_path: Path) -> None:
    old = tiny_drafter(seed=1)
    new = trained_looking_drafter()
    export_drafter(old, tmp_path / "drafter", dtype=torch.float32)
    export_drafter(new, tmp_path / "drafter", dtype=torch.float32)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drafter"]
    fresh = load_drafter(tmp_path / "drafter", new.embed_weight, new.lm_head_weight)
    assert torch.equal(fresh.fc.weight, new.fc.weight)


def test_failed_export_keeps_the_previous_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = tiny_drafter(seed=1)
    export_drafter(old, tmp_path / "drafter", dtype=torch.float32)

    def broken_save(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("trainer.model.export.save_file", broken_save)
    with pytest.raises(OSError, match="disk full"):
        export_drafter(trained_looking_drafter(), tmp_path / "drafter")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drafter"]
    fresh = load_drafter(tmp_path / "drafter", old.embed_weight, old.lm_head_weight)
    assert torch.equal(fresh.fc.weight, old.fc.weight)


def test_load_rejects_a_foreign_folder(tmp_path: Path) -> None:
    model = trained_looking_drafter()
    folder = export_drafter(model, tmp_path / "drafter")
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["Qwen3ForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ExportError, match="DFlashDraftModel"):
        load_drafter(folder, model.embed_weight, model.lm_head_weight)
    with pytest.raises(ExportError, match="cannot read"):
        load_drafter(tmp_path / "nowhere", model.embed_weight, model.lm_head_weight)


def test_export_is_readable_by_other_users_and_says_how_to_serve(tmp_path: Path) -> None:
    folder = export_drafter(trained_looking_drafter(), tmp_path / "drafter", target="/models/Qwen3-8B")
    assert folder.stat().st_mode & 0o777 == 0o755
    assert {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()} == {
        "config.json": 0o644, "model.safetensors": 0o644, "README.md": 0o644,
    }  # fmt: skip
    readme = (folder / "README.md").read_text()
    vllm, sglang = serve_commands("/models/Qwen3-8B", folder, 4).values()
    assert vllm in readme and sglang in readme
    assert vllm.startswith("vllm serve /models/Qwen3-8B --speculative-config ")
    spec = json.loads(shlex.split(vllm)[-1])
    assert spec == {"method": "dflash", "model": str(folder), "num_speculative_tokens": 3}
    assert f"--speculative-algorithm DFLASH --speculative-draft-model-path {folder}" in sglang


# The engines' documented mapping from checkpoint names to their fused parameters (vLLM's and SGLang's
# Qwen3-style `stacked_params_mapping`): (fused parameter, checkpoint name, shard).
STACKED = [
    ("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"), ("qkv_proj", "v_proj", "v"),
    ("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1),
]  # fmt: skip


def engine_parameters(config: dict) -> dict[str, tuple[int, ...]]:
    """The parameters of the engines' DFlashDraftModel, with their shapes, from config.json alone."""
    h, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv, d = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    targets = len(config["dflash_config"]["target_layer_ids"])
    params = {"fc.weight": (h, targets * h), "hidden_norm.weight": (h,), "norm.weight": (h,)}
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        params |= {
            p + "self_attn.qkv_proj.weight": ((heads + 2 * kv) * d, h),
            p + "self_attn.o_proj.weight": (h, heads * d),
            p + "self_attn.q_norm.weight": (d,),
            p + "self_attn.k_norm.weight": (d,),
            p + "mlp.gate_up_proj.weight": (2 * inter, h),
            p + "mlp.down_proj.weight": (h, inter),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
    return params


def test_every_engine_parameter_is_covered_with_the_right_shape(tmp_path: Path) -> None:
    """SGLang's loader ignores unknown names and never reports missing ones: a renamed weight would load
    silently. Map our export through the engines' name mapping and check coverage and shapes."""
    folder = export_drafter(tiny_drafter(tiny_config(block_size=4, num_layers=2)), tmp_path / "drafter")
    config = json.loads((folder / "config.json").read_text())
    expected = engine_parameters(config)
    covered: dict[str, list[tuple[int, ...]]] = {}
    for name, tensor in load_file(str(folder / "model.safetensors")).items():
        fused = next((name.replace(part, whole) for whole, part, _ in STACKED if part in name), name)
        assert fused in expected, f"{name} maps to no engine parameter ({fused})"
        covered.setdefault(fused, []).append(tuple(tensor.shape))
    assert set(covered) == set(expected)
    for fused, shapes in covered.items():
        rows = sum(s[0] for s in shapes)
        assert (rows, *shapes[0][1:]) == expected[fused], fused


def test_serve_commands_name_a_relative_target_folder_by_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shipped config names its target relative to the working directory (smollm2-135m:
    `runs/smollm2-135m/target`); the README's commands are run from anywhere, so they name the folder whole.
    Embedded targets and hub names stay as written."""
    (tmp_path / "runs" / "m" / "target").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    for command in serve_commands("runs/m/target", tmp_path / "export", 16).values():
        assert f" {tmp_path / 'runs' / 'm' / 'target'} " in f" {command} ", command
    assert serve_commands("Qwen/Qwen3-8B", tmp_path / "export", 16)["vllm"].startswith(
        "vllm serve Qwen/Qwen3-8B "
    )
