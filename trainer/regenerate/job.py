"""Regenerate a data set's answers with the target, so the drafter learns what the target will actually say.

The job reads prompt records (`trainer.regenerate.conversations`), has an engine (`trainer.regenerate.engines`) answer them turn by
turn in chunks of conversations, and appends one finished conversation per line to the output, flushed and
synced after each chunk: a crash loses at most the chunk in flight, and a run that fails before its first
answer leaves no file. Re-running with the same output skips the ids already written; a torn last line (a
crash mid-write) is dropped first. Every line carries the settings that made it, and an output made with
other settings is refused unless `force` moves it aside.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_base.atomic import write_bytes_atomic
from dflash_base.disk import writing
from dflash_base.errors import ConfigError, DoctorError
from trainer.data.degenerate import ends_in_loop_text
from trainer.engine.sampling import row_key
from trainer.engine.target import prompt_ids
from trainer.regenerate.conversations import PromptRecord, RecordError, Regeneration, read_records
from trainer.regenerate.out_lock import holding_output
from trainer.regenerate.settings import CountsTokens, Engine, GenerationSettings
from trainer.runspec.regenerate_request import RegenerateRequest

SCHEMA = "dflash-doctor/regenerate/v1"


class RegenerateError(DoctorError):
    """Bad input or an output that belongs to other settings: exit 2, nothing written."""


class RegenerateStopped(KeyboardInterrupt):
    """Ctrl-C while the job ran: every line of `out` is whole; the conversations of the chunk in flight were
    dropped (they are answered again by the next run of the same command)."""

    def __init__(self, written: int, already: int, dropped: int, out: Path) -> None:
        super().__init__()
        self.written, self.already, self.dropped, self.out = written, already, dropped, out

    def describe(self) -> str:
        kept = self.written + self.already
        where = (
            f"{kept:,} conversations in {self.out}, every line whole"
            if kept
            else f"nothing written to {self.out}"
        )
        dropped = f"; the {self.dropped:,} being answered were dropped" if self.dropped else ""
        again = "resume" if kept else "start again"
        return f"stopped: {where}{dropped}; run the same command again to {again}"


@dataclass
class InputScan:
    """The whole input, validated before any model loads."""

    records: list[PromptRecord]
    bad: list[RecordError] = field(default_factory=list)
    source: Path | None = None  # the --prompts file (never to be written over)


def scan_input(path: Path, on_error: str) -> InputScan:
    """Every line parsed; with on_error="stop" the first bad line (or a repeated id) is an error naming it."""
    if not path.is_file():
        raise RegenerateError(f"--prompts: {path} is not a file")
    records: list[PromptRecord] = []
    bad: list[RecordError] = []
    seen: dict[str, int] = {}
    try:
        for item in read_records(path):
            if isinstance(item, PromptRecord) and item.id in seen:
                item = RecordError(item.line, f'id "{item.id}" repeats line {seen[item.id]}')
            if isinstance(item, RecordError):
                if on_error == "stop":
                    raise RegenerateError(
                        f"--prompts: {path} {item}",
                        hint="fix the line, or pass --on-error skip to leave it out",
                    )
                bad.append(item)
                continue
            seen[item.id] = item.line
            records.append(item)
    except UnicodeDecodeError as exc:
        raise RegenerateError(f"--prompts: {path} is not UTF-8 text ({exc.reason})") from exc
    except OSError as exc:
        raise RegenerateError(f"--prompts: cannot read {path}: {exc.strerror}") from exc
    if not records:
        raise RegenerateError(f"--prompts: {path} holds no usable record")
    return InputScan(records, bad, path)


# Generously more than the tokens a chat template adds around one turn (role headers, markers): a
# conversation's text of fewer bytes than the context minus this per turn cannot fill the context, since no
# tokenizer makes more tokens of a text than it has UTF-8 bytes (byte-level BPE: at most one per byte).
TEMPLATE_TOKENS_PER_TURN = 64


def check_supervisable(settings: GenerationSettings) -> None:
    """Before any answer is generated: `train` must be able to find, in this template's rendering, the
    assistant turns it will supervise. A template that writes no assistant header (Mistral's two common ones,
    DeepSeek-R1's as vLLM ships it) was refused by `train` only after the generation had been paid for."""
    from trainer.data.chat import TemplateMarks
    from trainer.runspec.target_shapes import is_embedded
    from trainer.target_model.tokenizer import load_tokenizer

    if is_embedded(settings.target):
        return  # no tokenizer, no chat: the engine refuses it, naming why
    try:
        TemplateMarks.of(load_tokenizer(settings.target), dict(settings.chat_template_kwargs))
    except ConfigError as exc:
        raise ConfigError(
            f"data regenerate: `train` could not supervise answers rendered by this chat template: {exc.message}",
            hint="nothing was generated; use a target whose template marks assistant turns, or pre-tokenise "
            'the data as data.kind = "jsonl"',
        ) from exc


def check_prompt_lengths(scan: InputScan, settings: GenerationSettings, on_error: str) -> InputScan:
    """Before the target loads: a conversation whose prompt is longer than the target's context is a bad
    line (stop: exit 2 naming it; skip: left out), not an allocation failure minutes in (a 10 MB prompt of
    3.5M tokens against a context of 4096). Only a conversation long enough in bytes to be at risk is
    tokenised: the first prompt as the engines render it, plus the later user and tool turns."""
    from trainer.runspec.target_shapes import target_shapes
    from trainer.target_model.tokenizer import load_tokenizer

    context = int(target_shapes(settings.target).max_position_embeddings)
    tokenizer = None
    kept: list[PromptRecord] = []
    bad = list(scan.bad)
    for record in scan.records:
        turns = [m for m in record.messages if m["role"] != "assistant"]
        size = sum(len(m["content"].encode("utf-8")) for m in turns)
        if size + TEMPLATE_TOKENS_PER_TURN * len(record.messages) < context:
            kept.append(record)
            continue
        tokenizer = tokenizer or load_tokenizer(settings.target)
        tokens = prompt_tokens(record, tokenizer, settings.chat_template_kwargs)
        if tokens < context:
            kept.append(record)
            continue
        error = RecordError(
            record.line, f"{tokens:,} tokens, longer than the target's context ({context:,} tokens)"
        )
        if on_error == "stop":
            raise RegenerateError(
                f"--prompts: {scan.source} {error}",
                hint="shorten or drop that conversation, or pass --on-error skip to leave it out",
            )
        bad.append(error)
    return InputScan(kept, bad, scan.source)


def prompt_tokens(record: PromptRecord, tokenizer: Any, template_kwargs: dict[str, Any]) -> int:
    """The first prompt's tokens as rendered for generation, plus those of every later user or tool turn
    (the prompts after them hold those and the answers before them: at least this many)."""
    messages = list(record.messages)
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    tokens = len(prompt_ids(tokenizer, messages[:first], template_kwargs))
    for later in messages[first:]:
        if later["role"] != "assistant":
            tokens += len(tokenizer(later["content"], add_special_tokens=False)["input_ids"])
    return tokens


def check_out_is_not_prompts(prompts: Path, out: Path) -> None:
    """`--out` must not be the `--prompts` file, by any name (`..`, a symbolic or hard link): appending the
    answers to it, or moving it aside with --force, would destroy the input."""
    try:
        same = out.exists() and os.path.samefile(prompts, out)
    except OSError:
        same = False
    if same or os.path.realpath(out) == os.path.realpath(prompts):
        raise RegenerateError(
            f"--out {out} is the --prompts file {prompts}",
            hint="write the answers to another file, e.g. --out answers.jsonl",
        )


def _settings_of(line: dict[str, Any]) -> dict[str, Any]:
    """The settings a line records, as GenerationSettings.to_json writes them (`dtype` only where recorded)."""
    meta = line.get("generation", {})
    keys = GenerationSettings.__dataclass_fields__.keys()
    return {k: meta.get(k) for k in keys if k != "dtype" or "dtype" in meta} if isinstance(meta, dict) else {}


def _is_conversation(raw: bytes) -> bool:
    """A line as data regenerate writes them: a JSON object with a string id (the rule resume reads by)."""
    try:
        line = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return False
    return isinstance(line, dict) and isinstance(line.get("id"), str)


def _start_over(out: Path) -> set[str]:
    """--force: the old file moved aside to `<out>.old-<time>` (kept), nothing done yet."""
    os.replace(out, out.with_name(f"{out.name}.old-{time.strftime('%Y%m%d-%H%M%S')}"))
    return set()


@dataclass
class Resumed:
    """What an earlier run left in `--out`: the ids written, and how many lines repeated an id (dropped)."""

    ids: set[str]
    duplicates_dropped: int = 0


def resume_state(out: Path, settings: GenerationSettings, force: bool) -> set[str]:
    return resume(out, settings, force).ids


def resume(out: Path, settings: GenerationSettings, force: bool) -> Resumed:
    """Ids already in `out`. A torn last line is cut off; a damaged line elsewhere, or lines made with other
    settings, are refused (with `force`, the old file is moved aside to `<out>.old-<time>` and we start over).
    A line whose id an earlier line has (two runs into one file before the output was locked: issue 58, N5) is
    dropped, the first of each id kept: the file is rewritten beside and renamed, and the count said."""
    if not out.exists():
        return Resumed(set())
    if not out.is_file():
        raise RegenerateError(f"--out: {out} exists and is not a file")
    data = out.read_bytes()
    lines = data.split(b"\n")
    good_end, ids, mismatch = 0, set(), None
    kept: list[bytes] = []  # whole lines, each id's first
    duplicates = 0
    for number, raw in enumerate(lines, start=1):
        complete = number < len(lines)  # the piece after the last newline is empty or torn
        if not raw.strip():
            good_end += len(raw) + (1 if complete else 0)
            if complete:
                kept.append(raw)
            continue
        try:
            line = json.loads(raw)
            ok = complete and isinstance(line, dict) and isinstance(line.get("id"), str)
        except (json.JSONDecodeError, UnicodeDecodeError):
            ok = False
        if not ok:
            if not complete:  # a crash mid-write: drop it, the id is generated again
                break
            if not any(_is_conversation(other) for other in lines):  # /proc/version, notes.txt
                raise RegenerateError(
                    f"--out: {out} line {number} is not a regenerated conversation, nor is any line: it is not "
                    "a file data regenerate wrote",
                    hint="choose another --out: a new file, or one data regenerate wrote (--force moves only "
                    "those aside)",
                )
            if not force:
                raise RegenerateError(
                    f"--out: {out} line {number} is damaged (not a regenerated conversation)",
                    hint="pass --force to start over (the old file is kept beside), or move the file away",
                )
            return Resumed(_start_over(out))  # was: --force, which the hint named, gave this same error
        if mismatch is None and _settings_of(line) != settings.to_json():
            mismatch = (number, _settings_of(line))
        if line["id"] in ids:
            duplicates += 1
        else:
            kept.append(raw)
        ids.add(line["id"])
        good_end += len(raw) + 1
    if mismatch is not None:
        if not force:
            number, theirs = mismatch
            diff = {k: v for k, v in theirs.items() if settings.to_json().get(k) != v}
            raise RegenerateError(
                f"--out: {out} was made with other settings (line {number}: {json.dumps(diff)})",
                hint="use another --out, or pass --force to start over (the old file is kept beside)",
            )
        return Resumed(_start_over(out))
    if duplicates:
        mode = out.stat().st_mode & 0o777
        write_bytes_atomic(out, b"".join(line + b"\n" for line in kept))
        os.chmod(out, mode)
    elif good_end < len(data):
        with open(out, "r+b") as handle:
            handle.truncate(good_end)
            os.fsync(handle.fileno())
    return Resumed(ids, duplicates)


def output_line(regen: Regeneration, settings: GenerationSettings, engine: str) -> str:
    meta = settings.to_json() | {
        "engine": engine,
        "finish_reasons": regen.finish_reasons,
        "generated_tokens": regen.generated_tokens,
    }
    line = {
        "id": regen.id,
        "prompt_id": regen.record.id,
        "sample": regen.sample,
        "messages": regen.turns,
        "generation": meta,
        "schema": SCHEMA,
    }
    return json.dumps(line, ensure_ascii=False) + "\n"


@dataclass
class Summary:
    written: int = 0
    skipped_done: int = 0
    skipped_bad: int = 0
    duplicates_dropped: int = (
        0  # lines of --out that repeated an id (two runs into one file), dropped on resume
    )
    generated_tokens: int = 0
    answers: int = 0
    stopped_at_length: int = 0
    ended_in_loop: int = 0  # answers whose text ends repeating itself (trainer.data.degenerate)
    loops_at_length: int = 0  # of those, cut at --max-new-tokens: a loop the target would not have left
    seconds: float = 0.0
    # Tokens the engine has made for the chunk in flight, not yet committed (engines that count them)
    in_flight_tokens: int = 0
    engine: dict[str, Any] | None = None  # the engine's own figures (the KV engine: decode rate, roofline)

    @property
    def tokens_so_far(self) -> int:
        """Committed and in-flight generated tokens: what a progress bar shows while a chunk is answered."""
        return self.generated_tokens + self.in_flight_tokens

    def count(self, walks: list[Regeneration]) -> None:
        """Add one committed chunk's conversations."""
        self.written += len(walks)
        for walk in walks:
            answers = [t["content"] for t in walk.turns if t["role"] == "assistant"]
            self.answers += len(walk.finish_reasons)
            self.stopped_at_length += walk.finish_reasons.count("length")
            self.generated_tokens += walk.generated_tokens
            for text, reason in zip(answers, walk.finish_reasons, strict=False):
                if ends_in_loop_text(text):
                    self.ended_in_loop += 1
                    self.loops_at_length += reason == "length"

    def to_json(self) -> dict[str, Any]:
        tok_s = self.generated_tokens / self.seconds if self.seconds > 0 else 0.0
        return {
            "schema": SCHEMA,
            "written": self.written,
            "skipped_already_written": self.skipped_done,
            "skipped_bad_lines": self.skipped_bad,
            "duplicates_dropped": self.duplicates_dropped,
            "answers": self.answers,
            "answers_cut_at_max_new_tokens": self.stopped_at_length,
            "answers_ending_in_a_loop": self.ended_in_loop,
            "answers_ending_in_a_loop_at_max_new_tokens": self.loops_at_length,
            "generated_tokens": self.generated_tokens,
            "seconds": round(self.seconds, 3),
            "generated_tokens_per_s": round(tok_s, 1),
            "engine": self.engine,
        }


FIRST_CHUNK = 64  # conversations in the first commit, before the pace is known
MAX_CHUNK = 32768  # an engine batches within a commit: a fast GPU gets large batches, never unbounded ones


class CommitPace:
    """How many conversations the next commit takes, so that each commit is about `seconds` of work: a kill
    loses at most that (on a slow CPU a few conversations, not 64 of them; 64 took 38 min there), and a fast
    GPU commits large chunks its engine can batch (64 at a time held a batch of 512 to 64 rows).

    `batch`: the rows the engine decodes at once on a GPU (1 on a CPU). A GPU's batch costs about the same
    whether it holds 64 rows or 1,024 (a 135M target on an H200: 64 rows in ~40 s, 1,024 in ~50 s), so there
    the pace counts whole batches, and the first commit is one full batch: counted in rows, a run started at
    64 and grew by ~1.6x a commit, and spent 4.4 of its 5 minutes on partial batches (1,551 conversations;
    bench/results/h200/smollm2-135m-s9.json). On a CPU a chunk's time follows its rows."""

    def __init__(self, seconds: float, first: int = FIRST_CHUNK, fixed: bool = False, batch: int = 1) -> None:
        self.seconds, self.fixed, self.batch = seconds, fixed, max(1, batch)
        self.size = first if fixed or self.batch == 1 else self.batch
        self.per_conversation: float | None = None

    def record(self, conversations: int, seconds: float) -> None:
        if conversations <= 0 or seconds <= 0 or self.fixed:
            return
        self.per_conversation = seconds / conversations
        if self.batch == 1:
            self.size = max(1, min(MAX_CHUNK, int(self.seconds / self.per_conversation)))
            return
        per_batch = seconds / -(-conversations // self.batch)  # a partial batch took a whole batch's time
        batches = max(1, min(MAX_CHUNK // self.batch, int(self.seconds / per_batch)))
        self.size = batches * self.batch


def chunks(records: list[Regeneration], pace: CommitPace) -> Iterator[list[Regeneration]]:
    """The conversations in commits of `pace.size` (read again before each chunk)."""
    start = 0
    while start < len(records):
        chunk = records[start : start + pace.size]
        start += len(chunk)
        yield chunk


def regenerate_chunk(
    engine: Engine, walks: list[Regeneration], sampling_seed: int | None = None
) -> list[Regeneration]:
    """Answer every turn of these conversations: each round asks the engine for the next answer of every
    conversation still waiting for one, so turn k of all of them goes in one call. `sampling_seed` (when
    sampling): each answer goes with its key, row_key(seed, prompt id, sample, turn), so it is the same
    whatever batch, chunk or run it is drawn in."""
    while True:
        waiting = [(w, p) for w in walks if (p := w.prompt()) is not None]
        if not waiting:
            return walks
        chats = [p for _, p in waiting]
        if sampling_seed is None:
            answers = engine.generate(chats)
        else:
            keys = [row_key(sampling_seed, w.record.id, w.sample, len(w.finish_reasons)) for w, _ in waiting]
            answers = engine.generate(chats, keys)
        for (walk, _), completion in zip(waiting, answers, strict=True):
            walk.answer(completion.text, completion.finish_reason, completion.tokens)


def regenerate(
    scan: InputScan,
    out: Path,
    settings: GenerationSettings,
    engine_factory: Callable[[], Engine],
    limit: int | None = None,
    force: bool = False,
    commit_every_s: float = 60.0,
    on_progress: Callable[[Summary, int], None] | None = None,
    chunk_size: int | None = None,
    samples_per_prompt: int = 1,
    on_tokens: Callable[[Summary], None] | None = None,
) -> Summary:
    """Write the regenerated conversations of `scan` to `out`, resuming what an earlier run wrote.

    `on_progress(summary, todo)`: once before the work, then after each commit. `on_tokens(summary)`: while a
    chunk is answered, each time the engine counts tokens (`summary.in_flight_tokens`, `summary.seconds`)."""
    if scan.source is not None:
        check_out_is_not_prompts(scan.source, out)  # before `force` could move the input aside
    with holding_output(out):  # one run per output file (N5), from the read of what it holds to the last line
        return _regenerate(
            scan, out, settings, engine_factory, limit, force, commit_every_s, on_progress, chunk_size,
            samples_per_prompt, on_tokens,
        )  # fmt: skip


def _regenerate(
    scan: InputScan,
    out: Path,
    settings: GenerationSettings,
    engine_factory: Callable[[], Engine],
    limit: int | None,
    force: bool,
    commit_every_s: float,
    on_progress: Callable[[Summary, int], None] | None,
    chunk_size: int | None,
    samples_per_prompt: int,
    on_tokens: Callable[[Summary], None] | None,
) -> Summary:
    resumed = resume(out, settings, force)
    done = resumed.ids
    records = scan.records[:limit] if limit is not None else scan.records
    walks = sample_walks(records, samples_per_prompt)
    todo = [w for w in walks if w.id not in done]
    summary = Summary(
        skipped_done=len(walks) - len(todo),
        skipped_bad=len(scan.bad),
        duplicates_dropped=resumed.duplicates_dropped,
    )
    if on_progress:
        on_progress(summary, len(todo))
    if not todo:
        return summary
    engine = engine_factory()
    start = time.perf_counter()
    pace = (
        CommitPace(commit_every_s, first=chunk_size, fixed=True)  # a fixed commit size (tests)
        if chunk_size is not None
        else CommitPace(
            commit_every_s,
            first=getattr(engine, "first_chunk", None) or min(FIRST_CHUNK, max(1, int(commit_every_s))),
            batch=getattr(engine, "rows_at_once", 1),
        )
    )
    if on_tokens is not None and isinstance(engine, CountsTokens):

        def made(count: int) -> None:
            summary.in_flight_tokens += count
            summary.seconds = time.perf_counter() - start
            on_tokens(summary)

        engine.on_tokens = made
    chunk: list[Regeneration] = []
    try:
        for chunk in chunks(todo, pace):
            chunk_began = time.perf_counter()
            answered = regenerate_chunk(engine, chunk, settings.seed if settings.temperature > 0 else None)
            pace.record(len(answered), time.perf_counter() - chunk_began)
            append_whole(out, "".join(output_line(w, settings, engine.name) for w in answered).encode())
            summary.count(answered)
            summary.in_flight_tokens = 0
            summary.seconds = time.perf_counter() - start
            if on_progress:
                on_progress(summary, len(todo))
            chunk = []
    except KeyboardInterrupt:  # what was kept and what was dropped, for the line the command prints (N12)
        raise RegenerateStopped(summary.written, summary.skipped_done, len(chunk), out) from None
    finally:
        summary.seconds = time.perf_counter() - start
        report = getattr(engine, "report", None)
        summary.engine = report() if callable(report) else None
        engine.close()
    return summary


def sample_walks(records: list[PromptRecord], samples_per_prompt: int) -> list[Regeneration]:
    """Every (prompt, sample) to answer, prompt by prompt. An input id that is another prompt's sample id
    (`a#1` beside `a`, two samples each) would make two lines of one id: refused, naming its line."""
    walks = [Regeneration(r, sample=k) for r in records for k in range(samples_per_prompt)]
    lines: dict[str, int] = {}
    for walk in walks:
        if walk.id in lines:
            raise RegenerateError(
                f'--prompts: line {walk.record.line}: id "{walk.record.id}" gives the output id "{walk.id}", '
                f"which line {lines[walk.id]} gives too (--samples-per-prompt {samples_per_prompt})",
                hint="give the prompts ids without `#<number>` at their end",
            )
        lines[walk.id] = walk.record.line
    return walks


def append_whole(out: Path, data: bytes) -> None:
    """Append one chunk's lines to `out` (made on the first chunk: a run that fails before any answer leaves
    no file), synced; a disk that fills mid-chunk cuts the file back to its last whole line and is one
    NoSpace naming `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    made = not out.exists()
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def take_back() -> None:
        if made:
            out.unlink(missing_ok=True)
        else:
            os.ftruncate(fd, whole)

    try:
        whole = os.fstat(fd).st_size
        with writing(out, len(data), cleanup=take_back):
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
    finally:
        os.close(fd)


def prepare_regeneration(request: RegenerateRequest) -> tuple[GenerationSettings, InputScan]:
    """The request's settings and its checked input, before the target loads: the config read (no drafter
    setting needed), --max-new-tokens against the target's context, every --prompts line parsed and measured
    against the context, and the chat template's assistant turns found (what `train` will supervise)."""
    from trainer.runspec.config import load_config

    request.validate_paths()
    cfg = load_config(request.config, list(request.overrides), check_data=False, drafter=False)
    settings = GenerationSettings(
        target=cfg.target.path,
        max_new_tokens=request.max_new_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        chat_template_kwargs=dict(getattr(cfg.data, "chat_template_kwargs", None) or {}),
        seed=request.seed,
        dtype=cfg.target.dtype,
    )
    check_answer_length(settings)
    scan = check_prompt_lengths(scan_input(request.prompts, request.on_error), settings, request.on_error)
    check_plan(scan, request)
    check_supervisable(settings)  # a template train cannot supervise: refused before any answer is paid for
    return settings, scan


# What one conversation to answer costs before any answer exists: ~290 bytes of memory (measured: 100,000
# samples of 2 prompts, tracemalloc), and on disk at least its prompt's text and a line's fixed fields (the id,
# the settings, the finish reasons: ~250 bytes), whatever the answers add.
PLAN_BYTES_EACH = 300
LINE_BYTES_EACH = 250


def check_plan(scan: InputScan, request: RegenerateRequest) -> None:
    """Before anything is allocated: the conversations asked for (prompts x --samples-per-prompt) must fit the
    memory that plans them and the disk that will hold them, at the least (issue 58, N7: a billion samples of
    2 prompts grew to 6.6 GB of memory and wrote nothing). A RegenerateError saying how much each would need."""
    from dflash_base.disk import existing_ancestor, size_text

    records = scan.records[: request.limit] if request.limit is not None else scan.records
    count = len(records) * request.samples_per_prompt
    prompt_bytes = sum(len(m["content"].encode("utf-8")) for r in records for m in r.messages)
    disk = count * LINE_BYTES_EACH + prompt_bytes * request.samples_per_prompt
    if request.out.is_file():  # a resumed run: what an earlier one wrote is on the disk already
        disk = max(0, disk - request.out.stat().st_size)
    memory = count * PLAN_BYTES_EACH
    free, available = disk_free(existing_ancestor(request.out)), available_memory()
    what = f"{len(records):,} prompts x --samples-per-prompt {request.samples_per_prompt:,} = {count:,} conversations"
    if free is not None and disk > free:
        raise RegenerateError(
            f"{what}: their output needs at least {size_text(disk)} before any answer (the prompts and each line's "
            f"fields), and {size_text(free)} are free for --out {request.out}",
            hint="ask for fewer samples (--samples-per-prompt, --limit), or write where there is room",
        )
    if available is not None and memory > available // 2:
        raise RegenerateError(
            f"{what}: planning them takes about {size_text(memory)} of memory, more than half of the "
            f"{size_text(available)} available",
            hint="ask for fewer samples (--samples-per-prompt, --limit), or run it in parts with --limit",
        )


def disk_free(folder: Path) -> int | None:
    """Free bytes of the file system holding `folder`; None where it is no disk (/proc: no blocks at all)."""
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return None
    return usage.free if usage.total else None


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo, in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_answer_length(settings: GenerationSettings) -> None:
    """--max-new-tokens no longer than the target's context, where its config says the context (was: a
    100,000,000-token answer accepted against a context of 4,096)."""
    from trainer.runspec.target_shapes import target_shapes

    context = getattr(target_shapes(settings.target), "max_position_embeddings", None)
    if isinstance(context, int) and settings.max_new_tokens >= context:
        raise RegenerateError(
            f"--max-new-tokens {settings.max_new_tokens:,}: not shorter than the target's context "
            f"({context:,} tokens), which must hold the prompt too",
            hint=f"give --max-new-tokens below {context:,}",
        )
