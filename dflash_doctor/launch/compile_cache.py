"""The launch's compile cache: made warm before torchrun starts, snapshotted after a run succeeds.

Workers must never compile concurrently from a cold cache (the story's crash), so before launch the
managed cache is made warm for this build: restored from a compatible snapshot, or compiled once by
`cache warm` in a single process. A launch of one process in all has no such race: its rank compiles for itself
beside the gate (`lone_rank.py`), under the same plan (`plan_warm_up`) and leaving the same record
(`rank_warmed_up`). After a successful run the cache is snapshotted (keeping the last N).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_base.atomic import write_bytes_atomic
from dflash_base.errors import DoctorError
from dflash_doctor.cache.claim import claim_cache_folders
from dflash_doctor.cache.fingerprint import BuildFingerprint, fingerprint_of, read_gpu_names
from dflash_doctor.cache.locations import snapshots_dir, warm_configs_dir
from dflash_doctor.cache.snapshot import archive_destination, take_snapshot
from dflash_doctor.cache.status import gather_status, warmth_of
from dflash_doctor.cache.store import SnapshotStore, choose_prunable, default_name
from dflash_doctor.cache.store_restore import restore_from_store
from dflash_doctor.cache.warm import WarmShapes, child_command, compile_count, run_warm_child
from dflash_doctor.cache.warm_record import (
    WarmRecords,
    cache_files,
    default_records,
    run_reason,
    skip_reason,
    warm_key,
)
from dflash_doctor.env.environment import Environment

KEEP_SNAPSHOTS = 5
WARM_CONFIG_MAX_AGE_S = 7 * 24 * 3600  # warm-up configs unused this long are pruned
TRAIN_PREFIX = "train-"  # snapshots taken after runs; only these are pruned automatically


@dataclass
class CachePreparation:
    action: str  # "warm" | "restored" | "warmed" | "none"
    detail: str
    seconds: float


def current_fingerprint(env: Environment) -> BuildFingerprint:
    return fingerprint_of(env, read_gpu_names())


@dataclass
class WarmUpPlan:
    """What the launch's warm-up is to do, decided before it runs (`plan_warm_up`): the cache restored if it
    was cold, the warm-up's key, and whether a record lets it be skipped. The warm-up child runs it
    (`prepare_compile_cache`), or a lone rank compiling for itself beside the gate (`rank_warmed_up`)."""

    began: float
    action: str  # "warm" | "restored", so far
    steps: list[str]
    records: WarmRecords
    key: str
    roots: dict[str, Path]
    devices: tuple[str, ...]
    device_type: str
    skip: str | None  # why the warm-up may be skipped (a record of this very warm-up, its files intact)
    why: str | None  # why it must run
    config: Path  # the config the warm-up compiles for, `--set` overrides applied
    environ: dict[str, str]  # the environment it compiles in

    def skipped(self) -> CachePreparation:
        return CachePreparation(
            self.action, "; ".join([*self.steps, self.skip or ""]), time.perf_counter() - self.began
        )

    def done(self, misses: int, hits: int, seconds: object, by: str) -> CachePreparation:
        """The warm-up ran (`by` says where) and compiled `misses` graphs: its record is kept."""
        where = ", ".join(self.devices) or self.device_type
        steps = [
            *self.steps,
            f"{by} on {where}: {misses} graphs compiled, {hits} from cache, {seconds} s (ran: {self.why})",
        ]
        try:
            self.records.save(self.key, self.devices, cache_files(self.roots))
        except (
            DoctorError
        ) as exc:  # the cache is warm; only the next launch's skip is lost (store_restore.py)
            steps.append(f"! its warm-up record was not kept: {exc.message}")
        action = "warmed" if misses and self.action == "warm" else self.action
        return CachePreparation(action, "; ".join(steps), time.perf_counter() - self.began)


def plan_warm_up(
    env: Environment,
    environ: dict[str, str],
    config_path: Path,
    device_type: str,
    drafter_devices: tuple[str, ...] = (),
    overrides: tuple[str, ...] = (),
    local_workers: int = 1,
) -> WarmUpPlan:
    """Steps 1 and 3 of `prepare_compile_cache`, and its key: everything but the compile itself."""
    start = time.perf_counter()
    fingerprint = current_fingerprint(env)
    status = gather_status(fingerprint, environ)
    steps: list[str] = []
    action = "warm"
    records = default_records()
    if warmth_of(status.main, fingerprint).state != "warm":
        compatible = sorted(status.compatible_snapshots(), key=lambda s: s.order)  # the store's order (C1)
        if compatible:
            newest = compatible[-1]
            try:  # a launch that can run cold is never stopped by its cache (issue 37 F2)
                restored = restore_from_store(
                    SnapshotStore(snapshots_dir()), str(newest.path), status.locations.roots(), fingerprint
                )
            except DoctorError as exc:
                fix = f"; fix: {exc.hint}" if exc.hint else ""  # a lock folder others can write (L2), say
                steps.append(f"! snapshot {newest.name} not restored ({exc.message}{fix}); compiling cold")
            else:
                steps.append(f"restored snapshot {newest.name} ({len(restored.result.manifest.files)} files)")
                steps.extend(f"! {warning}" for warning in restored.warnings)
                action = "restored"
    # What the warm-up and the workers will use, judged now, whatever became of the restore (issue 58, TR1).
    claim_cache_folders(status.locations.roots())
    from trainer.runspec.config_file import read_raw

    config = _config_with_overrides(config_path, overrides)
    roots = dict(status.locations.roots())
    environ = as_workers_see_it(environ, local_workers)
    key = warm_key(
        fingerprint,
        {**graph_fields(read_raw(config)), WORKER_THREADS: environ.get(THREADS_VARIABLE, "default")},
        device_type,
        drafter_devices,
        env.interpreter.executable,
        environ,
    )
    return WarmUpPlan(
        began=start,
        action=action,
        steps=steps,
        records=records,
        key=key,
        roots=roots,
        devices=drafter_devices,
        device_type=device_type,
        skip=skip_reason(records, key, roots, environ),
        why=run_reason(records, key, roots, environ),
        config=config,
        environ=environ,
    )


def prepare_compile_cache(
    env: Environment,
    environ: dict[str, str],
    config_path: Path,
    device_type: str,
    drafter_devices: tuple[str, ...] = (),
    overrides: tuple[str, ...] = (),
    local_workers: int = 1,
    cancel: threading.Event | None = None,
) -> CachePreparation:
    """Make the managed cache warm for this build on every drafter device, before any worker starts.

    1. Cold for this build and a compatible snapshot exists: restore it (verified, atomic).
    2. Then run the trainer's warm-up in ONE child process, device after device: from a warm cache it
       only loads (seconds, all hits); otherwise it compiles here, alone, instead of in the workers.
       This matters because Inductor keys compiled graphs by device index: a cache warmed on cuda:0 does
       not serve a drafter on cuda:1 (measured on 2 H200s: the worker compiled again). The child is
       skipped when a record says this exact warm-up already ran and every cache file it left is still
       there (warm_record.py), also a record the restored snapshot carried; DFLASH_DOCTOR_ALWAYS_WARM=1 runs
       it regardless.
    3. The child runs with the CPU thread count the workers will have (`local_workers`: torchrun's processes
       on this node): Inductor's C++ kernels are generated for a thread count, so a warm-up at another one
       compiled graphs no worker could use (issue 39 U4: on CPU the worker compiled the same graph again).
    4. `cancel`: it runs beside the deep probe (`lifecycle.EarlyWarmUp`); once set, the child is stopped.
    """
    plan = plan_warm_up(
        env, environ, config_path, device_type, drafter_devices, overrides, local_workers=local_workers
    )
    if plan.skip is not None:
        return plan.skipped()
    command = child_command(
        env.interpreter.executable,
        device_type,
        WarmShapes(),
        config=plan.config,
        trainer_devices=drafter_devices,
    )
    if cancel is None:  # stand-ins for the child in tests take (command, environ)
        report = run_warm_child(command, plan.environ)
    else:
        report = run_warm_child(command, plan.environ, cancel=cancel)
    misses, hits = compile_count(report)
    return plan.done(misses, hits, report.get("first_call_seconds"), "warm-up")


def rank_warmed_up(plan: WarmUpPlan, report: Mapping[str, Any]) -> CachePreparation:
    """A lone rank compiled its own graphs beside the gate (`lone_rank.py`), into the folder the warm-up child
    would have used: the same record is kept for it (the next launch of this config skips the warm-up as after
    the child), unless one already let it be skipped. Called once its compile succeeded and the gate passed."""
    if plan.skip is not None:
        prep = plan.skipped()
        prep.detail += "; the rank loaded its graphs beside the gate"
        return prep
    startup = report.get("startup")
    seconds = report.get("seconds")
    if isinstance(startup, dict):  # a colocated rank's target compile counts too
        seconds = round(sum(float(startup.get(k, 0.0)) for k in ("compile target", "compile")), 3)
    misses = int(report.get("fxgraph_cache_miss", 0))
    hits = int(report.get("fxgraph_cache_hit", 0))
    return plan.done(misses, hits, seconds, "the rank compiled for itself beside the gate")


THREADS_VARIABLE = "OMP_NUM_THREADS"
WORKER_THREADS = "worker threads"  # in the warm-up key: graphs compiled for another thread count are others


def as_workers_see_it(environ: dict[str, str], local_workers: int) -> dict[str, str]:
    """`environ` with the thread count torchrun gives its workers: it sets OMP_NUM_THREADS=1 when it starts
    more than one process on a node and the variable is unset (torch.distributed.run)."""
    if local_workers > 1 and THREADS_VARIABLE not in environ:
        return {**environ, THREADS_VARIABLE: "1"}
    return environ


def graph_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The raw config with only the fields that can change a compiled graph (each field declares its effect:
    trainer.runspec.field_effects), so a launch that changes only `optim.lr` or `eval.every` finds the warm-up
    record of the last one (issue 39 U4)."""
    from trainer.runspec.field_effects import graph_part

    return graph_part(raw)


