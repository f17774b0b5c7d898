"""`data regenerate --json` carries the engine's own figures, and on a GPU whose peaks are known the decode's
rate beside its roofline (issue 36 §1: "the rate printed and in --json beside its roofline"); it had only
the whole job's tok/s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.lib.target_folder import make_target_folder
from trainer.regenerate.job import regenerate, scan_input
from trainer.regenerate.kv_engine import KVEngine
from trainer.regenerate.settings import GenerationSettings


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_target_folder(tmp_path_factory.mktemp("target"))


def test_the_kv_engine_states_its_roofline_where_the_gpu_is_known(target: Path) -> None:
    engine = KVEngine(GenerationSettings(str(target), max_new_tokens=6), "cpu", slots=4)
    engine.generate([[{"role": "user", "content": f"w{i} w{i + 1}"}] for i in range(6)])
    assert engine.report()["roofline"] is None  # a CPU: no made-up peaks
    assert engine.roofline("NVIDIA RTX 9999") is None  # a GPU not in the table
    h200 = engine.roofline("NVIDIA H200")
    assert h200 is not None and h200["roofline_tok_s"] > 0 and h200["bytes_read_gb"] > 0
    assert h200["decode_tok_s"] > 0  # a CPU's rate against an H200's bound: a share that rounds to ~0
    assert h200["share_of_roofline"] == round(h200["decode_tok_s"] / h200["roofline_tok_s"], 4)


def test_the_regenerate_summary_carries_the_engine_report(target: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"w{i}"}) + "\n" for i in range(5)))
    settings = GenerationSettings(str(target), max_new_tokens=5)
    summary = regenerate(
        scan_input(prompts, "stop"),
        tmp_path / "out.jsonl",
        settings,
        lambda: KVEngine(settings, "cpu", slots=2),
    )
    engine = summary.to_json()["engine"]
    assert engine is not None and engine["generated_tokens"] == summary.generated_tokens
    assert engine["decode_steps"] >= 5 and "roofline" in engine
