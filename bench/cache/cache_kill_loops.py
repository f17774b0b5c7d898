"""SIGKILL the cache store's commands at random moments and count what every kill left (issues 21, 30).

Loops, each in forked children running the production code (the only change: restore's `_pause`
hook, or the deletions of a backup, report progress on a pipe, so a kill can be aimed at a file, a swap
step or a deletion):
- `restore` of one root, kills anywhere and aimed at the exchange;
- `restore` of one root through the two-rename fallback (the exchange made unavailable in the child);
- `restore` of two roots (inductor + triton), kills anywhere and between the two roots' swaps;
- `restore` into an absent cache (the restore holds the name with an empty folder of its own);
- `snapshot` into the store, killed after a random delay;
- snapshot `prune`, killed after a random delay;
- backup retention (`prune_backups`, four backups down to two), killed at a random file or folder deletion;
- two homes restoring two archives into one cache in a shared (1777) parent where another user (uid 65534)
  took the lock's name first, one of them killed at a random point (issue 37, G3; root only);
- a restore into a bind-mounted cache folder (`mount --bind` in a mount namespace of its own, as
  `docker -v host:<cache>`), killed at a random point: refused before anything is written (B1; root only);
- `cache warm` (the command, its compile child a stand-in that writes a file into the cache every 10 ms),
  killed at a random moment; then a restore into that cache: the child must be gone at once and nothing may
  be added to the restored cache after it said "verified" (issue 58, W2).
After each kill: the state at the kill, then recovery (what the next command does first), then the
invariants: a cache is the whole old tree or the whole new one and all roots of one restore agree;
a new cache's backup is the whole old tree; no staging folder, journal, half-deleted backup or partial
archive is left; every backup left is whole and carries its record; every archive the store lists reads
back whole. Prints a table and writes JSON.

    .venv/bin/python -m bench.cache.cache_kill_loops [--restores 50] [--fallback 50] [--two-roots 50] \
        [--absent 50] [--snapshots 50] [--prunes 50] [--retention 50] [--two-homes 50] [--bind-mount 50] \
        [--warms 50] [--seed 30]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.lib.cache_trees import fork_reporting, make_tree, tree_digests, wait_for_progress
from dflash_doctor.cache import fsops, restore
from dflash_doctor.cache.archive import extract_verified
from dflash_doctor.cache.backups import BACKUP_TAG, DOOMED_TAG, prune_backups
from dflash_doctor.cache.fingerprint import BuildFingerprint
from dflash_doctor.cache.folder_lock import folder_locks
from dflash_doctor.cache.manifest import BACKUP_OWNER_NAME, backup_owner_bytes
from dflash_doctor.cache.restore import recover_interrupted, restore_snapshot
from dflash_doctor.cache.snapshot import take_snapshot
from dflash_doctor.cache.store import SnapshotStore, choose_prunable

BUILD = BuildFingerprint("2.13.0+cpu", "cf30153c4c131c8164ee7798e5022d810682e2cb", None, None, "3.11", None)
FILES = 40
OTHER_UID = 65534  # the other user of the two-homes loop
RESULTS = Path(__file__).resolve().parents[1] / "results" / "cache_kill_loops.json"


def child(work: Callable[[], object]) -> int:
    """Fork a child that runs `work` and exits (no progress reports: killed after a delay)."""
    pid, read_end = fork_reporting(work)
    os.close(read_end)
    return pid


def kill_at(pid: int, read_end: int, points: int, rng: random.Random) -> None:
    wait_for_progress(read_end, points)
    time.sleep(rng.uniform(0, 0.001))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def leftovers(folder: Path) -> list[str]:
    """Staging folders, journals and half-deleted backups: what no finished command leaves."""
    return [
        p.name
        for p in folder.iterdir()
        if "staging" in p.name or DOOMED_TAG in p.name or p.name.endswith(restore.JOURNAL_SUFFIX)
    ]


def restore_loop(
    work: Path, runs: int, rng: random.Random, roots: tuple[str, ...], fallback: bool, absent: bool = False
) -> Counter:
    new_src = {label: work / f"new-{label}" for label in roots}
    new = {
        label: make_tree(path, files=FILES, seed=2 + i, size=30_000)
        for i, (label, path) in enumerate(new_src.items())
    }
    archive = take_snapshot(new_src, BUILD, "new", work / "new.tar.zst").path
    targets = {label: work / "run" / label for label in roots}

    def make_old(label: str, target: Path) -> dict[str, str]:
        if absent:
            target.parent.mkdir(parents=True, exist_ok=True)
            return {}
        return make_tree(target, files=25, seed=7 + list(roots).index(label), size=30_000)

    old = {label: make_old(label, target) for label, target in targets.items()}
    points = FILES * len(roots) + 2 * len(roots)
    counts: Counter = Counter()
    for run in range(runs):
        for target in targets.values():
            for backup in target.parent.glob(f"{target.name}.bak-*"):
                shutil.rmtree(backup)
        for label, target in targets.items():
            if tree_digests(target) != old[label] or (absent and target.exists()):
                shutil.rmtree(target, ignore_errors=True)
                make_old(label, target)
        at = rng.randint(0, points) if run % 3 else rng.randint(points - 2 * len(roots), points)

        def run_restore() -> None:
            if fallback:
                fsops.exchange_at = lambda *args: False  # type: ignore[assignment]
            restore_snapshot(archive, targets, BUILD)

        pid, read_end = fork_reporting(run_restore)
        kill_at(pid, read_end, at, rng)
        os.close(read_end)
        at_kill = {label: tree_digests(t) if t.exists() else None for label, t in targets.items()}
        for label in roots:
            state = "old" if at_kill[label] == old[label] else "new" if at_kill[label] == new[label] else None
            if at_kill[label] is None:
                state = "absent"
            elif absent and at_kill[label] == {}:
                state = "an empty folder holding the name"
            counts[f"at kill: {state or 'MIX'}"] += 1
        if len(roots) > 1 and len({at_kill[label] == new[label] for label in roots}) > 1:
            counts["at kill: roots disagree (rolled forward by recovery)"] += 1
        with folder_locks(targets.values()):
            for target in targets.values():
                recover_interrupted(target)
        after = {label: tree_digests(t) for label, t in targets.items()}
        generations = {
            ("old" if after[label] == old[label] else "new" if after[label] == new[label] else "MIX")
            for label in roots
        }
        counts[
            "after recovery: "
            + ("/".join(sorted(generations)) if len(generations) > 1 else generations.pop())
        ] += 1
        if absent and any(t.is_dir() and not any(t.iterdir()) for t in targets.values()):
            counts["note: an empty folder left at the cache's name (killed before the journal)"] += 1
        if leftovers(work / "run"):
            counts["LEFTOVER staging, journal or half-deleted backup"] += 1
        if after == new:
            for label, target in targets.items():
                backups = list(target.parent.glob(f"{target.name}.bak-*"))
                if absent and backups:  # the empty folder that held the name is removed, not kept
                    counts["BAD backup of an empty placeholder"] += 1
                elif not absent and (len(backups) != 1 or tree_digests(backups[0]) != old[label]):
                    counts["BAD backup"] += 1
    return counts


def two_homes_loop(work: Path, runs: int, rng: random.Random) -> Counter:
    """Two homes (two DFLASH_DOCTOR_HOMEs, one user) restore archives A and B into one cache at once, in a
    1777 parent where uid 65534 created the lock's name first; A is killed at a random point, B runs to
    its end. After recovery the cache must be the whole old tree, A's or B's, and B must have succeeded."""
    shared = work / "run"
    shared.mkdir(parents=True)
    shared.chmod(0o1777)
    target = shared / "inductor"
    taken = shared / ".inductor.dflash-doctor.lock"
    taken.write_bytes(b"")
    os.chown(taken, OTHER_UID, OTHER_UID)
    trees, archives = {}, {}
    for seed, label in ((2, "A"), (3, "B")):
        source = work / f"new-{label}"
        trees[label] = make_tree(source, files=FILES, seed=seed, size=30_000)
        archives[label] = take_snapshot({"inductor": source}, BUILD, label, work / f"{label}.tar.zst").path
    old = make_tree(target, files=25, seed=7, size=30_000)
    counts: Counter = Counter()
    for _ in range(runs):
        for backup in shared.glob("inductor.bak-*"):
            shutil.rmtree(backup)
        shutil.rmtree(target, ignore_errors=True)
        make_tree(target, files=25, seed=7, size=30_000)

        def restore_from(home: str, archive: Path) -> Callable[[], object]:
            def work_() -> None:
                os.environ["DFLASH_DOCTOR_HOME"] = str(work / home)
                restore_snapshot(archive, {"inductor": target}, BUILD)

            return work_

        killed, killed_progress = fork_reporting(restore_from("home-a", archives["A"]))
        survivor, survivor_progress = fork_reporting(restore_from("home-b", archives["B"]))
        kill_at(killed, killed_progress, rng.randint(0, FILES + 2), rng)
        _, status = os.waitpid(survivor, 0)
        for end in (killed_progress, survivor_progress):
            os.close(end)
        if os.waitstatus_to_exitcode(status) != 0:
            counts["BAD the other home's restore failed"] += 1
        with folder_locks([target]):
            recover_interrupted(target)
        after = tree_digests(target)
        state = (
            "old" if after == old else "A" if after == trees["A"] else "B" if after == trees["B"] else "MIX"
        )
        counts[f"after recovery: {state}"] += 1
        if leftovers(shared):
            counts["LEFTOVER staging, journal or half-deleted backup"] += 1
    return counts


def bind_mount_loop(work: Path, runs: int, rng: random.Random) -> Counter:
    """Restores into a cache folder that is a bind mount of a host folder (same filesystem), killed at a
    random point: each is refused before anything is written; the host folder stays whole."""
    host, target = work / "host", work / "run" / "inductor"
    old = make_tree(host, files=25, seed=7, size=30_000)
    target.mkdir(parents=True)
    source = work / "new"
    make_tree(source, files=FILES, seed=2, size=30_000)
    archive = take_snapshot({"inductor": source}, BUILD, "new", work / "new.tar.zst").path
    subprocess.run(["mount", "--bind", str(host), str(target)], check=True)
    counts: Counter = Counter()
    try:
        for _ in range(runs):
            pid, progress = fork_reporting(lambda: restore_snapshot(archive, {"inductor": target}, BUILD))
            kill_at(pid, progress, rng.randint(0, FILES + 2), rng)
            os.close(progress)
            with folder_locks([target]):
                recover_interrupted(target)
            if tree_digests(target) != old or tree_digests(host) != old:
                counts["BAD the mounted cache changed"] += 1
            else:
                counts["after recovery: old (refused, nothing written)"] += 1
            if leftovers(work / "run"):
                counts["LEFTOVER staging, journal or half-deleted backup"] += 1
    finally:
        subprocess.run(["umount", str(target)], check=False)
    return counts


WRITER = """
import json, os, sys, time
cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
open(sys.argv[1], "w").write(str(os.getpid()))
for i in range(100):
    key = f"{i:02d}" + "w" * 50
    os.makedirs(os.path.join(cache, key[:2]), exist_ok=True)
    with open(os.path.join(cache, key[:2], f"c{key}.py"), "w") as out:
        out.write("compiled")
    time.sleep(0.01)
