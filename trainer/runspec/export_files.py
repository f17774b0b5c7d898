"""An export folder checked without torch, before anything loads: `config.json` a DFlash drafter's, the
`model.safetensors` header whole and its tensors inside the file, and the shapes those name those of the
target it is evaluated with. A truncated or empty weights file (safetensors' "incomplete metadata", "header too
small") or an export made for another target (the drafter's "embed_weight has shape ...") is exit 2 naming
the file, not exit 3 after minutes of loading and making held-out data.

The safetensors layout: 8 bytes (little-endian) giving the header's length, the header (JSON: each tensor's
dtype, shape and `data_offsets` [begin, end) into the data after it), then the data.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_base.errors import ConfigError
from trainer.runspec.outputs import EXPORT_DIR

CONFIG_NAME = "config.json"  # the names trainer.model.export writes
WEIGHTS_NAME = "model.safetensors"
ARCHITECTURE = "DFlashDraftModel"
HEADER_LIMIT = 100 * 1024**2  # safetensors' own cap on the header's length
HINT = "export it again from the run's last checkpoint, or point --export at a whole export folder"


@dataclass(frozen=True)
class ExportShapes:
    """What an export says about the target it was made for."""

    hidden_size: int
    vocab_size: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]


def check_export(folder: str | Path) -> ExportShapes:
    """ConfigError naming `--export` and the file when the folder cannot be a drafter we can load."""
    root = Path(folder)
    if not root.is_dir():
        raise ConfigError(f"--export: {root} is not a folder", hint="give the export folder a run wrote")
    inner = root / EXPORT_DIR
    if not (root / CONFIG_NAME).exists() and (inner / CONFIG_NAME).is_file():  # a run's output folder
        raise ConfigError(
            f"--export: {root} is a run's output folder; its drafter is in {inner}", hint=f"--export {inner}"
        )
    shapes = _config_shapes(root / CONFIG_NAME)
    _check_weights(root / WEIGHTS_NAME)
    return shapes


def check_export_fits(folder: str | Path, target: Any) -> None:
    """The export's shapes against the target's (`TargetShapes`): made for this target, or exit 2 saying
    what differs."""
    made = check_export(folder)
    differs = [
        f"{name} {theirs} vs {ours}"
        for name, theirs, ours in (
            ("hidden", made.hidden_size, int(target.hidden_size)),
            ("vocabulary", made.vocab_size, int(target.vocab_size)),
            ("layers", made.num_target_layers, int(target.num_hidden_layers)),
        )
        if theirs != ours
    ]
    if differs:
        raise ConfigError(
            f"--export: {folder} was made for another target ({', '.join(differs)}: the export's vs this "
            "target's)",
            hint="evaluate it with the target it was trained for (--target, or the run's --config)",
        )


def _config_shapes(path: Path) -> ExportShapes:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"--export: cannot read {path}: {exc.strerror}", hint=HINT) from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--export: {path} is not JSON ({exc})", hint=HINT) from exc
    if not isinstance(config, dict) or ARCHITECTURE not in (config.get("architectures") or []):
        raise ConfigError(f"--export: {path} is not a DFlash drafter's config ({ARCHITECTURE})", hint=HINT)
    dflash: dict[str, Any] = config.get("dflash_config") or {}
    try:
        layers = dflash["num_target_layers"] if "num_target_layers" in dflash else config["num_target_layers"]
        return ExportShapes(
            int(config["hidden_size"]),
            int(config["vocab_size"]),
            int(layers),
            tuple(int(i) for i in dflash["target_layer_ids"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"--export: {path} lacks or mistypes the field {exc}", hint=HINT) from exc


def _check_weights(path: Path) -> None:
    """The header whole and every tensor's bytes inside the file (a copy cut short fails here)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            head = handle.read(8)
            length = struct.unpack("<Q", head)[0] if len(head) == 8 else None
            if length is None or length > min(HEADER_LIMIT, size - 8):
                raise ConfigError(
                    f"--export: {path} is {size:,} bytes, too short for a safetensors file (empty or cut short)",
                    hint=HINT,
                )
            header = json.loads(handle.read(length))
    except OSError as exc:
        raise ConfigError(f"--export: cannot read {path}: {exc.strerror}", hint=HINT) from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--export: {path} has a damaged header ({exc})", hint=HINT) from exc
    ends = [
        entry["data_offsets"][1]
        for name, entry in (header.items() if isinstance(header, dict) else [])
        if name != "__metadata__" and isinstance(entry, dict) and isinstance(entry.get("data_offsets"), list)
    ]
    needed = 8 + length + max(ends, default=0)
    if not isinstance(header, dict) or needed != size:
        raise ConfigError(
            f"--export: {path} is {size:,} bytes where its header says {needed:,}: cut short or damaged",
            hint=HINT,
        )
