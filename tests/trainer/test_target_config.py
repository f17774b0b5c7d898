"""Reading a config must not import the trainer's model code or torch's compiler stack.

`dflash-doctor train` validates the config (trainer.config.load_config) before torchrun starts; importing
trainer.target / trainer.drafter there pulled in torch._dynamo, Inductor and flex attention: ~2 s of imports
on a CPU box and several more on the H200, paid before every launch. Only a fresh interpreter can tell what a
code path imports, so the probe runs in a subprocess; it runs once and probes twice, the second time after
importing the model code, which shows that the probe sees such imports (it is not vacuous).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import trainer.drafter
import trainer.target
import trainer.target_config
import trainer.tiny

REPO = Path(__file__).resolve().parents[2]

HEAVY_MODULES = ("torch._dynamo", "torch._inductor", "trainer.drafter", "trainer.attention", "trainer.target")

PROBE = f"""
import json, sys

def heavy() -> list[str]:
    return sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules)

from dflash_doctor.gate import load_training_config

load_training_config("tiny-cpu")
after_config = heavy()
import trainer.drafter
print(json.dumps({{"after_config": after_config, "after_drafter": heavy()}}))
"""


@pytest.fixture(scope="module")
def imported_heavy_modules() -> dict[str, list[str]]:
    """The heavy modules loaded in a fresh interpreter after the gate reads tiny-cpu, then after the drafter."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_gate_reads_the_config_without_the_compiler_stack(
    imported_heavy_modules: dict[str, list[str]],
) -> None:
    assert imported_heavy_modules["after_config"] == []


def test_the_probe_sees_the_compiler_stack_once_model_code_is_imported(
    imported_heavy_modules: dict[str, list[str]],
) -> None:
    assert {"torch._dynamo", "trainer.drafter", "trainer.attention"} <= set(
        imported_heavy_modules["after_drafter"]
    )


@pytest.mark.parametrize(
    ("module", "name"),
    [
        (trainer.tiny, "TINY"),
        (trainer.tiny, "RANDOM_PREFIX"),
        (trainer.tiny, "PRESETS"),
        (trainer.tiny, "is_embedded"),
        (trainer.tiny, "embedded_config"),
        (trainer.tiny, "tiny_qwen3_config"),
        (trainer.tiny, "qwen3_8b_config"),
        (trainer.target, "target_hf_config"),
        (trainer.drafter, "default_target_layer_ids"),
    ],
)
def test_the_old_import_names_still_work(module: object, name: str) -> None:
    """Callers and benches import these from their old homes; they must be the moved objects themselves."""
    assert getattr(module, name) is getattr(trainer.target_config, name)