print("DFLASH_WARM_RESULT " + json.dumps({"what": "stand-in", "counters": {}}))
"""


def warm_loop(work: Path, runs: int, rng: random.Random) -> Counter:
    """`cache warm` killed outright while its compile child writes into the cache; then a restore into that
    cache. Before issue 58 (W2) the child ran on with no lock, and a restore printed "verified" while the
    orphan added files to the cache it had just put in place."""
    from dflash_doctor.cli import run as cli_run
    from dflash_doctor.commands import cache as cache_command

    cache = work / "run" / "inductor"
    source = work / "new"
    new = make_tree(source, files=FILES, seed=2, size=30_000)
    archive = take_snapshot({"inductor": source}, BUILD, "new", work / "new.tar.zst").path
    pid_file = work / "writer.pid"
    counts: Counter = Counter()
    for _ in range(runs):
        shutil.rmtree(work / "run", ignore_errors=True)
        make_tree(cache, files=25, seed=7, size=30_000)
        pid_file.unlink(missing_ok=True)

        def warm() -> None:
            os.environ.update(TORCHINDUCTOR_CACHE_DIR=str(cache), DFLASH_DOCTOR_HOME=str(work / "home"))
            cache_command.child_command = lambda *a, **k: [sys.executable, "-c", WRITER, str(pid_file)]  # type: ignore[assignment]
            cli_run(["cache", "warm", "--no-snapshot"])

        pid = child(warm)
        deadline = time.monotonic() + 30
        while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 0.8))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        writer = int(pid_file.read_text()) if pid_file.is_file() and pid_file.read_text() else None
        gone_by = time.monotonic() + 2.0
        while writer is not None and _alive(writer) and time.monotonic() < gone_by:
            time.sleep(0.01)
        if writer is not None and _alive(writer):
            counts["BAD the compile child outlived cache warm"] += 1
            os.kill(writer, signal.SIGKILL)
        else:
            counts["at kill: the compile child died with it"] += 1
        restore_snapshot(archive, {"inductor": cache}, BUILD, lock_timeout=30)
        time.sleep(0.2)  # an orphan would have added a file or more by now
        counts[
            "after recovery: new" if tree_digests(cache) == new else "BAD files added after the restore"
        ] += 1
        if leftovers(work / "run"):
            counts["LEFTOVER staging, journal or half-deleted backup"] += 1
    return counts


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat_file:
            return stat_file.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def private_mount_namespace() -> str | None:
    """Enter a mount namespace of this process's own (bind mounts made here stay here); why not, or None."""
    if os.getuid() != 0:
        return "needs root"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x00020000) != 0:  # CLONE_NEWNS
        return f"unshare: {os.strerror(ctypes.get_errno())}"
    done = subprocess.run(["mount", "--make-rprivate", "/"], capture_output=True, text=True)
    return None if done.returncode == 0 else f"mount --make-rprivate: {done.stderr.strip()}"


