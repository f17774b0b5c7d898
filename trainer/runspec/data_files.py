"""The JSONL data files, read and checked without torch.

The config's check before launch (`check_data_file`, a ConfigError while it can still be exit 2) and the
trainer's sources (`trainer.data.sources`) read records through the same functions, so both name a bad line
the same way.

Before launch every line is checked, not a sample: a string where token ids belong, an id >= the
vocabulary or bad JSON at line 100 used to pass `--dry-run` and fail 30-110 s later under torchrun
(issue 18, row 7). One streaming pass (constant memory) reports the first bad line and counts the rest.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_base.errors import ConfigError
from trainer.runspec.messages import json_problem, messages_problem, text_problem

RECORD_FIELDS = {"jsonl": ("input_ids", "loss_mask"), "text": ("text",), "chat": ("messages",)}


def _lines(path: Path, field: str = "data.path") -> Iterator[tuple[int, dict[str, Any] | None, str | None]]:
    """(line number, record, None) or (line number, None, what is wrong) for every non-empty line."""
    try:
        # Bytes, decoded line by line: a line that is not UTF-8 is that line's error, with its number (N9).
        with open(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                if number == 1 and raw.startswith(BOM):  # a byte-order mark (Windows editors, PowerShell)
                    raw = raw[len(BOM) :]
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    yield number, None, f"not UTF-8 text (byte {exc.start + 1} of the line: {exc.reason})"
                    continue
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    yield number, None, json_problem(exc, line)
                    continue
                except RecursionError:  # a 5,000-deep line was exit 3 (RecursionError) in eval
                    yield number, None, "nested too deeply to read (thousands of levels of [ or {)"
                    continue
                if not isinstance(record, dict):
                    yield number, None, "must be a JSON object"
                    continue
                yield number, record, None
    except OSError as exc:
        raise ConfigError(f"{field}: cannot read {path}: {exc.strerror}") from exc


BOM = b"\xef\xbb\xbf"


def json_objects(path: Path, field: str = "data.path") -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for every non-empty line; a line that is not a JSON object is a ConfigError."""
    for number, record, problem in _lines(path, field):
        if record is None:
            raise ConfigError(f"{field}: {path} line {number}: {problem}")
        yield number, record


def jsonl_records(path: Path, field: str = "data.path") -> list[tuple[int, dict[str, Any]]]:
    records = list(json_objects(path, field))
    if not records:
        raise ConfigError(f"{field}: {path} holds no records")
    return records


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def record_problem(kind: str, record: dict[str, Any], vocab_size: int | None) -> str | None:
    """What is wrong with one record of `kind` (None: nothing). `vocab_size` None: ids are not range-checked."""
    missing = [f for f in RECORD_FIELDS.get(kind, ()) if f not in record]
    if missing:
        return f'a "{kind}" record needs {", ".join(map(repr, missing))}'
    if kind == "jsonl":
        ids, mask = record["input_ids"], record["loss_mask"]
        limit = f" < {vocab_size}" if vocab_size is not None else ""
        if not isinstance(ids, list) or not ids or not all(_is_int(t) and t >= 0 for t in ids):
            return f"input_ids must be a non-empty list of token ids{limit}, got {_shown(ids)}"
        if vocab_size is not None and max(ids) >= vocab_size:
            return f"input_ids must be a non-empty list of token ids{limit}, got id {max(ids)}"
        if not isinstance(mask, list) or len(mask) != len(ids) or not all(m in (0, 1) for m in mask):
            return "loss_mask must be a list of 0/1 as long as input_ids"
    elif kind == "text":
        if not isinstance(record["text"], str) or not record["text"]:
            return f"text must be a non-empty string, got {_shown(record['text'])}"
        return text_problem(record["text"], "text")
    elif kind == "chat":
        return messages_problem(record["messages"])
    return None


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass
class DataScan:
    """One pass over a data file: how many records, the first bad line, how many bad lines in all."""

    records: int = 0
    bad_lines: int = 0
    first_bad: str | None = None  # "line 100: not JSON (...)"
    answered: int = 0  # chat: conversations with an assistant turn (the only turns a drafter learns)
    duplicates: int = 0  # records whose string `id` an earlier record has (two runs into one output file)
    first_duplicate: str | None = None  # 'id "a" on line 70, first on line 3'


def template_problem(record: dict[str, Any], template_kwargs: dict[str, Any] | None) -> str | None:
    """A conversation `data regenerate` wrote (its `generation` says how) with other chat template arguments
    than the run renders with: the target wrote those answers after another rendering of the prompt (Qwen3's
    `enable_thinking`: an empty think block the target never wrote, which training would supervise)."""
    made = record.get("generation")
    if template_kwargs is None or not isinstance(made, dict) or "chat_template_kwargs" not in made:
        return None
    if made["chat_template_kwargs"] == template_kwargs:
        return None
    return (
        f"regenerated with chat_template_kwargs {_shown(made['chat_template_kwargs'])}, but the run renders with "
        f"{_shown(template_kwargs)} (data.chat_template_kwargs): it would train on answers in a context the "
        "target did not write them in"
    )


