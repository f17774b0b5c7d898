"""`dflash-doctor cache status|snapshot|restore|list|prune|warm`: the compile-cache store."""

from __future__ import annotations

import errno
import functools
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from dflash_base.errors import DoctorError
from dflash_doctor.cache.fingerprint import BuildFingerprint, fingerprint_of, read_gpu_names
from dflash_doctor.cache.folder_lock import folder_locks, held_lock_fds
from dflash_doctor.cache.fsops import printable
from dflash_doctor.cache.locations import (
    INDUCTOR_VARIABLE,
    MANAGED_SOURCE,
    check_apart,
    command_locations,
    snapshots_dir,
)
from dflash_doctor.cache.restore import RestoreResult
from dflash_doctor.cache.snapshot import archive_destination, take_snapshot
from dflash_doctor.cache.status import warmth_of
from dflash_doctor.cache.store import SnapshotStore, check_name, choose_prunable, default_name, parse_duration
from dflash_doctor.cache.store_restore import restore_from_store
from dflash_doctor.cache.warm import (
    WarmShapes,
    check_device,
    child_command,
    child_environ,
    compile_count,
    run_warm_child,
)
from dflash_doctor.cache.warm_record import default_records
from dflash_doctor.commands.options import JsonOption, PythonOption
from dflash_doctor.console import make_console
from dflash_doctor.context import CheckContext
from dflash_doctor.env.environment import Environment
from dflash_doctor.registry import run_checks
from dflash_doctor.report import dumps, exit_code, flatten, remedy_lines, render
from dflash_doctor.stdout import NAME as STDOUT

SCHEMA = "dflash-doctor/cache/v1"
OutOption = typer.Option(None, "--out", help="Write the archive here (a file or a folder) instead.")
ConfigOption = typer.Option(
    None, "--config", help="A training config (run.toml): use its warm-up and shapes."
)
ReplaceNonCacheOption = typer.Option(
    False,
    "--replace-non-cache",
    help="Move the target aside even when it does not look like a compile cache (kept, never pruned).",
)
cache_app = typer.Typer(
    help="The compile cache: status, fingerprinted snapshots, crash-safe restore, warm-up."
)


def _console() -> Console:
    return make_console(soft_wrap=True)  # paths and names whole, in a pipe or at 80 columns


def shown(text: object) -> str:
    """Any path, name or message for the terminal: control characters (escape sequences, newlines)
    written as \\xNN, whole, and rich's markup escaped. The one helper every `cache` command prints
    through (issue 37, T1: a name planted beside the cache forged a "restored" line)."""
    return escape(printable(str(text), limit=1 << 20))


Command = TypeVar("Command", bound=Callable[..., Any])


