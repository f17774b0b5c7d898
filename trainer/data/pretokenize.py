"""The `jsonl` route for a chat template nobody can read: pre-tokenised sequences with a loss mask, written once.

Where `trainer.data.chat` refuses a template (it names why), the user tokenises the conversations their own
way and writes each as {"input_ids": [...], "loss_mask": [0/1, ...]}; `data.kind = "jsonl"` trains on them.
Every row is checked by the same rule `train` applies before anything is written, and the file is written
beside its destination and renamed, so a bad row leaves no half-written file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from dflash_base.atomic import write_bytes_atomic
from dflash_base.errors import ConfigError
from trainer.runspec.data_files import record_problem


def write_pretokenized(
    path: str | Path,
    rows: Iterable[tuple[Sequence[int], Sequence[bool | int]]],
    vocab_size: int | None = None,
) -> int:
    """Write (input_ids, loss_mask) rows as a `jsonl` data file; returns how many. A bad row: ConfigError
    naming it (1-based), and nothing written."""
    lines: list[str] = []
    for number, (ids, mask) in enumerate(rows, start=1):
        record = {"input_ids": list(ids), "loss_mask": [int(m) for m in mask]}
        problem = record_problem("jsonl", record, vocab_size)
        if problem is not None:
            raise ConfigError(f"{path}: row {number}: {problem}", hint="nothing was written")
        lines.append(json.dumps(record) + "\n")
    write_bytes_atomic(path, "".join(lines).encode("utf-8"))
    return len(lines)
