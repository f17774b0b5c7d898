"""`eval` refuses a damaged export, an export for another target, and prompt ids outside the vocabulary before
the target loads or any held-out data is made (issue 29)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dflash_base.errors import ConfigError
from dflash_doctor.cli import run
from tests.trainer.input_files import no_target_loads
from trainer.runspec.eval_request import EvalRequest


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def export(tmp_path: Path) -> Path:
    from tests.trainer.eval.test_eval import _untrained_drafter
    from trainer.model.export import export_drafter

    return export_drafter(_untrained_drafter(), tmp_path / "export")


@pytest.mark.parametrize("cut", ["half", "empty", "header"])
def test_eval_with_a_cut_weights_file_names_it_before_any_work(
    export: Path, cut: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: exit 3 (SafetensorError), with --config after 2-4 min of making held-out data."""
    no_target_loads(monkeypatch)
    weights = export / "model.safetensors"
    size = weights.stat().st_size
    os.truncate(weights, {"half": size // 2, "empty": 0, "header": 20}[cut])
    with pytest.raises(ConfigError, match=r"model\.safetensors is .* bytes"):
        EvalRequest(str(export)).check()
    assert run(["eval", "--export", str(export), "--config", "tiny-cpu"]) == 2
    assert f"{weights} is " in " ".join(capsys.readouterr().err.split())


def test_eval_with_an_export_for_another_target_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: exit 3 (`ValueError: embed_weight has shape ...`)."""
    import torch

    from trainer.model.drafter import DFlashDrafter, DrafterConfig
    from trainer.model.export import export_drafter

    no_target_loads(monkeypatch)
    cfg = DrafterConfig(256, 512, 1, 4, 2, 64, 1e-6, 1e4, 512, 4096, 8, [1], 511, 4)
    export = export_drafter(DFlashDrafter(cfg, torch.zeros(512, 256), torch.zeros(512, 256)), tmp_path / "e")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"input_ids": [1, 2, 3]}\n')
    assert run(["eval", "--export", str(export), "--target", "tiny", "--prompts", str(prompts)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "was made for another target (hidden 256 vs 128" in err


@pytest.mark.parametrize(
    ("ids", "says"),
    [
        ("[1, 2, 9999]", "input_ids[2] is 9999, outside the target's vocabulary (0..511)"),
        ("[1, -3]", "input_ids[1] is -3, outside the target's vocabulary (0..511)"),
        ("[1, 2.5]", "input_ids[1] is 2.5, not a token id (an integer)"),
        ("[]", "input_ids must be a non-empty list of token ids, got []"),
    ],
)
def test_eval_prompt_ids_are_checked_against_the_vocabulary(
    export: Path, tmp_path: Path, ids: str, says: str, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Was: exit 3 (IndexError) out of the vocabulary or negative; a float accepted; [] "give input_ids"."""
    no_target_loads(monkeypatch)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"input_ids": [4, 5]}\n{"input_ids": ' + ids + "}\n")
    assert run(["eval", "--export", str(export), "--target", "tiny", "--prompts", str(prompts)]) == 2
    assert f"line 2: {says}" in " ".join(capsys.readouterr().err.split())
