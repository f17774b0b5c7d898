"""bench/kernels/flex_sweep.py's own logic: reading Inductor's AUTOTUNE tables and building the "combined" row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.kernels.flex_sweep import Row, autotune_tables, combined_row

INDUCTOR_OUTPUT = """\
W1130 compile noise
AUTOTUNE flex_attention(1x32x8192x128, 1x8x11264x128)
strides: [33554432, 1048576, 128, 1], [11534336, 1441792, 128, 1]
dtypes: torch.bfloat16, torch.bfloat16
  triton_flex_attention_31 7.9774 ms 100.0% BLOCK_M=64, BLOCK_N=64, num_stages=3, num_warps=4
  triton_flex_attention_28 8.6906 ms 91.8% BLOCK_M=128, BLOCK_N=128, num_stages=2, num_warps=8
SingleProcess AUTOTUNE benchmarking takes 1.2 seconds
more noise
"""


def test_autotune_tables_keep_the_header_and_the_ranked_choices_only() -> None:
    lines = autotune_tables(INDUCTOR_OUTPUT)
    assert lines[0].startswith("AUTOTUNE flex_attention(")
    assert lines[-1].strip().startswith("triton_flex_attention_28")
    assert len(lines) == 5 and not any("noise" in line or "benchmarking" in line for line in lines)


def _row(name: str, fwd: float, bwd: float, options: dict | None = None, **extra: object) -> dict:
    return {"row": name, "options": options or {}, "pad_kv": False, "mode": None, "fwd_ms": fwd, "bwd_ms": bwd,
            "total_ms": fwd + bwd, "wrong": False, **extra}  # fmt: skip


def test_combined_row_takes_the_best_forward_and_backward_tiles_and_helpful_flags() -> None:
    rows = [
        _row("default", 28.0, 76.0),
        _row("fwd a", 25.0, 76.5, {"fwd_BLOCK_M": 64, "fwd_BLOCK_N": 64}),
        _row("bwd a", 28.1, 70.0, {"bwd_BLOCK_M1": 32, "bwd_num_warps": 4}),
        _row("prescale", 27.0, 75.0, {"PRESCALE_QK": True}),  # 2% faster: kept
        _row("tma", 27.9, 76.0, {"USE_TMA": True}),  # 0.1%: not kept
        _row("rows safe", 20.0, 60.0, {"ROWS_GUARANTEED_SAFE": True}, wrong=True),  # NaN: never kept
        {**_row("pad kv", 26.0, 68.0), "pad_kv": True},
    ]
    combined = combined_row(rows)
    assert isinstance(combined, Row) and combined.name == "combined"
    assert combined.options == {
        "fwd_BLOCK_M": 64, "fwd_BLOCK_N": 64, "bwd_BLOCK_M1": 32, "bwd_num_warps": 4, "PRESCALE_QK": True,
    }  # fmt: skip
    assert combined.pad_kv  # padding helped by more than 1%


def test_no_combined_row_without_a_default_or_without_anything_new() -> None:
    assert combined_row([_row("fwd a", 25.0, 76.5, {"fwd_BLOCK_M": 64})]) is None
    assert combined_row([_row("default", 28.0, 76.0), _row("tma", 27.9, 76.0, {"USE_TMA": True})]) is None


@pytest.mark.slow
def test_cpu_dry_run_writes_rows_that_agree_with_the_default(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "bench.kernels.flex_sweep", "--tiny", "--out", str(out)],
        cwd=repo, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["row"] for r in rows] == ["default", "pad kv"]
    assert all(r["max_abs_diff"] < 1e-4 and not r["wrong"] for r in rows)  # the padded layout changes nothing
