"""The trainer's doorway for `dflash_doctor`: the only module besides the torch-free `trainer.runspec` that the
doctor may import, and only lazily (from a command's body, or the warm-up child), because importing it
imports torch. What the doctor's commands call lives here by name; the trainer's insides stay free to move.
"""

from __future__ import annotations

from trainer.data.preview import preview
from trainer.eval.evaluate import EvalReport, run_eval
from trainer.eval.report import format_report
from trainer.regenerate.engines import DevicePool, engine_factory, local_devices, torch_engine
from trainer.regenerate.generate_engine import TorchEngine
from trainer.regenerate.job import (
    check_prompt_lengths,
    check_supervisable,
    prepare_regeneration,
    regenerate,
    scan_input,
)
from trainer.regenerate.kv_engine import KVEngine
from trainer.regenerate.settings import GenerationSettings
from trainer.regenerate.vllm_engine import VllmEngine, vllm_available
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