def retention_loop(work: Path, runs: int, rng: random.Random) -> Counter:
    """Four backups of ours, pruned down to two in a child killed at a random deletion; then what the
    next command does first (finish the deletions it finds), then the invariants."""
    target = work / "run" / "inductor"
    make_tree(target, files=5, seed=1)
    trees = {
        f"inductor{BACKUP_TAG}r{i}": make_tree(work / "src" / str(i), files=30, seed=40 + i) for i in range(4)
    }
    # progress points of deleting the two oldest: each file and folder of a backup, its record, its top
    deletions = sum(sum(1 for _ in (work / "src" / str(i)).rglob("*")) + 2 for i in range(2))
    counts: Counter = Counter()
    for _ in range(runs):
        for path in target.parent.iterdir():
            if path != target and not path.name.endswith(".lock"):
                shutil.rmtree(path)
        for i, name in enumerate(trees):
            shutil.copytree(work / "src" / str(i), target.parent / name)
            record = backup_owner_bytes(f"r{i}", str(target), 1000.0 + i)
            (target.parent / name / BACKUP_OWNER_NAME).write_bytes(record)

        def prune() -> None:
            real_unlink, real_rmdir = os.unlink, os.rmdir

            def reporting(real: Callable[..., None]) -> Callable[..., None]:
                def call(*args: object, **kwargs: object) -> None:
                    real(*args, **kwargs)
                    restore._pause()  # one byte on the progress pipe (fork_reporting)

                return call

            os.unlink, os.rmdir = reporting(real_unlink), reporting(real_rmdir)  # type: ignore[assignment]
            with folder_locks([target]):
                prune_backups(target, keep=2)

        pid, read_end = fork_reporting(prune)
        kill_at(pid, read_end, rng.randint(0, deletions + 2), rng)
        os.close(read_end)
        cut = [p for p in target.parent.iterdir() if DOOMED_TAG in p.name]
        counts["at kill: a deletion cut short" if cut else "at kill: no deletion under way"] += 1
        with folder_locks([target]):
            recover_interrupted(target)  # what the next restore or snapshot does first
        left = {p.name for p in target.parent.iterdir() if p != target and not p.name.endswith(".lock")}
        if any(DOOMED_TAG in name for name in left):
            counts["LEFTOVER half-deleted backup"] += 1
        whole = {name for name in left if name in trees and tree_digests(target.parent / name) == trees[name]}
        if left - whole:
            counts["MIX or LEFTOVER beside the cache"] += 1
        if any(not (target.parent / name / BACKUP_OWNER_NAME).is_file() for name in whole):
            counts["BAD backup without its record"] += 1
        counts[f"after recovery: {len(whole)} whole backups"] += 1
        if len(whole) == 2 and whole != set(list(trees)[2:]):
            counts["BAD retention kept the wrong two"] += 1
    return counts


