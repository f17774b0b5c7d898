"""The JSONL data files, read and checked without torch.

The config's check before launch (`check_data_file`, a ConfigError while it can still be exit 2) and the
trainer's sources (`trainer.data`) read records through the same functions, so both name a bad line
the same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dflash_doctor.errors import ConfigError


def json_objects(path: Path, field: str = "data.path") -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for every non-empty line; a line that is not a JSON object is a ConfigError
    naming `field` (the config key that named the file), the file and the line."""
    try:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{field}: {path} line {number}: not JSON ({exc.msg})") from exc
                if not isinstance(record, dict):
                    raise ConfigError(f"{field}: {path} line {number}: must be a JSON object")
                yield number, record
    except OSError as exc:
        raise ConfigError(f"{field}: cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{field}: {path} is not UTF-8 text ({exc.reason})") from exc


def jsonl_records(path: Path, field: str = "data.path") -> list[tuple[int, dict[str, Any]]]:
    records = list(json_objects(path, field))
    if not records:
        raise ConfigError(f"{field}: {path} holds no records")
    return records


RECORD_FIELDS = {"jsonl": ("input_ids", "loss_mask"), "text": ("text",), "chat": ("messages",)}


def check_data_file(kind: str, path: str, head: int = 64, field: str = "data.path") -> None:
    """Before any process starts: the file exists, is readable, and its first records have the fields
    `kind` needs. A full check happens when the target ranks load it; this catches the common mistakes
    (wrong path, wrong kind, not JSONL) while they can still be a config error (exit 2)."""
    fields = RECORD_FIELDS.get(kind)
    if fields is None:
        return
    seen = 0
    for number, record in json_objects(Path(path), field):
        missing = [f for f in fields if f not in record]
        if missing:
            raise ConfigError(
                f'{field}: {path} line {number}: a "{kind}" record needs {", ".join(map(repr, missing))}'
            )
        seen += 1
        if seen >= head:
            return
    if not seen:
        raise ConfigError(f"{field}: {path} holds no records")


def count_records(path: str, field: str = "data.path") -> int:
    """Number of non-empty lines: what every rank needs to plan the run, without parsing them."""
    try:
        with open(path, "rb") as handle:
            return sum(1 for line in handle if line.strip())
    except OSError as exc:
        raise ConfigError(f"{field}: cannot read {path}: {exc.strerror}") from exc
