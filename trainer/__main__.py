"""`python -m trainer --config X [--set section.key=value ...]`

Validates the config first (a bad field: one message naming it, exit code 2, no process group started).
With a rank (RANK/WORLD_SIZE set: by torchrun, or by `dflash-doctor train` for a launch of one process,
dflash_doctor/launch/direct.py) it runs this process's role. Started by hand, it re-executes itself under
`torch.distributed.run --standalone --nproc-per-node <ranks> --max-restarts 0` (a split: targets +
drafters; colocated: `topology.ranks`, else 1), since every rank joins a process group. A lone rank the
launcher started beside its gate (a link in its environment) compiles, then waits for the launcher's go.
"""

from __future__ import annotations

import argparse
import os
import sys

from dflash_base import timeline
from dflash_base.errors import DoctorError
from dflash_base.go_link import RankLink
from dflash_base.stopping import Stopped, install_stop_handlers

LINK_GRACE_S = 30.0  # as parent_watch's at most: a rank stuck in a call that never returns, after the stop


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer", description="Train a DFlash drafter.")
    parser.add_argument(
        "--config", required=True, help="a TOML file, or the name of a shipped config (tiny-cpu)"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one field (TOML value syntax), e.g. --set optim.steps=50; repeatable",
    )
    return parser.parse_args(argv)


def under_torchrun() -> bool:
    """This process was given a rank (by torchrun, or by the launcher that started a lone rank itself)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def spawn_phase() -> str:
    """The timeline's name for the time up to this process's own code: torchrun's start-up and this
    interpreter's, or, started without torchrun (torchrun sets TORCHELASTIC_RUN_ID), the interpreter's only."""
    return "torchrun start" if "TORCHELASTIC_RUN_ID" in os.environ else "worker spawn"


def relaunch_under_torchrun(world_size: int, argv: list[str]) -> None:
    """Replace this process by torchrun starting `world_size` copies of this command."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={world_size}",
        "--max-restarts=0",
        "-m",
        "trainer",
        *argv,
    ]
    sys.stdout.flush()
    os.execv(sys.executable, command)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    timeline.remember(spawn_phase())  # torchrun's start-up (if any) and this interpreter's, before our code
    args = parse_args(argv)
    link = None
    if under_torchrun():
        # Before torch is imported: a stop while importing is one line, not a KeyboardInterrupt traceback.
        install_stop_handlers()
        # A lone rank started beside the launcher's gate trains only on its go (dflash_base/go_link.py); the
        # link's end closing (a refusal, a launcher killed outright) stops it, from here on.
        link = RankLink.from_environ()
        if link is not None:
            link.watch(grace_s=LINK_GRACE_S)
            link.hold_stdout()
    try:
        from trainer.runspec.config import load_config

        cfg = load_config(args.config, args.overrides)
        if not under_torchrun():
            relaunch_under_torchrun(cfg.world_size, argv)
        timeline.remember("worker start")  # the config validated in the worker
        from trainer.run.train import main as train_main

        return train_main(cfg, link)
    except DoctorError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"  hint: {exc.hint}", file=sys.stderr)
        return exc.exit_code
    except Stopped as stop:
        print(f"dflash trainer: rank {os.environ.get('RANK', '?')}: {stop}", file=sys.stderr, flush=True)
        return stop.exit_code


if __name__ == "__main__":
    sys.exit(main())
