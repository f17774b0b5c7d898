"""Before launch: the warm-up child sees the training shapes (overrides included) on every drafter device."""

from __future__ import annotations

from pathlib import Path

from dflash_doctor.cache.warm import WarmShapes, child_command
from dflash_doctor.launcher import _config_with_overrides
from trainer.config import load_config, resolve_config_path


def test_overrides_reach_the_warm_up_config() -> None:
    path = resolve_config_path("tiny-cpu")
    overrides = ["optim.anchors=32", "drafter.block_size=4", "output.dir='/tmp/x y'"]
    written = _config_with_overrides(path, tuple(overrides))
    assert written != path
    assert load_config(written) == load_config(path, overrides)
    assert _config_with_overrides(path, ()) == path


def test_child_warms_each_drafter_device_in_turn() -> None:
    command = child_command(
        "/py", "cuda", WarmShapes(), config=Path("/c.toml"), trainer_devices=("cuda:5", "cuda:6")
    )
    assert command[command.index("--config") + 1] == "/c.toml"
    assert [command[i + 1] for i, a in enumerate(command) if a == "--trainer-device"] == ["cuda:5", "cuda:6"]
    assert "--trainer-device" not in child_command("/py", "cpu", WarmShapes(), trainer_devices=("cuda:1",))
