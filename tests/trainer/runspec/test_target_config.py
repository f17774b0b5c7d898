"""Reading a config must not import the trainer's model code, torch, or (where config.json says enough)
transformers.

`dflash-doctor train` validates the config (trainer.runspec.config.load_config) before torchrun starts; importing
trainer.target_model.capture / trainer.model.drafter there pulled in torch._dynamo, Inductor and flex attention, and
transformers pulls in torch: on the H200 machine `from transformers import Qwen3Config` alone took 13-14 s,
paid before every launch. Only a fresh interpreter can tell what a
code path imports, so the probe runs in a subprocess; it runs once and probes twice, the second time after
importing the model code, which shows that the probe sees such imports (it is not vacuous).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

HEAVY_MODULES = (
    "torch",
    "transformers",
    "torch._dynamo",
    "torch._inductor",
    "trainer.model.drafter",
    "trainer.model.attention",
    "trainer.target_model.capture",
)

PROBE = f"""
import json, sys

def heavy() -> list[str]:
    return sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules)

from dflash_doctor.launch.gate import load_training_config

load_training_config("tiny-cpu")
load_training_config("qwen3-8b-b16")
after_config = heavy()
import trainer.model.drafter
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


def test_gate_reads_the_config_without_torch_or_transformers(
    imported_heavy_modules: dict[str, list[str]],
) -> None:
    assert imported_heavy_modules["after_config"] == []


def test_the_probe_sees_the_compiler_stack_once_model_code_is_imported(
    imported_heavy_modules: dict[str, list[str]],
) -> None:
    assert {"torch", "torch._dynamo", "trainer.model.drafter", "trainer.model.attention"} <= set(
        imported_heavy_modules["after_drafter"]
    )


@pytest.mark.parametrize("path", ["tiny", "random:qwen3-8b"])
def test_embedded_shapes_match_what_transformers_builds(path: str) -> None:
    """One source of truth: the shapes read without transformers are those of the model the trainer builds."""
    from trainer.runspec.target_shapes import TargetShapes, target_hf_config, target_shapes

    assert target_shapes(path) == TargetShapes.from_config(target_hf_config(path))


QWEN3_JSON = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
}


def test_a_complete_config_json_is_read_without_transformers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer.runspec import target_shapes as target_config

    (tmp_path / "config.json").write_text(json.dumps(QWEN3_JSON))
    asked: list[str] = []
    monkeypatch.setattr(target_config, "target_hf_config", lambda path: asked.append(path))
    shapes = target_config.target_shapes(str(tmp_path))
    assert (
        asked == []
        and shapes.num_hidden_layers == 6
        and shapes.head_dim == 16
        and not shapes.tie_word_embeddings
    )


@pytest.mark.parametrize("missing", ["head_dim", "tie_word_embeddings", "max_position_embeddings"])
def test_an_incomplete_config_json_asks_transformers_for_the_class_defaults(
    tmp_path: Path, missing: str
) -> None:
    """transformers knows each class's defaults (Qwen3: head_dim 128, untied embeddings); we do not guess."""
    from trainer.runspec.target_shapes import TargetShapes, target_hf_config, target_shapes

    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in QWEN3_JSON.items() if k != missing}))
    shapes = target_shapes(str(tmp_path))
    assert shapes == TargetShapes.from_config(target_hf_config(str(tmp_path)))
    assert shapes.head_dim == (128 if missing == "head_dim" else 16)


@pytest.mark.parametrize("content", ["{", "[1, 2]", json.dumps({**QWEN3_JSON, "num_hidden_layers": "6"})])
def test_a_broken_config_json_is_a_config_error(tmp_path: Path, content: str) -> None:
    """Exit 2 with the file named, not a traceback from transformers."""
    from dflash_base.errors import ConfigError
    from trainer.runspec.target_shapes import target_shapes

    (tmp_path / "config.json").write_text(content)
    with pytest.raises(ConfigError, match=re.escape(str(tmp_path / "config.json"))):
        target_shapes(str(tmp_path))


def test_unknown_targets_name_what_is_known(tmp_path: Path) -> None:
    from dflash_base.errors import ConfigError
    from trainer.runspec.target_shapes import target_shapes

    with pytest.raises(ConfigError, match=r'unknown embedded target "random:nope".*"random:qwen3-8b"'):
        target_shapes("random:nope")
    with pytest.raises(ConfigError, match=r"no config\.json"):
        target_shapes(str(tmp_path))