def timed_kill_loop(
    runs: int,
    rng: random.Random,
    make: Callable[[], Callable[[], object]],
    duration: float,
    check: Callable[[], list[str]],
) -> Counter:
    counts: Counter = Counter()
    for _ in range(runs):
        work = make()
        pid = child(work)
        time.sleep(rng.uniform(0, duration))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        counts["finished before the kill" if os.WIFEXITED(status) else "killed"] += 1
        for problem in check():
            counts[problem] += 1
    return counts


_VERIFIED: set[tuple[str, int, int]] = set()  # (name, size, mtime_ns) of archives already read back whole


def store_problems(store: SnapshotStore) -> list[str]:
    """Partials left, or a listed archive that does not read back whole (each archive verified once)."""
    problems = []
    with store.locked():
        store.remove_partials()
    if [p for p in store.root.iterdir() if ".partial-" in p.name]:
        problems.append("LEFTOVER partial archive")
    for snap in store.snapshots():
        if snap.manifest is None:
            problems.append(f"UNREADABLE listed archive ({snap.error})")
            continue
        info = snap.path.stat()
        key = (snap.name, info.st_size, info.st_mtime_ns)
        if key in _VERIFIED:
            continue
        scratch = Path(tempfile.mkdtemp(prefix="verify-", dir=store.root.parent))
        try:
            extract_verified(snap.path, {label: scratch / label for label in snap.manifest.origins})
            _VERIFIED.add(key)
        except Exception as exc:
            problems.append(f"BROKEN listed archive ({type(exc).__name__})")
        finally:
            shutil.rmtree(scratch)
    return problems


