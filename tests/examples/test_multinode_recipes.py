"""examples/multinode/: the launch recipes (SLURM, a Kubernetes PyTorchJob, two CPU "nodes" on one machine)
use only options `train` has, parse, and the CPU one runs (issue 59)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import yaml

from dflash_doctor.cli import _register, app
from tests.trainer.trainer_runs import REPO, environment

RECIPES = REPO / "examples" / "multinode"


def train_options() -> set[str]:
    _register(["train"])  # the CLI registers the command it runs, lazily
    train = typer.main.get_command(app).commands["train"]  # type: ignore[attr-defined]
    return {opt for param in train.params for opt in (*param.opts, *param.secondary_opts)}


def train_lines(text: str) -> list[str]:
    """Each `dflash-doctor train ...` command of a recipe, its continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line for line in joined.splitlines() if "dflash-doctor" in line and " train " in line]


@pytest.mark.parametrize("name", ["cpu_two_nodes.sh", "slurm.sbatch", "pytorchjob.yaml"])
def test_every_recipe_launches_train_with_options_it_has(name: str) -> None:
    text = (RECIPES / name).read_text()
    if name.endswith(".yaml"):
        pod = yaml.safe_load(text)["spec"]["pytorchReplicaSpecs"]
        assert pod["Master"]["template"] == pod["Worker"]["template"]  # one pod spec, two replica sets
        text = "\n".join(pod["Master"]["template"]["spec"]["containers"][0]["args"])
    else:
        assert subprocess.run(["bash", "-n", str(RECIPES / name)], check=False).returncode == 0
    lines = train_lines(text) or [text]
    used = {flag for line in lines for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", line)}
    assert {"--nnodes", "--node-rank"} <= used, used
    assert used <= train_options(), used - train_options()


@pytest.mark.slow
def test_the_cpu_recipe_trains_two_nodes_on_this_machine(tmp_path: Path) -> None:
    env = {
        **environment(),
        "DIR": str(tmp_path),
        "DFLASH_DOCTOR": str(Path(sys.executable).parent / "dflash-doctor"),
    }
    done = subprocess.run(
        ["bash", str(RECIPES / "cpu_two_nodes.sh")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + "".join(
        (tmp_path / f"node{n}.log").read_text()[-3000:] for n in (0, 1)
    )
    assert "node 0: exit 0" in done.stdout and "node 1: exit 0" in done.stdout
    summary = json.loads((tmp_path / "out0" / "summary.json").read_text())
    assert summary["status"] == "ok" and all(
        p["target_node"] == p["drafter_node"] for p in summary["topology"]["pairs"]
    )
    assert os.path.isdir(tmp_path / "out0" / "export")