# What a line of `data regenerate` records of one answer, not of the settings it was made with.
_PER_ANSWER = frozenset({"finish_reasons", "generated_tokens", "engine"})


def made_with(record: dict[str, Any]) -> str:
    """The settings a regenerated conversation was made with (its `generation`, per-answer figures left out),
    as text: one id made twice with the same settings is a line written twice (N5), while a greedy and a
    sampled run over the same prompts, concatenated, share ids on purpose (docs/data.md)."""
    made = record.get("generation")
    if not isinstance(made, dict):
        return ""
    return json.dumps({k: v for k, v in made.items() if k not in _PER_ANSWER}, sort_keys=True, default=str)


def scan_data_file(
    kind: str,
    path: Path,
    vocab_size: int | None,
    field: str = "data.path",
    template_kwargs: dict[str, Any] | None = None,
) -> DataScan:
    scan = DataScan()
    seen: dict[str, int] = {}  # (id, settings) -> its first line: `data regenerate` names each conversation
    for number, record, problem in _lines(path, field):
        if record is not None:
            problem = record_problem(kind, record, vocab_size)
            if problem is None and kind == "chat":
                problem = template_problem(record, template_kwargs)
        if problem is None and record is not None:
            scan.records += 1
            ident = record.get("id")
            if isinstance(ident, str):
                key = f"{ident}\0{made_with(record)}"
                if key in seen:
                    scan.duplicates += 1
                    if scan.first_duplicate is None:
                        scan.first_duplicate = (
                            f"id {json.dumps(ident)[:80]} on line {number}, first on line {seen[key]}"
                        )
                else:
                    seen[key] = number
            if kind == "chat" and any(m.get("role") == "assistant" for m in record["messages"]):
                scan.answered += 1
            continue
        scan.bad_lines += 1
        if scan.first_bad is None:
            scan.first_bad = f"line {number}: {problem}"
    return scan


def check_data_file(
    kind: str,
    path: str,
    vocab_size: int | None = None,
    field: str = "data.path",
    template_kwargs: dict[str, Any] | None = None,
) -> None:
    """Before any process starts, every line of the file: a ConfigError (exit 2) naming the first bad
    line and counting the others, a file with no records, or chat data with nothing to supervise, or
    regenerated with other chat template arguments than `template_kwargs` (the run's)."""
    if kind not in RECORD_FIELDS:
        return
    if Path(path).exists() and not Path(path).is_file():  # a folder, or a FIFO that would block the read
        raise ConfigError(f"{field}: {path} is not a regular file", hint="give a .jsonl file")
    scan = scan_data_file(kind, Path(path), vocab_size, field, template_kwargs)
    if scan.first_bad is not None:
        more = scan.bad_lines - 1
        tail = f" ({more} more bad line{'s' if more != 1 else ''} after it)" if more else ""
        raise ConfigError(
            f"{field}: {path} {scan.first_bad}{tail}",
            hint=f"{scan.bad_lines} of {scan.records + scan.bad_lines} records are bad; fix or drop them",
        )
    if not scan.records:
        raise ConfigError(f"{field}: {path} holds no records")
    if scan.duplicates:  # trained twice as often as the rest, and in the held-out split and the training one
        raise ConfigError(
            f"{field}: {path}: {scan.duplicates} record(s) repeat an id an earlier record made with the same settings "
            f"has ({scan.first_duplicate}): "
            "each would be trained (or held out) more than once",
            hint="if `dflash-doctor data regenerate` wrote it, run that command again with the same --out: it keeps "
            "the first line of each id and drops the rest, saying how many",
        )
    if kind == "chat" and not scan.answered:
        raise ConfigError(
            f"{field}: {path}: none of its {scan.records} conversations has an assistant turn: nothing to "
            "supervise (a drafter learns the assistant's turns only)",
            hint=f"answer them with the target first: dflash-doctor data regenerate --config CONFIG --prompts "
            f"{path} --out ANSWERS.jsonl, then train on it (data.path = ANSWERS.jsonl): its output is chat data "
            "with every assistant turn",
        )


def count_records(path: str, field: str = "data.path") -> int:
    """Number of non-empty lines: what every rank needs to plan the run, without parsing them."""
    try:
        with open(path, "rb") as handle:
            return sum(1 for line in handle if line.strip())
    except OSError as exc:
        raise ConfigError(f"{field}: cannot read {path}: {exc.strerror}") from exc
