"""What the slow interop tests share: the engine's python (or a skip saying why), trained-looking tiny
exports, and `dflash-doctor serve-check --json` run on one."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from dflash_doctor.cli import run
from tests.trainer.drafter_fixtures import tiny_drafter
from trainer.model.drafter import DFlashDrafter, DrafterConfig

# `DFLASH_<ENGINE>_PYTHON` names another python; the default is the venv this project's machines have.
INSTALL = {
    "vllm": "python3 -m venv /work/venvs/vllm && /work/venvs/vllm/bin/pip install vllm==0.33.0",
    "sglang": "python3 -m venv /work/venvs/sglang && /work/venvs/sglang/bin/pip install sglang==0.5.23",
}


def engine_python(engine: str) -> str:
    """The python that has `engine`, or a skip that says how to get one."""
    variable = f"DFLASH_{engine.upper()}_PYTHON"
    chosen = os.environ.get(variable) or f"/work/venvs/{engine}/bin/python"
    if not os.access(chosen, os.X_OK) or not Path(chosen).is_file():
        pytest.skip(
            f"no python with {engine} at {chosen}: set {variable}, or install one with `{INSTALL[engine]}`"
        )
    return chosen


def trained_looking(cfg: DrafterConfig, seed: int) -> DFlashDrafter:
    """A drafter whose every weight differs from its initial value (norms included, which start at ones)."""
    model = tiny_drafter(cfg, seed=seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=gen))
    return model


def serve_check(
    capsys: pytest.CaptureFixture[str], engine: str, export: Path
) -> tuple[int, dict[str, Any], dict[str, dict[str, Any]]]:
    """Exit code, the --json report and its findings by id; a skip when the engine could not check."""
    python = engine_python(engine)
    code = run(["serve-check", "--export", str(export), "--engine", engine, "--python", python, "--json"])
    report = json.loads(capsys.readouterr().out)
    with capsys.disabled():  # the engine's version and every check, for `pytest -s`
        print(json.dumps({"exit_code": code, "findings": report["findings"]}, indent=1))
    by_id = {f["id"]: f for f in report["findings"]}
    load = by_id[f"serve.{engine}.load"]
    if load["severity"] == "skip":
        pytest.skip(f"{load['summary']}: {load['evidence'].get('error')}")
    return code, report, by_id