def _config_with_overrides(config_path: Path, overrides: tuple[str, ...]) -> Path:
    """The warm-up must see the shapes training will use, `--set` overrides included.

    The overridden config is a file named by its content's digest under the dflash-doctor home, written
    atomically and reused by the next launch with the same overrides: nothing is left in the temp folder,
    whatever becomes of the warm-up (failed, interrupted, killed). Files unused for a week are pruned.
    """
    if not overrides:
        return config_path
    import tomllib

    from trainer.runspec.config_file import apply_overrides, config_to_toml

    text = config_to_toml(apply_overrides(tomllib.loads(config_path.read_text()), list(overrides)))
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    folder = warm_configs_dir()
    target = folder / f"{config_path.stem}.{digest}.toml"
    if _reads(target) == text:
        os.utime(target)  # in use again: the prune keeps it
    else:
        write_bytes_atomic(target, text.encode())
    _prune_warm_configs(folder, keep=target)
    return target


def _reads(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _prune_warm_configs(folder: Path, keep: Path, max_age_s: float = WARM_CONFIG_MAX_AGE_S) -> None:
    """Remove warm-up configs no launch has used for `max_age_s` (one per distinct `--set`, a few KB)."""
    cutoff = time.time() - max_age_s
    for path in folder.glob("*.toml"):
        with contextlib.suppress(OSError):
            if path != keep and path.stat().st_mtime < cutoff:
                path.unlink()


def snapshot_after_success(env: Environment, environ: dict[str, str], keep: int = KEEP_SNAPSHOTS) -> str:
    """Snapshot the managed cache the run used and prune older ones; returns a line for the record. A snapshot
    that cannot be taken (our refusals, a disk or file error) is that line, `no snapshot: <why>`: the run
    succeeded whatever becomes of its bookkeeping. Anything else is a bug of ours and stays loud."""
    fingerprint = current_fingerprint(env)
    status = gather_status(fingerprint, environ)
    store = SnapshotStore(snapshots_dir())
    now = time.time()
    name = f"{TRAIN_PREFIX}{default_name(fingerprint, now)}"
    try:
        with store.locked():
            store.remove_partials()
            taken = take_snapshot(
                status.locations.roots(),
                fingerprint,
                name,
                archive_destination(store.root, name, None),
                now=now,
                records=default_records(),
            )
            store.record(taken.path)
            ours = [s for s in store.snapshots() if s.name.startswith(TRAIN_PREFIX)]
            for old in choose_prunable(ours, keep=keep, older_than=None, now=now):
                old.path.unlink(missing_ok=True)
    except DoctorError as exc:
        return f"no snapshot: {exc.message}"
    except OSError as exc:  # a full disk, a file that cannot be read: the run still succeeded
        where = f"{exc.filename}: " if exc.filename is not None else ""
        return f"no snapshot: {where}{exc.strerror or exc}"
    return f"snapshot {name}: {len(taken.manifest.files)} files"
