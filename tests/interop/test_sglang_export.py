"""Real SGLang loads our DFlash export with our values (slow: it runs a separate SGLang install, on CPU).

SGLang's loader skips unknown names and never reports a parameter it left unfilled, so the mapping test in
tests/trainer/test_export.py can only check our export against a hand-written copy of the engines' names.
Here SGLang's own DFlashDraftModel and weight loader read the folder (`sglang_load_export.py`, run by
SGLang's python) and every one of its parameters must come out equal to ours, with the config fields it reads
at our values. A control export with one renamed weight must be caught, so the check is known to bite.

SGLang's python: `$DFLASH_SGLANG_PYTHON`, else `/work/venvs/sglang/bin/python` when it exists; the test
skips, saying so, when there is none or it has no DFlash drafter.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.trainer.drafter_fixtures import tiny_config, tiny_drafter
from trainer.drafter import DFlashDrafter, DrafterConfig
from trainer.export import export_drafter

SGLANG_PYTHON_ENV = "DFLASH_SGLANG_PYTHON"
DEFAULT_SGLANG_PYTHON = Path("/work/venvs/sglang/bin/python")
CHECK_SCRIPT = Path(__file__).with_name("sglang_load_export.py")
EXIT_CANNOT_CHECK = 3  # the script's "this python cannot run the check"


def sglang_python() -> str:
    named = os.environ.get(SGLANG_PYTHON_ENV)
    if named:
        if not os.access(named, os.X_OK):
            pytest.skip(f"{SGLANG_PYTHON_ENV}={named} is not an executable python")
        return named
    if DEFAULT_SGLANG_PYTHON.is_file():
        return str(DEFAULT_SGLANG_PYTHON)
    pytest.skip(
        f"no SGLang python: set {SGLANG_PYTHON_ENV} to a python with SGLang installed "
        f"(python3 -m venv /work/venvs/sglang && /work/venvs/sglang/bin/pip install sglang)"
    )


def trained_looking(cfg: DrafterConfig, seed: int) -> DFlashDrafter:
    """A drafter whose every weight differs from its initial value (norms included, which start at ones)."""
    model = tiny_drafter(cfg, seed=seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=gen))
    return model


def with_renamed_weight(export: Path, out: Path, old: str, new: str) -> Path:
    """A copy of `export` whose weight `old` is stored as `new`: what a silent rename in our export would be."""
    shutil.copytree(export, out)
    weights = load_file(str(out / "model.safetensors"))
    weights[new] = weights.pop(old)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def run_sglang_check(
    python: str, folders: list[Path], scratch: Path, dtype: str = "auto"
) -> tuple[int, dict[str, Any]]:
    """The script's exit code and JSON verdict (SGLang told `--dtype dtype`); everything SGLang caches goes
    under `scratch`, on CPU only."""
    scratch.mkdir()
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",
        # SGLang's kernel packages keep state in ~/.humming and ~/.cache/sglang
        "HOME": str(scratch / "home"),
        "HF_HUB_OFFLINE": "1",
        "XDG_CACHE_HOME": str(scratch / "cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"),
        "TRITON_CACHE_DIR": str(scratch / "triton"),
        "HF_HOME": str(scratch / "hf"),
        "PYTHONPATH": "",  # SGLang's python must not see our package or our venv
    }
    done = subprocess.run(
        [python, str(CHECK_SCRIPT), "--dtype", dtype, *map(str, folders)],
        capture_output=True, text=True, env=env, cwd=scratch, timeout=900,
    )  # fmt: skip
    try:
        verdict = json.loads(done.stdout[done.stdout.index("{") :])
    except ValueError:
        pytest.fail(
            f"no JSON verdict from {python} (exit {done.returncode}):\n{done.stdout}\n{done.stderr[-4000:]}"
        )
    if done.returncode == EXIT_CANNOT_CHECK:
        pytest.skip(verdict["error"])
    return done.returncode, verdict


@pytest.mark.slow
def test_sglang_loads_every_weight_and_config_field_of_our_export(tmp_path: Path) -> None:
    python = sglang_python()
    tiny = export_drafter(trained_looking(tiny_config(block_size=4), seed=1), tmp_path / "tiny")
    wider_cfg = tiny_config(block_size=16, num_layers=3, target_layer_ids=[0, 1, 3])
    wider = export_drafter(trained_looking(wider_cfg, seed=2), tmp_path / "wider", mask_token="<|mask|>")
    renamed = with_renamed_weight(
        tiny, tmp_path / "renamed", "layers.1.mlp.up_proj.weight", "layers.1.mlp.up.weight"
    )
    code, verdict = run_sglang_check(python, [tiny, wider, renamed], tmp_path / "sglang-run")
    by_name = {Path(v["folder"]).name: v for v in verdict["exports"]}
    summary = {
        name: {"ok": v["ok"], "problems": v["problems"], **v["parameters"]} for name, v in by_name.items()
    }
    print(f"SGLang {verdict['sglang_version']}: {json.dumps(summary, indent=1)}", file=sys.stderr)

    for name in ("tiny", "wider"):
        export = by_name[name]
        assert export["ok"], f"SGLang mis-loads our export {name}: {export['problems']}"
        params = export["parameters"]
        # 2 + 8 per layer SGLang parameters (q/k/v and gate/up fused), 3 + 11 per layer tensors in the export.
        layers = export["config"]["num_hidden_layers"]["ours"]
        assert params["sglang_parameters"] == 3 + 8 * layers
        assert params["tensors_compared"] == params["export_tensors"] == 3 + 11 * layers
    assert by_name["wider"]["config"]["target_layer_ids"]["sglang"] == [0, 1, 3]
    assert by_name["wider"]["config"]["block_size"]["sglang"] == 16
    # The control: the renamed weight is skipped without a word by SGLang, and caught here.
    assert code == 1 and not verdict["ok"] and not by_name["renamed"]["ok"]
    control = by_name["renamed"]["parameters"]
    assert control["ignored_by_sglang"] == ["layers.1.mlp.up.weight"]
    assert control["not_loaded"] == ["layers.1.mlp.gate_up_proj.weight"]
    assert control["absent_from_export"] == ["layers.1.mlp.up_proj.weight"]


@pytest.mark.slow
def test_sglang_serves_an_fp32_export_in_bf16_with_the_printed_serve_commands_dtype(tmp_path: Path) -> None:
    """SGLang reads a float32 config as float16 under `--dtype auto`, a dtype the drafter never trained in;
    the serve command we print says `--dtype bfloat16`, which SGLang applies to the draft too."""
    python = sglang_python()
    fp32 = export_drafter(trained_looking(tiny_config(), seed=3), tmp_path / "fp32", dtype=torch.float32)
    assert "--dtype bfloat16" in (fp32 / "README.md").read_text()
    code, verdict = run_sglang_check(python, [fp32], tmp_path / "sglang-run", dtype="bfloat16")
    export = verdict["exports"][0]
    assert code == 0 and export["ok"], export["problems"]
    assert export["config"]["dtype"]["sglang"] == "bfloat16"
    assert export["parameters"]["tensors_compared"] == export["parameters"]["export_tensors"] == 25
