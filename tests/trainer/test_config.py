"""Config: every malformed field gives one clear error naming it, exit code 2, and no process group."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_doctor.errors import ConfigError
from trainer.config import SHIPPED_CONFIGS, apply_overrides, load_config, parse_config, resolve_config_path
from trainer.tiny import tiny_qwen3_config

REPO = Path(__file__).resolve().parents[2]

GOOD = """
[target]
path = "tiny"
[drafter]
layers = 1
block_size = 8
[data]
kind = "synthetic"
seq_len = 64
[optim]
steps = 10
batch_size = 2
anchors = 8
[output]
dir = "out"
"""


def _raw(text: str = GOOD) -> dict:
    import tomllib

    return tomllib.loads(text)


def test_a_good_config_parses_and_gets_target_defaults() -> None:
    cfg = load_config_text(GOOD)
    assert cfg.drafter.block_size == 8
    assert cfg.drafter.mask_token_id == tiny_qwen3_config().vocab_size - 1  # tiny: vocab - 1
    assert cfg.drafter.target_layer_ids == [2]  # 4-layer tiny target, 1 draft layer: the middle one
    assert cfg.world_size == 2


def load_config_text(text: str, tmp: Path | None = None) -> object:
    import tempfile

    folder = Path(tmp or tempfile.mkdtemp())
    path = folder / "run.toml"
    path.write_text(text)
    return load_config(path)


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("drafter", "block_size", '"sixteen"', 'drafter.block_size: must be an integer >= 2, got "sixteen"'),
        ("drafter", "block_size", "1", "drafter.block_size: must be an integer >= 2, got 1"),
        ("drafter", "layers", "0", "drafter.layers: must be an integer >= 1"),
        ("drafter", "layers", "true", "drafter.layers: must be an integer >= 1, got true"),
        ("drafter", "target_layer_ids", "[1, 1]", "drafter.target_layer_ids: must be a non-empty list"),
        ("drafter", "mask_token_id", "-1", "drafter.mask_token_id: must be an integer >= 0"),
        ("drafter", "attention", '"dense"', 'drafter.attention: must be one of "auto", "flex", "sdpa"'),
        ("target", "path", '""', "target.path: must be a non-empty string"),
        ("target", "dtype", '"int8"', "target.dtype: must be one of"),
        ("data", "kind", '"parquet"', "data.kind: must be one of"),
        ("data", "seq_len", "2.5", "data.seq_len: must be an integer >= 3, got 2.5"),
        ("data", "temperature", "0", "data.temperature: must be a number > 0.0"),
        ("topology", "targets", "0", "topology.targets: must be an integer >= 1"),
        ("topology", "in_flight", '"many"', "topology.in_flight: must be an integer >= 1"),
        ("optim", "lr", "-1.0", "optim.lr: must be a number > 0.0, got -1.0"),
        ("optim", "warmup_ratio", "1.5", "optim.warmup_ratio: must be a number >= 0.0 <= 1.0, got 1.5"),
        ("optim", "betas", "[0.9]", "optim.betas: must be two numbers in [0, 1)"),
        ("optim", "anchors", "0", "optim.anchors: must be an integer >= 1"),
        ("optim", "gamma", '"seven"', "optim.gamma: must be a number > 0.0"),
        ("precision", "autocast", '"fp8"', "precision.autocast: must be one of"),
        ("checkpoint", "keep", "0", "checkpoint.keep: must be an integer >= 1"),
        ("run", "device", '"tpu"', 'run.device: must be one of "auto", "cpu", "cuda", got "tpu"'),
        ("run", "seed", "-3", "run.seed: must be an integer >= 0"),
        ("drafter", "blocksize", "16", "drafter.blocksize: unknown key"),
    ],
)
def test_each_malformed_field_is_named(section: str, key: str, value: str, message: str) -> None:
    raw = apply_overrides(_raw(), [f"{section}.{key}={value}"])
    with pytest.raises(ConfigError) as err:
        parse_config(raw)
    assert message in err.value.message


def test_unknown_section_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"optimizer: unknown section"):
        parse_config({**_raw(), "optimizer": {"lr": 1.0}})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["optim.epochs=2"], "optim.steps: set exactly one of optim.steps and optim.epochs"),
        (['data.kind="jsonl"'], 'data.path: required when data.kind = "jsonl"'),
        (["data.seq_len=8"], "data.seq_len: must be > drafter.block_size (8), got 8"),
        (["drafter.target_layer_ids=[3, 1]"], "drafter.target_layer_ids: must be increasing"),
        (['target.path="random:qwen3-8b"'], 'data.kind: "synthetic" needs target.path = "tiny"'),
    ],
)
def test_fields_that_must_agree(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(apply_overrides(_raw(), overrides))
    assert message in err.value.message


@pytest.mark.parametrize(
    ("text_change", "message"),
    [
        ("target_layer_ids = [1, 4]", "drafter.target_layer_ids: must be < the target's 4 layers"),
        ("mask_token_id = 512", "drafter.mask_token_id: must be < the target's vocab size 512, got 512"),
    ],
)
def test_fields_checked_against_the_target(text_change: str, message: str, tmp_path: Path) -> None:
    text = GOOD.replace("block_size = 8", f"block_size = 8\n{text_change}")
    with pytest.raises(ConfigError) as err:
        load_config_text(text, tmp_path)
    assert message in err.value.message


def test_target_folder_without_config_json(tmp_path: Path) -> None:
    text = GOOD.replace('path = "tiny"', f'path = "{tmp_path}"').replace(
        'kind = "synthetic"', 'kind = "random"'
    )
    with pytest.raises(ConfigError, match=r"target.path: .* is not a Hugging Face model folder"):
        load_config_text(text, tmp_path)


def test_unknown_random_preset(tmp_path: Path) -> None:
    text = GOOD.replace('path = "tiny"', 'path = "random:llama-70b"').replace(
        'kind = "synthetic"', 'kind = "random"'
    )
    with pytest.raises(ConfigError, match=r'target.path: unknown embedded target "random:llama-70b"'):
        load_config_text(text, tmp_path)


def test_shipped_configs_all_load() -> None:
    names = sorted(p.stem for p in SHIPPED_CONFIGS.glob("*.toml"))
    assert {"tiny-cpu", "tiny-cpu-2t1d", "qwen3-8b-b16", "seed-b32", "qwen3-8b-5t3d"} <= set(names)
    for name in names:
        cfg = load_config(name)
        assert cfg.drafter.target_layer_ids
    assert load_config("qwen3-8b-b16").drafter.target_layer_ids == [1, 9, 17, 25, 33]
    assert load_config("qwen3-8b-b16").drafter.mask_token_id == 151669


def test_config_names_resolve_to_shipped_files() -> None:
    assert resolve_config_path("tiny-cpu") == SHIPPED_CONFIGS / "tiny-cpu.toml"
    assert resolve_config_path("configs/tiny-cpu.toml").name == "tiny-cpu.toml"
    with pytest.raises(ConfigError, match="no shipped config"):
        resolve_config_path("no-such-config")


def test_bad_config_exits_2_before_any_process_group(tmp_path: Path) -> None:
    """`python -m trainer --config bad.toml`: exit 2, the field named, and no torchrun/process group."""
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD.replace("block_size = 8", 'block_size = "sixteen"'))
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "INFO"}
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", str(bad)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert 'drafter.block_size: must be an integer >= 2, got "sixteen"' in proc.stderr
    assert "Traceback" not in proc.stderr
    # torchrun would announce itself and a process group would log its store; neither happened
    assert "torch.distributed" not in proc.stderr and "ProcessGroup" not in proc.stderr


def test_bad_config_in_process_never_reaches_torchrun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    import torch.distributed as dist

    import trainer.__main__ as entry

    def no_launch(*_args: object) -> None:
        raise AssertionError("torchrun must not start for a bad config")

    monkeypatch.setattr(entry, "relaunch_under_torchrun", no_launch)
    monkeypatch.delenv("RANK", raising=False)
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD)
    assert entry.main(["--config", str(bad), "--set", "run.device=tpu"]) == 2
    assert "run.device: must be one of" in capsys.readouterr().err
    assert not dist.is_initialized()


def _every_field() -> list[tuple[str, str]]:
    from trainer.config import SCHEMA

    return [(section, key) for section, (_, parsers) in SCHEMA.items() for key in parsers]


@pytest.mark.parametrize(("section", "key"), _every_field())
def test_every_field_rejects_a_wrong_type_by_name(section: str, key: str) -> None:
    """No field accepts a table where a value belongs, and the error always starts with the field's name."""
    raw = _raw()
    raw.setdefault(section, {})[key] = {"oops": 1}
    with pytest.raises(ConfigError) as err:
        parse_config(raw)
    assert err.value.message.startswith(f"{section}.{key}: must be "), err.value.message
    assert '{"oops": 1}' in err.value.message


@pytest.mark.parametrize(
    ("content", "kind", "message"),
    [
        (None, "jsonl", "cannot read"),
        ('{"input_ids": [1, 2]}\n', "jsonl", "'loss_mask'"),
        ("not json\n", "jsonl", "not JSON"),
        ("\n\n", "jsonl", "holds no records"),
        ('{"text": "hi"}\n', "jsonl", "'input_ids'"),
    ],
)
def test_data_file_mistakes_are_config_errors_before_anything_starts(
    tmp_path, content, kind, message
) -> None:
    from dflash_doctor.errors import ConfigError
    from trainer.config import load_config

    data = tmp_path / "data.jsonl"
    if content is not None:
        data.write_text(content)
    with pytest.raises(ConfigError, match=message) as caught:
        load_config("tiny-cpu", [f"data.kind='{kind}'", f"data.path='{data}'"])
    assert str(caught.value).startswith("data.path")