def is_failure(outcome: str) -> bool:
    return "MIX" in outcome or outcome.startswith(("LEFTOVER", "BAD", "UNREADABLE", "BROKEN"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restores", type=int, default=50)
    parser.add_argument("--fallback", type=int, default=50)
    parser.add_argument("--two-roots", type=int, default=50)
    parser.add_argument("--absent", type=int, default=50)
    parser.add_argument("--snapshots", type=int, default=50)
    parser.add_argument("--prunes", type=int, default=50)
    parser.add_argument("--retention", type=int, default=50)
    parser.add_argument("--two-homes", type=int, default=50)
    parser.add_argument("--bind-mount", type=int, default=50)
    parser.add_argument("--warms", type=int, default=50)
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    results: dict[str, dict[str, int]] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dflash-kill-", dir=args.workdir) as scratch:
        base = Path(scratch)
        os.environ["DFLASH_DOCTOR_LOCK_DIR"] = str(base / "user-locks")  # the user's lock folder, here
        for name, runs, roots, fallback, absent in (
            ("restore (exchange)", args.restores, ("inductor",), False, False),
            ("restore (two-rename fallback)", args.fallback, ("inductor",), True, False),
            ("restore (two roots)", args.two_roots, ("inductor", "triton"), False, False),
            ("restore (absent cache)", args.absent, ("inductor",), False, True),
        ):
            work = base / name.replace(" ", "_").replace("(", "").replace(")", "")
            work.mkdir()
            results[name] = dict(restore_loop(work, runs, rng, roots, fallback, absent))
        (base / "retention").mkdir()
        results["backup retention"] = dict(retention_loop(base / "retention", args.retention, rng))
        if os.getuid() == 0 and args.two_homes:
            results["two homes, lock name taken (G3)"] = dict(
                two_homes_loop(base / "homes", args.two_homes, rng)
            )
        why_not = private_mount_namespace() if args.bind_mount else "not asked"
        if why_not is None:
            (base / "bind").mkdir()
            results["bind-mounted cache (B1)"] = dict(bind_mount_loop(base / "bind", args.bind_mount, rng))
        else:
            print(f"bind-mount loop skipped: {why_not}")

        if args.warms:
            (base / "warm").mkdir()
            results["cache warm, killed (W2)"] = dict(warm_loop(base / "warm", args.warms, rng))

        store = SnapshotStore(base / "store")
        store.ensure()
        cache = base / "cache" / "inductor"
        make_tree(cache, files=200, seed=5, size=60_000)
        serial = iter(range(10**6))

        def snapshot_work() -> Callable[[], object]:
            name = f"s{next(serial)}"

            def snapshot() -> None:  # as the commands do: under the store's lock, then its order noted (C1)
                with store.locked():
                    taken = take_snapshot({"inductor": cache}, BUILD, name, store.path_for(name))
                    store.record(taken.path)

            return snapshot

        start = time.perf_counter()
        take_snapshot({"inductor": cache}, BUILD, "timing", store.path_for("timing"))
        duration = (time.perf_counter() - start) * 1.3
        results["snapshot"] = dict(
            timed_kill_loop(args.snapshots, rng, snapshot_work, duration, lambda: store_problems(store))
        )

        def prune_work() -> Callable[[], object]:
            def prune() -> None:
                with store.locked():
                    for snap in choose_prunable(store.snapshots(), 1, None, time.time()):
                        snap.path.unlink(missing_ok=True)

            return prune

        def refill() -> list[str]:
            problems = store_problems(store)
            while len(list(store.root.glob("*.tar.zst"))) < 6:
                snapshot_work()()
            return problems

        refill()
        results["prune"] = dict(timed_kill_loop(args.prunes, rng, prune_work, 0.05, refill))
    seconds = time.perf_counter() - started

    table = Table(title=f"cache store kill loops (seed {args.seed}, {seconds:.0f} s)", title_justify="left")
    table.add_column("loop")
    table.add_column("runs", justify="right")
    table.add_column("outcomes")
    table.add_column("failures", justify="right")
    for name, counts in results.items():
        bad = sum(v for k, v in counts.items() if is_failure(k))
        runs = sum(v for k, v in counts.items() if k.startswith(("after recovery", "killed", "finished")))
        table.add_row(name, str(runs), ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), str(bad))
    Console(soft_wrap=True).print(table)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps({"seed": args.seed, "seconds": round(seconds, 1), "loops": results}, indent=2) + "\n"
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