def named_os_errors(command: Command) -> Command:
    """A file system error (a home that is a file, a read-only folder, a full disk) as a message and
    exit 2, naming the path, not a traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except DoctorError as exc:  # a path in a message reaches the terminal escaped, as printed lines do
            exc.message = printable(exc.message, limit=1 << 20)
            exc.hint = printable(exc.hint, limit=1 << 20) if exc.hint is not None else None
            raise
        except OSError as exc:
            if exc.filename == STDOUT:
                raise  # the CLI names a stdout that could not take the output
            where = printable(str(exc.filename)) if exc.filename else "a file"
            why = {
                errno.ENOSPC: "no space left on the device",
                errno.EACCES: "permission denied",
                errno.EPERM: "not permitted",
                errno.EROFS: "read-only file system",
                errno.ENOTDIR: "a part of the path is a file, not a folder",
                errno.EEXIST: "it already exists",
                errno.EISDIR: "it is a folder",
            }.get(exc.errno or 0, exc.strerror or str(exc))
            raise DoctorError(
                f"cannot use {where}: {why}",
                hint="check that path (or DFLASH_DOCTOR_HOME / TORCHINDUCTOR_CACHE_DIR), then try again",
            ) from None

    return wrapper  # type: ignore[return-value]


def _where(locations_source: str) -> str:
    if locations_source == MANAGED_SOURCE:
        return f" (the managed cache `train` uses: {INDUCTOR_VARIABLE} is unset)"
    return ""


def _current(python: str | None) -> tuple[Environment, BuildFingerprint]:
    env = Environment.load(python)
    return env, fingerprint_of(env, read_gpu_names())


def _mb(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


def _when(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp))


def _emit(kind: str, data: dict[str, Any]) -> None:
    typer.echo(dumps({"schema": SCHEMA, "command": kind, **data}))


@cache_app.command("status")
@named_os_errors
def status_command(
    python: str | None = PythonOption,
    json_out: bool = JsonOption,
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show evidence for passing findings too."),
) -> None:
    """Each cache folder: path, size, files, volatile or not, owner and mode, build, warm or cold."""
    from dflash_doctor.audit.cache import cache_status

    ctx = CheckContext(Environment.load(python))
    runs = run_checks(ctx, ["cache"])
    status = cache_status(ctx)
    findings = flatten(runs)
    if json_out:
        _emit("status", {**status.to_json(), "findings": [f.to_json() for f in findings]})
        raise typer.Exit(exit_code(findings))
    console = _console()
    console.print(f"compile cache · build {shown(status.current.describe())}")
    for folder in status.folders:
        made_for = folder.made_for
        state = warmth_of(folder, status.current).state if folder.label == "inductor" else ""
        facts = [
            _mb(folder.size_bytes) if folder.exists else "missing",
            f"{folder.files} files",
            (folder.fs_type or "?") + (" (volatile)" if folder.volatile else ""),
        ]
        if folder.mode is not None:
            facts.append(f"uid {folder.owner_uid} {folder.mode:04o}")
        facts.append(f"made for {made_for.describe()}" if made_for else "made for: unknown")
        if state:
            facts.append(state)
        console.print(f"{folder.label}: {shown(printable(str(folder.path), 4096))}")
        console.print(f"  {shown(', '.join(facts))}")
    render(runs, console, verbose)
    raise typer.Exit(exit_code(findings))


@cache_app.command("snapshot")
@named_os_errors
def snapshot_command(
    name: str | None = typer.Option(
        None, "--name", help="Snapshot name (default: torch version, GPU, time)."
    ),
    out: Path | None = OutOption,
    level: int = typer.Option(
        3, "--level", min=1, max=19, help="zstd level (3 is fast; 19 is small and slow)."
    ),
    python: str | None = PythonOption,
    json_out: bool = JsonOption,
) -> None:
    """Archive the Inductor (and Triton) cache, fingerprinted, into the store."""
    _, current = _current(python)
    locations = command_locations(os.environ)
    now = time.time()
    snap_name = check_name(name) if name else default_name(current, now)
    store = SnapshotStore(snapshots_dir())
    if out is not None:
        archive_destination(store.root, snap_name, out)  # a bad --out refused before the store is made
    with store.locked():
        store.remove_partials()
        dest = archive_destination(store.root, snap_name, out)
        result = take_snapshot(
            locations.roots(), current, snap_name, dest, level=level, now=now, records=default_records()
        )
        store.record(result.path)  # the newest in the store's own order, whatever the clock says (C1)
    manifest = result.manifest
    if json_out:
        _emit(
            "snapshot",
            {
                "name": manifest.name,
                "path": str(result.path),
                "files": len(manifest.files),
                "bytes": manifest.total_bytes,
                "archive_bytes": result.archive_bytes,
                "seconds": round(result.seconds, 3),
                "fingerprint": manifest.fingerprint.to_json(),
                "origins": manifest.origins,
                "skipped": manifest.skipped,
                "warm_records": len(manifest.warm_records),
            },
        )
        return
    console = _console()
    console.print(
        f"[green]✓[/] snapshot [bold]{shown(manifest.name)}[/]: {len(manifest.files)} files, "
        f"{_mb(manifest.total_bytes)} -> {_mb(result.archive_bytes)} in {result.seconds:.2f} s"
    )
    console.print(f"  {shown(str(result.path))}\n  for {shown(manifest.fingerprint.describe())}")
    console.print(f"  from {shown(', '.join(manifest.origins.values()))}{_where(locations.inductor_source)}")
    if manifest.skipped:  # links, special files, names no restore accepts, strays (a folder nested too deep)
        first = printable(manifest.skipped[0], 120) + (", ..." if len(manifest.skipped) > 1 else "")
        console.print(
            f"  [yellow]left out {len(manifest.skipped)} entr{'y' if len(manifest.skipped) == 1 else 'ies'} "
            f"no compiler wrote or no restore accepts[/] ({shown(first)}; all of them: --json `skipped`)"
        )
    for folder in result.unmarked:
        console.print(f"  [yellow]note:[/] {shown(folder)} is read-only: archived, no build marker written")


@dataclass(frozen=True)
class RestoreRequest:
    """What `cache restore` was asked: an archive by name or path, into the cache `train` uses."""

    snapshot: str
    force: bool
    replace_non_cache: bool
    python: str | None


@dataclass
class RestoreOutcome:
    archive: Path
    result: RestoreResult
    source: str  # how the Inductor folder was chosen (the managed cache, or the variable)
    warnings: list[str]
    adopted: int  # warm-up records the snapshot carried, now the home's


def restore_request(request: RestoreRequest) -> RestoreOutcome:
    """Verify and swap in the snapshot and adopt its warm-up records (`cache.store_restore`, the one home of
    both, shared with `train`)."""
    _, current = _current(request.python)
    locations = command_locations(os.environ)
    restored = restore_from_store(
        SnapshotStore(snapshots_dir()),
        request.snapshot,
        locations.roots(),
        current,
        force=request.force,
        replace_non_cache=request.replace_non_cache,
    )
    return RestoreOutcome(
        restored.archive, restored.result, locations.inductor_source, restored.warnings, restored.adopted
    )


def restore_json(outcome: RestoreOutcome) -> dict[str, Any]:
    result, manifest = outcome.result, outcome.result.manifest
    return {
        "name": manifest.name,
        "archive": str(outcome.archive),
        "files": len(manifest.files),
        "bytes": manifest.total_bytes,
        "targets": {k: str(v) for k, v in result.targets.items()},
        "backups": {k: str(v) for k, v in result.backups.items()},
        "forced_over": result.forced_over,
        "recovered": result.recovered,
        "kept_out_of_retention": result.kept,
        "warnings": outcome.warnings,
        "warm_records": outcome.adopted,
        "seconds": round(result.seconds, 3),
    }


def print_restore(console: Console, outcome: RestoreOutcome) -> None:
    result, manifest = outcome.result, outcome.result.manifest
    for action in result.recovered:
        console.print(f"  [yellow]recovered:[/] {shown(action)}")
    for warning in outcome.warnings:
        console.print(f"  [yellow]note:[/] {shown(warning)}")
    for kept in result.kept:
        console.print(f"  [yellow]kept:[/] {shown(kept)}; never deleted by retention, remove it yourself")
    if result.forced_over:
        console.print(f"  [yellow]--force: restored despite {shown('; '.join(result.forced_over))}[/]")
    console.print(
        f"[green]✓[/] restored [bold]{shown(manifest.name)}[/] from {shown(outcome.archive.name)}: "
        f"{len(manifest.files)} files, {_mb(manifest.total_bytes)}, every sha256 verified and every file "
        f"checked on disk at the swap, in {result.seconds:.2f} s"
    )
    for label, target in result.targets.items():
        backup = result.backups.get(label)
        kept = f" (previous kept as {backup})" if backup else ""
        where = _where(outcome.source) if label == "inductor" else ""
        console.print(f"  {label}: {shown(target)}{shown(kept)}{shown(where)}")
    if outcome.adopted:
        console.print(
            f"  {outcome.adopted} warm-up record(s) came with it: `train` with the same build and config "
            "skips its warm-up"
        )


@cache_app.command("restore")
@named_os_errors
def restore_command(
    snapshot: str = typer.Argument(..., help="A snapshot name from `cache list`, or a path to an archive."),
    force: bool = typer.Option(
        False,
        "--force",
        help="Restore even when made for another build, or when it holds no files for a cache that has some.",
    ),
    replace_non_cache: bool = ReplaceNonCacheOption,
    python: str | None = PythonOption,
    json_out: bool = JsonOption,
) -> None:
    """Verify a snapshot and swap it in atomically; the previous cache is kept as a backup.

    Restores where `train` looks: TORCHINDUCTOR_CACHE_DIR when set, else the managed cache."""
    outcome = restore_request(RestoreRequest(snapshot, force, replace_non_cache, python))
    if json_out:
        _emit("restore", restore_json(outcome))
    else:
        print_restore(_console(), outcome)


@cache_app.command("list")
@named_os_errors
def list_command(python: str | None = PythonOption, json_out: bool = JsonOption) -> None:
    """Snapshots in the store: name, size, created, build, compatible with this environment or why not."""
    _, current = _current(python)
    store = SnapshotStore(snapshots_dir())
    store.check_usable()
    snapshots = store.snapshots()
    rows = []
    for snap in snapshots:
        reasons = snap.incompatible_with(current)
        rows.append((snap, reasons))
    if json_out:
        _emit(
            "list",
            {
                "store": str(snapshots_dir()),
                "current_build": current.to_json(),
                "snapshots": [
                    {
                        "name": s.name,
                        "path": str(s.path),
                        "archive_bytes": s.size_bytes,
                        "bytes": s.manifest.total_bytes if s.manifest else None,
                        "files": len(s.manifest.files) if s.manifest else None,
                        "created": s.created,
                        "created_in_the_future": s.from_the_future,
                        "store_order": s.sequence,
                        "fingerprint": s.manifest.fingerprint.to_json() if s.manifest else None,
                        "compatible": not reasons,
                        "incompatible_because": reasons,
                        "untrusted": s.untrusted,
                        "damaged": s.error if s.damaged else None,
                        "remedy": s.remedy,
                    }
                    for s, reasons in rows
                ],
            },
        )
        return
    console = _console()
    if not rows:
        console.print(
            f"no snapshots in {shown(str(snapshots_dir()))} (make one with `dflash-doctor cache snapshot`)"
        )
        return
    console.print(f"snapshots in {shown(str(snapshots_dir()))} (name, size, created, made for, compatible):")
    for snap, reasons in rows:
        made_for = snap.manifest.fingerprint.describe() if snap.manifest else "unreadable"
        verdict = (
            "[green]yes[/]" if not reasons else f"[yellow]no[/]: {shown(printable('; '.join(reasons), 400))}"
        )
        when = _when(snap.created) + (
            " (in the future: made with a clock running ahead)" if snap.from_the_future else ""
        )
        console.print(f"{shown(snap.name)}  {_mb(snap.size_bytes)}  {when}  {shown(made_for)}  {verdict}")
        for line, style in remedy_lines(printable(snap.remedy, 800)) if snap.remedy else []:
            console.print(f"  {line}", style=style, markup=False)


@cache_app.command("prune")
@named_os_errors
def prune_command(
    keep: int | None = typer.Option(None, "--keep", min=0, help="Keep the newest N snapshots."),
    older_than: str | None = typer.Option(
        None, "--older-than", help="Delete snapshots older than this: 7d, 12h."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be deleted; delete nothing."),
    json_out: bool = JsonOption,
) -> None:
    """Delete old snapshots: beyond the newest N and/or older than a duration (both: both must hold)."""
    if keep is None and older_than is None:
        raise DoctorError(
            "prune needs --keep N and/or --older-than DURATION", hint="e.g. --keep 3 --older-than 7d"
        )
    age = parse_duration(older_than) if older_than else None
    store = SnapshotStore(snapshots_dir())
    if not dry_run:
        store.check_writable("prune")
    with store.locked():
        ours = [snap for snap in store.snapshots() if snap.ours]  # another user's archive is never deleted
        doomed = choose_prunable(ours, keep, age, time.time())
        if not dry_run:
            for snap in doomed:
                snap.path.unlink(missing_ok=True)
    if json_out:
        _emit("prune", {"dry_run": dry_run, "removed": [s.name for s in doomed]})
        return
    console = _console()
    verb = "would delete" if dry_run else "deleted"
    for snap in doomed:
        console.print(f"  {verb} {shown(snap.name)} ({_mb(snap.size_bytes)}, {_when(snap.created)})")
    console.print(f"{verb} {len(doomed)} snapshot(s)")


@cache_app.command("warm")
@named_os_errors
def warm_command(
    config: Path | None = ConfigOption,
    device: str = typer.Option("cpu", "--device", help="cpu or cuda (cuda:N)."),
    heads: int = typer.Option(WarmShapes.heads, "--heads"),
    head_dim: int = typer.Option(WarmShapes.head_dim, "--head-dim"),
    kv_heads: int = typer.Option(WarmShapes.kv_heads, "--kv-heads"),
    anchors: int = typer.Option(WarmShapes.anchors, "--anchors"),
    block: int = typer.Option(WarmShapes.block, "--block"),
    context: int = typer.Option(WarmShapes.context, "--context"),
    name: str | None = typer.Option(None, "--name", help="Name of the snapshot taken afterwards."),
    no_snapshot: bool = typer.Option(False, "--no-snapshot", help="Compile only; take no snapshot."),
    python: str | None = PythonOption,
    json_out: bool = JsonOption,
) -> None:
    """Compile training's functions once, in one process, main thread, then snapshot the cache."""
    if config is not None and not config.is_file():
        raise DoctorError(f"--config {config}: no such file")
    check_device(device)
    shapes = WarmShapes(heads, head_dim, kv_heads, anchors, block, context)
    shapes.validate()
    env, current = _current(python)
    if env.torch is None:
        raise DoctorError(f"torch is not installed for {env.interpreter.executable}", hint="nothing to warm")
    locations = command_locations(os.environ)
    check_apart(locations.roots())
    if not no_snapshot:  # a read-only store is named before minutes of compiling, not after (B7)
        SnapshotStore(snapshots_dir()).check_writable("`cache warm`'s snapshot (--no-snapshot compiles only)")
    interpreter = python or sys.executable
    command = child_command(interpreter, device, shapes, config)
    # No restore swaps the folder while the child compiles: the child holds the locks too, and dies with us (W2)
    with folder_locks(locations.roots().values()) as parents:
        environ = child_environ(os.environ, locations.inductor, locations.triton)
        result = run_warm_child(command, environ, pass_fds=held_lock_fds(parents))
    misses, hits = compile_count(result)
    snapshot: dict[str, Any] | None = None
    if not no_snapshot:
        store = SnapshotStore(snapshots_dir())
        now = time.time()
        snap_name = check_name(name) if name else default_name(current, now)
        with store.locked():
            dest = archive_destination(store.root, snap_name, None)
            taken = take_snapshot(
                locations.roots(), current, snap_name, dest, now=now, records=default_records()
            )
            store.record(taken.path)
        snapshot = {"name": snap_name, "path": str(taken.path), "files": len(taken.manifest.files)}
    if json_out:
        _emit(
            "warm", {"result": result, "fxgraph_misses": misses, "fxgraph_hits": hits, "snapshot": snapshot}
        )
        return
    console = _console()
    console.print(
        f"[green]✓[/] warmed: {shown(result.get('what', ''))} on {shown(str(result.get('device')))} in "
        f"{result.get('first_call_seconds')} s (fxgraph cache: {misses} compiled, {hits} from cache)"
    )
    if snapshot:
        console.print(f"  snapshot [bold]{shown(snapshot['name'])}[/]: {snapshot['files']} files")


def register(app: typer.Typer) -> None:
    app.add_typer(cache_app, name="cache")
