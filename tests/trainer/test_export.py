"""Export: the folder serving engines read, written atomically, and a bit-exact round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from tests.trainer.drafter_fixtures import tiny_batch, tiny_config, tiny_drafter
from trainer.drafter import DFlashDrafter
from trainer.export import ExportError, export_drafter, load_drafter


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
    folder = export_drafter(model, tmp_path / "drafter")
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
    assert config["dflash_config"] == {"mask_token_id": 96, "target_layer_ids": [1, 2]}
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


def test_bf16_export_for_serving(tmp_path: Path) -> None:
    model = trained_looking_drafter()
    folder = export_drafter(model, tmp_path / "drafter", dtype=torch.bfloat16)
    assert json.loads((folder / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert all(t.dtype == torch.bfloat16 for t in load_file(str(folder / "model.safetensors")).values())
    fresh = load_drafter(folder, model.embed_weight, model.lm_head_weight)
    torch.testing.assert_close(fresh.fc.weight, model.fc.weight, rtol=1e-2, atol=1e-2)


def test_export_replaces_an_old_one_and_leaves_no_temp_behind(tmp_path: Path) -> None:
    old = tiny_drafter(seed=1)
    new = trained_looking_drafter()
    export_drafter(old, tmp_path / "drafter")
    export_drafter(new, tmp_path / "drafter")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drafter"]
    fresh = load_drafter(tmp_path / "drafter", new.embed_weight, new.lm_head_weight)
    assert torch.equal(fresh.fc.weight, new.fc.weight)


def test_failed_export_keeps_the_previous_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = tiny_drafter(seed=1)
    export_drafter(old, tmp_path / "drafter")

    def broken_save(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("trainer.export.save_file", broken_save)
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
