"""Real vLLM loads our DFlash export: every weight with our values, every DFlash field as we meant it.

vLLM pins its own torch, so it lives in a venv of its own: the python named by `DFLASH_VLLM_PYTHON`
(default /work/venvs/vllm/bin/python when it exists) runs tests/interop/vllm_load_export.py on a folder our
own `export_drafter` wrote here. The vLLM tests are slow (vLLM's import and engine config take ~40 s on CPU)
and skip with the reason when no python with vLLM is found. The bad-input test runs the script with our
own python: it refuses the folder before it imports vLLM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.trainer.drafter_fixtures import tiny_config, tiny_drafter
from trainer.export import export_drafter

VLLM_PYTHON_ENV = "DFLASH_VLLM_PYTHON"
DEFAULT_VLLM_PYTHON = Path("/work/venvs/vllm/bin/python")
SCRIPT = Path(__file__).with_name("vllm_load_export.py")
INSTALL_HINT = "python3 -m venv /work/venvs/vllm && /work/venvs/vllm/bin/pip install vllm"


def vllm_python() -> str:
    """The python that has vLLM installed, or a skip that says why there is none."""
    chosen = os.environ.get(VLLM_PYTHON_ENV) or (
        str(DEFAULT_VLLM_PYTHON) if DEFAULT_VLLM_PYTHON.exists() else ""
    )
    if not chosen:
        pytest.skip(f"no python with vLLM: set {VLLM_PYTHON_ENV}, or install one with `{INSTALL_HINT}`")
    if not Path(chosen).is_file():
        pytest.skip(f"{VLLM_PYTHON_ENV}={chosen} is not a file")
    probe = subprocess.run(
        [chosen, "-c", "import vllm"], capture_output=True, text=True, timeout=300, check=False
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        pytest.skip(f"{chosen} cannot import vllm ({last}); install it with `{INSTALL_HINT}`")
    return chosen


def exported_drafter(folder: Path) -> Path:
    """A tiny drafter whose every weight (norms included) moved off its initial value, exported for
    serving (bf16) with target layers that are not the default ones (and <= L-2, as the trainer requires)."""
    model = tiny_drafter(tiny_config(block_size=4, target_layer_ids=[0, 2]))
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=gen))
    return export_drafter(model, folder, mask_token="<|mask|>", target="/models/tiny-qwen3")


def run_check(python: str, export: Path) -> tuple[int, dict[str, Any], str]:
    """The script's exit code, its JSON verdict and its stderr (vLLM's log)."""
    done = subprocess.run(
        [python, str(SCRIPT), str(export)], capture_output=True, text=True, timeout=900, check=False
    )
    try:
        verdict = json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(
            f"no JSON verdict (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        )
    return done.returncode, verdict, done.stderr


@pytest.mark.slow
def test_vllm_loads_every_weight_and_field_of_our_export(tmp_path: Path) -> None:
    python = vllm_python()
    rc, verdict, log = run_check(python, exported_drafter(tmp_path / "drafter"))
    print(json.dumps(verdict, indent=2))  # the vLLM version and every check, for `pytest -s`
    assert rc == 0 and verdict["ok"], (
        f"vLLM refused our export: {json.dumps(verdict, indent=2)}\n{log[-4000:]}"
    )
    assert verdict["architecture"] == "DFlashDraftModel"
    assert verdict["model_class"].endswith("qwen3_dflash.DFlashQwen3ForCausalLM")
    params = verdict["parameters"]
    # 2 layers x (qkv, o, q_norm, k_norm, gate_up, down, 2 layer norms) + fc, hidden_norm, norm.
    assert params["equal"] == 19 and not params["different"] and not params["not_loaded"]
    assert set(params["shared_with_target"]) == {
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.mask_embedding",
    }
    config = verdict["config"]
    assert config["aux_hidden_state_layers"]["vllm"] == [1, 3]  # our layer ids 0 and 2, as vLLM counts them
    assert config["mask_token_id (proposer)"]["vllm"] == 96 and config["num_speculative_tokens"]["vllm"] == 3
    assert config["layer_causal"]["vllm"] == [False, False]
    assert all(check["ok"] for check in config.values()), config


@pytest.mark.slow
def test_the_check_catches_a_weight_vllm_would_silently_leave_unloaded(tmp_path: Path) -> None:
    """vLLM's DFlash loader reports no missing weight: a checkpoint without up_proj loads without a word,
    half of gate_up_proj left as it was allocated. The script must say so."""
    python = vllm_python()
    export = exported_drafter(tmp_path / "drafter")
    weights = load_file(str(export / "model.safetensors"))
    del weights["layers.1.mlp.up_proj.weight"]
    save_file(weights, str(export / "model.safetensors"), metadata={"format": "pt"})
    rc, verdict, log = run_check(python, export)
    assert rc == 1 and not verdict["ok"], log[-4000:]
    assert "error" not in verdict, verdict["error"]  # vLLM itself raised nothing
    assert verdict["parameters"]["not_loaded"] == [
        "model.layers.1.mlp.gate_up_proj.weight (the export lacks layers.1.mlp.up_proj.weight)"
    ]


def test_the_check_refuses_a_folder_that_is_no_export(tmp_path: Path) -> None:
    """Bad input is refused before vLLM is imported, so our own python is enough here."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    verdict = json.loads(done.stdout)
    assert verdict["ok"] is False
    assert (
        verdict["error"]
        == f"{tmp_path.resolve()} has no config.json: pass a folder written by trainer.export.export_drafter"
    )
