"""bench/kernels/dflash_attention.py: its error measure, and its CPU dry run through Triton's interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.kernels.dflash_attention import TOLERANCE, relative_error


def test_relative_error_is_scaled_by_the_reference_and_catches_one_wrong_entry() -> None:
    expected = torch.tensor([[0.0, 2.0], [-4.0, 1e-6]])
    assert relative_error(expected.clone(), expected) == 0.0
    wrong = expected.clone()
    wrong[1, 1] = 0.2  # tiny reference entry, wrong by 5% of the tensor's scale
    assert relative_error(wrong, expected) == pytest.approx(0.05, rel=1e-3)
    assert relative_error(wrong, expected) > TOLERANCE
    assert relative_error(expected + 0.01, expected) < TOLERANCE  # 0.25% of the scale: within bf16 noise


@pytest.mark.slow
def test_cpu_dry_run_writes_a_triton_row_equal_to_the_exact_path(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    out = tmp_path / "dflash.json"
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "bench.kernels.dflash_attention", "--device", "cpu", "--tiny", "--json", str(out)],
        cwd=repo, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert [r["row"] for r in result["rows"]] == ["sdpa (exact)", "triton"]
    assert result["rows"][1]["worst_rel_err"] < 1e-5 and not result["rows"][1]["wrong"]
    assert set(result["rows"][1]["rel_err"]) == {"out", "dq", "dk", "dv"}
