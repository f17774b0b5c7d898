"""The trainer's doorway for `dflash_doctor`: the only module besides the torch-free `trainer.spec` that the
doctor may import, and only lazily (from a command's body, or the warm-up child), because importing it
imports torch. What the doctor's commands call lives here by name; the trainer's insides stay free to move.
"""

from __future__ import annotations

from trainer.data.preview import preview
from trainer.decode.eval import EvalReport, run_eval
from trainer.decode.generation import (
    DevicePool,
    GenerationSettings,
    TorchEngine,
    VllmEngine,
    engine_factory,
    local_devices,
    vllm_available,
)
from trainer.decode.kv_engine import KVEngine, torch_engine
from trainer.decode.regenerate import (
    check_prompt_lengths,
    check_supervisable,
    prepare_regeneration,
    regenerate,
    scan_input,
)
from trainer.decode.report import format_report
from trainer.run.warmup import warm_up

__all__ = [
    "DevicePool",
    "EvalReport",
    "GenerationSettings",
    "KVEngine",
    "TorchEngine",
    "VllmEngine",
    "check_prompt_lengths",
    "check_supervisable",
    "engine_factory",
    "format_report",
    "local_devices",
    "prepare_regeneration",
    "preview",
    "regenerate",
    "run_eval",
    "scan_input",
    "torch_engine",
    "vllm_available",
    "warm_up",
]
