"""Real vLLM loads our DFlash export: every weight with our values, every DFlash field as we meant it.

Slow (vLLM's import and engine config take ~40 s on CPU): `dflash-doctor serve-check --engine vllm` runs
`dflash_doctor/serving/vllm_loader.py` in vLLM's own python on an export our `export_drafter` wrote here.
Skips, saying why, without a python that has vLLM (`DFLASH_VLLM_PYTHON`, default /work/venvs/vllm).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from tests.serving.engines import serve_check, trained_looking
from tests.trainer.drafter_fixtures import tiny_config
from trainer.model.export import export_drafter


def exported_drafter(folder: Path) -> Path:
    """A bf16 export with target layers that are not the default ones (and <= L-2, as the trainer requires)."""
    model = trained_looking(tiny_config(block_size=4, target_layer_ids=[0, 2]), seed=5)
    return export_drafter(model, folder, mask_token="<|mask|>", target="/models/tiny-qwen3")


@pytest.mark.slow
def test_vllm_loads_every_weight_and_field_of_our_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report, by_id = serve_check(capsys, "vllm", exported_drafter(tmp_path / "drafter"))
    load, config = by_id["serve.vllm.load"], by_id["serve.vllm.config"]
    assert code == 0 and load["severity"] == config["severity"] == "ok", report["findings"]
    verdict = report["verdict"]
    assert verdict["model_class"].endswith("qwen3_dflash.DFlashQwen3ForCausalLM")
    # 2 layers x (qkv, o, q_norm, k_norm, gate_up, down, 2 layer norms) + fc, hidden_norm, norm.
    assert load["evidence"]["equal"] == 19
    assert set(load["evidence"]["shared_with_target"]) == {
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.mask_embedding",
    }
    fields = verdict["config"]
    assert fields["aux_hidden_state_layers"]["engine"] == [1, 3]  # our layer ids 0 and 2, as vLLM counts them
    assert fields["mask_token_id (proposer)"]["engine"] == 96
    assert fields["num_speculative_tokens"]["engine"] == 3
    assert fields["layer_causal"]["engine"] == [False, False]


@pytest.mark.slow
def test_serve_check_catches_a_weight_vllm_would_silently_leave_unloaded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM's DFlash loader reports no missing weight: a checkpoint without up_proj loads without a word,
    half of gate_up_proj left as it was allocated. serve-check must fail it."""
    export = exported_drafter(tmp_path / "drafter")
    weights = load_file(str(export / "model.safetensors"))
    del weights["layers.1.mlp.up_proj.weight"]
    save_file(weights, str(export / "model.safetensors"), metadata={"format": "pt"})
    code, report, by_id = serve_check(capsys, "vllm", export)
    load = by_id["serve.vllm.load"]
    assert code == 1 and load["severity"] == "fail"
    assert "error" not in report["verdict"]  # vLLM itself raised nothing
    assert load["evidence"]["missing"] == [
        "model.layers.1.mlp.gate_up_proj.weight (the export lacks layers.1.mlp.up_proj.weight)"
    ]
