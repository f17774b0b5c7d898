"""SIGKILL the restoring process at random moments: the cache is always the complete old one or the
complete new one, and whenever it is the new one, the backup holds the complete old one.

The child runs the production restore; the only thing the test changes in it is `_pause`, the hook
called after each file and between swap steps, which here reports progress on a pipe and sleeps a
little. The parent picks a random progress point, waits for it, adds random jitter, and kills.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import time
from pathlib import Path

from dflash_doctor.cache.restore import recover_interrupted, restore_snapshot
from dflash_doctor.cache.snapshot import take_snapshot
from tests.cache.helpers import CPU_BUILD, fork_reporting, make_tree, tree_digests, wait_for_progress

RUNS = 60
NEW_FILES = 60


def restore_in_child(archive: Path, target: Path) -> tuple[int, int]:
    """Fork a process that restores and exits; return (pid, read end of its progress pipe)."""
    return fork_reporting(lambda: restore_snapshot(archive, {"inductor": target}, CPU_BUILD))


def backups_of(target: Path) -> list[Path]:
    return sorted(target.parent.glob(f"{target.name}.bak-*"))


def test_sigkill_at_random_moments_leaves_old_or_new_whole(tmp_path: Path) -> None:
    new_tree = tmp_path / "new"
    new = make_tree(new_tree, files=NEW_FILES, seed=2, size=60_000)
    archive = take_snapshot({"inductor": new_tree}, CPU_BUILD, "new", tmp_path / "new.tar.zst").path
    target = tmp_path / "run" / "inductor"
    old = make_tree(target, files=40, seed=1, size=60_000)
    points = NEW_FILES + 2  # one per file, one before the swap, one inside it
    rng = random.Random(1234)
    outcomes = {"old": 0, "new": 0}
    for run in range(RUNS):
        for leftover in backups_of(target):
            shutil.rmtree(leftover)
        if tree_digests(target) != old:
            shutil.rmtree(target)
            make_tree(target, files=40, seed=1, size=60_000)
        # two runs in three anywhere; one in three around the swap, where the renames happen
        at = rng.randint(0, points) if run % 3 else rng.randint(points - 2, points)
        pid, progress = restore_in_child(archive, target)
        wait_for_progress(progress, at)
        time.sleep(rng.uniform(0, 0.001))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(progress)

        # At the moment of the kill, before any recovery: whole old or whole new, never a mix.
        assert tree_digests(target) in (old, new), f"run {run}: the cache is a mix of old and new"
        recover_interrupted(target)  # what the next restore does first
        seen = tree_digests(target)
        assert seen in (old, new)
        assert not [p for p in target.parent.iterdir() if ".dflash-staging-" in p.name], "staging left behind"
        if seen == new:
            outcomes["new"] += 1
            backups = backups_of(target)
            assert len(backups) == 1 and tree_digests(backups[0]) == old, "the backup must hold the old cache"
        else:
            outcomes["old"] += 1
    assert outcomes["old"] >= 10 and outcomes["new"] >= 5, f"kills did not span the restore: {outcomes}"
