"""Config: every malformed field gives one clear error naming it, exit code 2, and no process group."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_base.errors import ConfigError
from trainer.data.sources import split_data
from trainer.runspec.config import load_config, parse_config
from trainer.runspec.config_file import SHIPPED_CONFIGS, apply_overrides, resolve_config_path
from trainer.runspec.target_shapes import tiny_qwen3_config

REPO = Path(__file__).resolve().parents[3]

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
    assert cfg.topology.mode == "auto" and cfg.world_size == 1  # auto, no split asked: one colocated rank


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
        ("data", "workers", "-1", 'data.workers: must be "auto" or an integer >= 0 <= 64, got -1'),
        ("data", "workers", "65", 'data.workers: must be "auto" or an integer >= 0 <= 64, got 65'),
        ("data", "workers", '"many"', 'data.workers: must be "auto" or an integer >= 0 <= 64, got "many"'),
        ("data", "workers", "true", 'data.workers: must be "auto" or an integer >= 0 <= 64, got true'),
        ("data", "workers", "1.5", 'data.workers: must be "auto" or an integer >= 0 <= 64, got 1.5'),
        ("topology", "targets", "0", "topology.targets: must be an integer >= 1"),
        ("topology", "mode", '"colocate"', 'topology.mode: must be one of "auto", "split", "colocated", got'),
        ("topology", "ranks", "0", "topology.ranks: must be an integer >= 1"),
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


def test_data_workers_is_auto_by_default_or_a_count() -> None:
    assert parse_config(_raw()).data.workers == "auto"
    for value, parsed in (("0", 0), ("3", 3), ('"auto"', "auto")):
        assert parse_config(apply_overrides(_raw(), [f"data.workers={value}"])).data.workers == parsed


def test_unknown_section_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"optimizer: unknown section"):
        parse_config({**_raw(), "optimizer": {"lr": 1.0}})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["optim.steps=5", "optim.epochs=2"], "optim.steps: set exactly one of optim.steps and optim.epochs"),
        (['data.kind="jsonl"'], 'data.path: required when data.kind = "jsonl"'),
        (["data.seq_len=8"], "data.seq_len: must be > drafter.block_size (8), got 8"),
        (["drafter.target_layer_ids=[3, 1]"], "drafter.target_layer_ids: must be increasing"),
        (['target.path="random:qwen3-8b"'], 'data.kind: "synthetic" needs target.path = "tiny"'),
        (
            ['topology.mode="colocated"', "topology.drafters=2"],
            "topology.drafters: sets a split, but topology.mode",
        ),
        (["topology.targets=2", "topology.ranks=4"], "topology.ranks: 4, but the split 2 + 1 is 3 ranks"),
    ],
)
def test_fields_that_must_agree(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(apply_overrides(_raw(), overrides))
    assert message in err.value.message


@pytest.mark.parametrize(
    ("text_change", "message"),
    [
        (
            "target_layer_ids = [1, 4]",
            "drafter.target_layer_ids: must be <= 2 (L-2 of the target's 4 layers)",
        ),
        ("target_layer_ids = [1, 3]", "got [1, 3]: the engines capture layer L-1 after the final norm"),
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


PREPARED_TARGET_CONFIGS = {"smollm2-135m"}


def test_shipped_configs_all_load() -> None:
    names = sorted(p.stem for p in SHIPPED_CONFIGS.glob("*.toml"))
    assert {"tiny-cpu", "tiny-cpu-2t1d", "qwen3-8b-b16", "seed-b32", "qwen3-8b-5t3d"} <= set(names)
    # smollm2-135m trains a real target that examples/smollm2/prepare.py writes (the real-target extra):
    # tests/examples/test_smollm2_prepare.py parses it, and loads it against a prepared folder (slow)
    for name in (n for n in names if n not in PREPARED_TARGET_CONFIGS):
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
    from trainer.runspec.config import SCHEMA

    tables = {("data", "chat_template_kwargs")}  # any table is valid there (its wrong types: test_chat.py)
    return [(s, key) for s, (_, parsers) in SCHEMA.items() for key in parsers if (s, key) not in tables]


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
    from dflash_base.errors import ConfigError
    from trainer.runspec.config import load_config

    data = tmp_path / "data.jsonl"
    if content is not None:
        data.write_text(content)
    with pytest.raises(ConfigError, match=message) as caught:
        load_config("tiny-cpu", [f"data.kind='{kind}'", f"data.path='{data}'"])
    assert str(caught.value).startswith("data.path")


# ---------------------------------------------------------------- drafter.flex_kernel_options


def test_flex_kernel_options_parse_from_a_toml_table_and_an_override() -> None:
    text = GOOD.replace(
        "block_size = 8",
        "block_size = 8\nflex_kernel_options = {USE_TMA = true, BLOCK_M = 64, num_stages = 3}",
    )
    assert parse_config(_raw(text)).drafter.flex_kernel_options == {
        "USE_TMA": True,
        "BLOCK_M": 64,
        "num_stages": 3,
    }
    options = "{fwd_BLOCK_N=128, bwd_BLOCK_M1=16, bwd_num_warps=8, bwd_USE_TMA=false, PRESCALE_QK=true}"
    cfg = parse_config(apply_overrides(_raw(), [f"drafter.flex_kernel_options={options}"]))
    assert cfg.drafter.flex_kernel_options == {
        "fwd_BLOCK_N": 128, "bwd_BLOCK_M1": 16, "bwd_num_warps": 8, "bwd_USE_TMA": False, "PRESCALE_QK": True
    }  # fmt: skip
    assert parse_config(_raw()).drafter.flex_kernel_options == {}  # the default: torch's own choices
    assert cfg.to_dict()["drafter"]["flex_kernel_options"] == cfg.drafter.flex_kernel_options


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("true", "drafter.flex_kernel_options: must be a table of flex_attention kernel options"),
        (
            "{USE_TMA=true, BLOCK_K=64}",
            "drafter.flex_kernel_options: must be a table of flex_attention kernel options, like "
            '{USE_TMA = true, BLOCK_M = 64}, got {"USE_TMA": true, "BLOCK_K": 64}: unknown option "BLOCK_K" '
            "(known: USE_TMA, PRESCALE_QK,",
        ),
        ("{use_tma=true}", 'unknown option "use_tma"'),
        ("{bwd_BLOCK_M=32}", 'unknown option "bwd_BLOCK_M"'),
        ("{USE_TMA=1}", "drafter.flex_kernel_options.USE_TMA: must be true or false, got 1"),
        ('{PRESCALE_QK="yes"}', 'drafter.flex_kernel_options.PRESCALE_QK: must be true or false, got "yes"'),
        (
            "{BLOCK_M=true}",
            "drafter.flex_kernel_options.BLOCK_M: must be a power of two from 16 to 128, got true",
        ),
        (
            "{BLOCK_N=48}",
            "drafter.flex_kernel_options.BLOCK_N: must be a power of two from 16 to 128, got 48",
        ),
        (
            "{fwd_BLOCK_M=256}",
            "drafter.flex_kernel_options.fwd_BLOCK_M: must be a power of two from 16 to 128",
        ),
        (
            "{bwd_BLOCK_N2=8}",
            "drafter.flex_kernel_options.bwd_BLOCK_N2: must be a power of two from 16 to 128",
        ),
        (
            "{BLOCK_M=64.0}",
            "drafter.flex_kernel_options.BLOCK_M: must be a power of two from 16 to 128, got 64.0",
        ),
        ("{num_warps=3}", "drafter.flex_kernel_options.num_warps: must be one of 1, 2, 4, 8, 16, got 3"),
        ("{fwd_num_warps=false}", "drafter.flex_kernel_options.fwd_num_warps: must be one of 1, 2, 4, 8, 16"),
        ("{num_stages=0}", "drafter.flex_kernel_options.num_stages: must be an integer >= 1 <= 8, got 0"),
        (
            "{bwd_num_stages=9}",
            "drafter.flex_kernel_options.bwd_num_stages: must be an integer >= 1 <= 8, got 9",
        ),
        (
            "{USE_TMA=true, ROWS_GUARANTEED_SAFE=true}",
            "drafter.flex_kernel_options.ROWS_GUARANTEED_SAFE: refused: it made flex return NaN",
        ),
    ],
)
def test_flex_kernel_options_mistakes_are_named(value: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(apply_overrides(_raw(), [f"drafter.flex_kernel_options={value}"]))
    assert message in err.value.message, err.value.message


def test_unknown_kernel_option_lists_every_known_one() -> None:
    from trainer.runspec.fields import FLEX_KERNEL_OPTIONS

    with pytest.raises(ConfigError) as err:
        parse_config(apply_overrides(_raw(), ["drafter.flex_kernel_options={TMA=true}"]))
    assert all(key in err.value.message for key in FLEX_KERNEL_OPTIONS)
    assert "remove it or correct its spelling" in err.value.message


@pytest.mark.parametrize("value", ["true", "false"])
def test_removed_flex_tma_says_what_replaces_it(value: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(apply_overrides(_raw(), [f"drafter.flex_tma={value}"]))
    assert err.value.message.startswith(
        "drafter.flex_tma: removed; write drafter.flex_kernel_options = {USE_TMA = true}"
    )


def test_no_shipped_config_sets_flex_tma() -> None:
    for path in SHIPPED_CONFIGS.glob("*.toml"):
        assert "flex_tma" not in path.read_text(), path


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("drafter.flex_kernel_options={USE_TMA=true, BLOCK_M=32}", {"USE_TMA": True, "BLOCK_M": 32}),
        ("drafter.flex_kernel_options={}", None),
    ],
)
def test_build_drafter_hands_the_kernel_options_to_every_layer(override: str, expected: dict | None) -> None:
    import torch

    from trainer.model.build import build_drafter
    from trainer.runspec.target_shapes import target_hf_config

    cfg = load_config("tiny-cpu", ["drafter.layers=2", override])
    hf_config = target_hf_config(cfg.target.path)
    frozen = torch.zeros(int(hf_config.vocab_size), int(hf_config.hidden_size))
    model = build_drafter(cfg, hf_config, frozen, frozen, torch.device("cpu"))
    assert len(model.layers) == 2
    for layer in model.layers:
        assert layer.self_attn.flex_options == expected
    if expected is not None:
        assert model.layers[0].self_attn.flex_options is not cfg.drafter.flex_kernel_options  # a copy


def test_config_to_toml_reads_back_the_same_config_for_every_shipped_preset() -> None:
    import tomllib

    from trainer.runspec.config_file import SHIPPED_CONFIGS, apply_overrides, config_to_toml, read_raw

    for path in sorted(SHIPPED_CONFIGS.glob("*.toml")):
        raw = apply_overrides(read_raw(path), ["drafter.flex_kernel_options={fwd_USE_TMA=true, BLOCK_N=64}"])
        assert tomllib.loads(config_to_toml(raw)) == raw, path.name


@pytest.mark.parametrize(
    ("overrides", "world_size", "resolved"),
    [
        ([], 1, {"mode": "colocated", "targets": 1, "drafters": 1}),
        (['topology.mode="colocated"'], 3, {"mode": "colocated", "targets": 3, "drafters": 3}),
        (['topology.mode="split"'], 2, {"mode": "split", "targets": 1, "drafters": 1}),
        (["topology.targets=2"], 3, {"mode": "split", "targets": 2, "drafters": 1}),  # auto + targets: split
    ],
)
def test_topology_resolves_from_mode_and_process_count(
    overrides: list[str], world_size: int, resolved: dict
) -> None:
    from trainer.runspec.topology import resolve_topology

    cfg = parse_config(apply_overrides(_raw(), overrides))
    assert resolve_topology(cfg.topology, world_size).to_json().items() >= resolved.items()


def test_topology_refuses_a_process_count_it_cannot_use() -> None:
    from trainer.runspec.topology import resolve_topology

    split = parse_config(apply_overrides(_raw(), ['topology.mode="split"'])).topology
    with pytest.raises(ConfigError, match=r"use --nproc-per-node 2"):
        resolve_topology(split, 3)
    colocated = parse_config(apply_overrides(_raw(), ["topology.ranks=2"])).topology
    with pytest.raises(ConfigError, match=r"topology.ranks: 2 colocated ranks, but torchrun started 4"):
        resolve_topology(colocated, 4)


def test_held_out_data_smaller_than_a_batch_is_scored_in_one_padded_batch(tmp_path: Path) -> None:
    """It was refused ("fewer than one batch") while held-out scoring ran whole batches only; since issue 38
    D8 the last batch is padded with unsupervised rows, so a small held-out share is scored whole."""
    cfg = load_config("tiny-cpu", ["data.num_samples=64"])  # 10%: 6 held out, batches of 8
    split = split_data(cfg)
    assert (len(split.eval_ids), split.eval_batches) == (6, 1)
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text('{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}\n' * 3)
    train_file = tmp_path / "train.jsonl"
    train_file.write_text('{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}\n' * 40)
    overrides = [
        'data.kind="jsonl"',
        f'data.path="{train_file}"',
        "data.eval_fraction=0.0",
        "data.seq_len=16",
    ]
    small = load_config("tiny-cpu", [*overrides, f'data.eval_path="{eval_file}"'])
    assert (len(split_data(small).eval_ids), split_data(small).eval_batches) == (3, 1)
    assert load_config("tiny-cpu", [*overrides, f'data.eval_path="{eval_file}"', "optim.batch_size=2"])
