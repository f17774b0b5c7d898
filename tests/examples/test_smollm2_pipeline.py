"""The product's pipeline on a real trained model, on a CPU (slow tier; skipped, saying why, without the
`real-target` extra): prepare SmolLM2-135M-Instruct, `data regenerate` a few answers by the target itself,
`data preview`, `train` (held-out on), `eval` on held-out conversations and HumanEval prompts beside prompt lookup.

What it asserts is what a 2-core CPU can show in ~15 minutes: every command works on a Llama target with a
49k vocabulary and no mask token; fp32 decoding with the drafter and with prompt lookup is bitwise target-only
greedy (`--strict`); the held-out estimate (the decoding walk) agrees with real decoding on the same held-out
conversations. What the drafter is worth against prompt lookup takes more data and training than a CPU gives in
that time: that is measured on an H200 (BENCHMARKS.md, "A real target").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from examples.smollm2 import sources

REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str, cwd: Path, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "2", "COLUMNS": "200"}  # torch's threads on a 2-core box
    return subprocess.run([sys.executable, "-m", "dflash_doctor", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


@pytest.mark.slow
def test_the_pipeline_on_smollm2_from_prompts_to_eval(tmp_path: Path) -> None:
    if missing := sources.missing_modules():
        pytest.skip(f"needs the real-target extra (missing: {', '.join(missing)})")
    out = tmp_path / "runs" / "smollm2-135m"
    prepared = subprocess.run(
        [sys.executable, str(REPO / "examples/smollm2/prepare.py"), "--out", str(out), "--limit", "40"],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    config = tmp_path / "small.toml"  # the shipped recipe, shrunk to what a CPU trains in minutes
    config.write_text(
        (REPO / "trainer/configs/smollm2-135m.toml").read_text().replace("runs/smollm2-135m", str(out))
    )
    small = ["drafter.layers=1", "data.seq_len=320", "optim.anchors=32", "optim.batch_size=2",
             "optim.grad_accum=1", "optim.steps=30", "data.eval_fraction=0.2", "eval.every=15",
             "checkpoint.every=0", "run.log_every=5"]  # fmt: skip
    sets = [item for s in small for item in ("--set", s)]
    data = out / "data" / "train.jsonl"
    regen = _cli("data", "regenerate", "--config", str(config), "--prompts", str(out / "prompts/train.jsonl"),
                 "--out", str(data), "--max-new-tokens", "96", "--engine", "torch", "--json", cwd=tmp_path)  # fmt: skip
    assert regen.returncode == 0, regen.stderr[-3000:]
    assert json.loads(regen.stdout)["written"] == 40
    preview = _cli("data", "preview", "--config", str(config), *sets, "--json", cwd=tmp_path)
    assert preview.returncode == 0, preview.stderr[-3000:]
    assert 0.2 < json.loads(preview.stdout)["counts"]["supervised_share"] < 0.9
    train = _cli("train", "--config", str(config), *sets, "--no-deep", cwd=tmp_path)
    assert train.returncode == 0, (train.stdout + train.stderr)[-3000:]
    summary = json.loads((out / "run" / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["heldout_accept_len"] is not None
    export = str(out / "run" / "export")
    heldout = _cli("eval", "--export", export, "--config", str(config), *sets, "--num-prompts", "8",
                   "--max-new-tokens", "48", "--dtype", "fp32", "--strict", "--json", cwd=tmp_path)  # fmt: skip
    assert heldout.returncode == 0, heldout.stderr[-3000:]
    report = json.loads(heldout.stdout)
    assert (
        report["identical"] and report["baseline"]["identical"]
    )  # both drafters: target-only greedy, bitwise
    assert report["differences"] == report["ties"] == 0
    # The estimate the run printed against real decoding of the same held-out conversations (eval cuts each
    # answer at 48 tokens, the estimate walks whole answers of up to 96: close, not equal).
    assert abs(summary["heldout_accept_len"] - report["mean_accept_len"]) <= 0.15 * report["mean_accept_len"]
    humaneval = _cli("eval", "--export", export, "--config", str(config), *sets,
                     "--prompts", str(out / "prompts/humaneval.jsonl"), "--num-prompts", "4",
                     "--max-new-tokens", "48", "--dtype", "fp32", "--strict", "--json", cwd=tmp_path)  # fmt: skip
    assert humaneval.returncode == 0, humaneval.stderr[-3000:]
    he = json.loads(humaneval.stdout)
    assert (
        he["identical"] and he["baseline"]["drafter"] == "ngram" and he["baseline"]["mean_accept_len"] > 1.0
    )
