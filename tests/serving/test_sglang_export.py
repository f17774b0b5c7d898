"""Real SGLang loads our DFlash export with our values (slow: it runs a separate SGLang install, on CPU).

SGLang's loader skips unknown names and never reports a parameter it left unfilled, so the mapping test in
tests/trainer/model/test_export.py can only check our export against a hand-written copy of the engines' names.
Here `dflash-doctor serve-check --engine sglang` has SGLang's own DFlashDraftModel and weight loader read the
folder (`dflash_doctor/serving/sglang_loader.py`, in SGLang's python): every parameter must come out equal to
ours, with the config fields it reads at our values. A control export with one renamed weight must be caught.
Skips, saying why, without a python that has SGLang (`DFLASH_SGLANG_PYTHON`, default /work/venvs/sglang).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.serving.engines import serve_check, trained_looking
from tests.trainer.drafter_fixtures import tiny_config
from trainer.model.export import export_drafter


@pytest.mark.slow
def test_sglang_loads_every_weight_and_config_field_of_our_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tiny_config(block_size=16, num_layers=3, target_layer_ids=[0, 1, 3])
    wider = export_drafter(trained_looking(cfg, seed=2), tmp_path / "wider", mask_token="<|mask|>")
    code, report, by_id = serve_check(capsys, "sglang", wider)
    load, config = by_id["serve.sglang.load"], by_id["serve.sglang.config"]
    assert code == 0 and load["severity"] == config["severity"] == "ok", report["findings"]
    params = report["verdict"]["parameters"]
    # 3 + 8 per layer SGLang parameters (q/k/v and gate/up fused), 3 + 11 per layer tensors in the export.
    assert load["evidence"]["equal"] == params["engine_parameters"] == 3 + 8 * 3
    assert params["tensors_compared"] == params["export_tensors"] == 3 + 11 * 3
    fields = report["verdict"]["config"]
    assert fields["target_layer_ids"]["engine"] == [0, 1, 3] and fields["block_size"]["engine"] == 16


@pytest.mark.slow
def test_serve_check_catches_a_weight_sglang_skips_without_a_word(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny = export_drafter(trained_looking(tiny_config(block_size=4), seed=1), tmp_path / "tiny")
    renamed = tmp_path / "renamed"  # what a silent rename in our export would be
    shutil.copytree(tiny, renamed)
    weights = load_file(str(renamed / "model.safetensors"))
    weights["layers.1.mlp.up.weight"] = weights.pop("layers.1.mlp.up_proj.weight")
    save_file(weights, str(renamed / "model.safetensors"), metadata={"format": "pt"})
    code, _, by_id = serve_check(capsys, "sglang", renamed)
    load = by_id["serve.sglang.load"]
    assert code == 1 and load["severity"] == "fail"
    assert load["evidence"]["unused"] == ["layers.1.mlp.up.weight"]
    assert load["evidence"]["missing"] == [
        "layers.1.mlp.gate_up_proj.weight",
        "layers.1.mlp.up_proj.weight (absent from the export)",
    ]


@pytest.mark.slow
def test_sglang_serves_an_fp32_export_in_bf16_with_the_printed_serve_commands_dtype(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SGLang reads a float32 config as float16 under `--dtype auto`, a dtype the drafter never trained in;
    the serve command we print says `--dtype bfloat16`, which serve-check passes on, as the server would."""
    fp32 = export_drafter(trained_looking(tiny_config(), seed=3), tmp_path / "fp32", dtype=torch.float32)
    assert "--dtype bfloat16" in (fp32 / "README.md").read_text()
    code, report, by_id = serve_check(capsys, "sglang", fp32)
    assert code == 0 and by_id["serve.sglang.load"]["severity"] == "ok", report["findings"]
    assert report["verdict"]["dtype"] == "bfloat16"
    assert report["verdict"]["config"]["dtype"]["engine"] == "bfloat16"
    assert report["verdict"]["parameters"]["tensors_compared"] == 25
