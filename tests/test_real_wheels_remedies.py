"""Issue 19: every remedy the doctor prints is a promise, proven on real environments (slow).

The environments come from `scripts/build_real_envs.py` (torch 2.9.1+cu128 and the story's states from
the index, torch 2.14.1+cu130 and its broken copies; hard-linked copies, built once):

    .venv/bin/python scripts/build_real_envs.py
    .venv/bin/python -m pytest -m slow tests/test_real_wheels_remedies.py

For each environment: the ground truth is a real `import torch` in it. Every finding with a remedy has
that remedy applied, as printed, with no terminal, to a hard-linked copy: `import torch` must then work
wherever it worked before, and the finding must be gone. Then all remedies of one check, applied in one
round to one copy, must leave `import torch` working and a re-check exiting 0. A healthy environment
must not fail, and none of its remedies may break it. `DFLASH_DOCTOR_REAL_ENVS` names the folder;
environments not built there are skipped (the build downloads several GB from the index).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT_DIR / "scripts"))
import build_real_envs  # noqa: E402

HEALTHY = {"cu128", "cu13"}
ENVIRONMENTS = sorted(build_real_envs.RECIPES)


def built(name: str) -> Path:
    venv = build_real_envs.ROOT / name
    if not (venv / build_real_envs.DONE).is_file():
        pytest.skip(f"{name} not built: .venv/bin/python scripts/build_real_envs.py --only {name}")
    return venv


def copy(source: Path, scratch: Path, label: str) -> Path:
    target = scratch / label
    subprocess.run(["cp", "-al", str(source), str(target)], check=True)
    return target


def import_torch(venv: Path) -> str | None:
    """None when `import torch` works; else the last line of its error."""
    done = subprocess.run(
        [str(venv / "bin/python"), "-c", "import torch"], capture_output=True, text=True, check=False, cwd="/"
    )
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[-1]


def check(venv: Path, home: Path) -> tuple[int, list[dict]]:
    env = dict(os.environ, DFLASH_DOCTOR_HOME=str(home))
    env.pop("DFLASH_DOCTOR_CACHE_DIR", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dflash_doctor",
            "check",
            "--python",
            str(venv / "bin/python"),
            "--no-lock",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        cwd=ROOT_DIR,
    )
    report = json.loads(done.stdout)
    return done.returncode, report["findings"]


def with_remedies(findings: list[dict]) -> list[dict]:
    return [f for f in findings if f["remedy"] and f["severity"] in ("warn", "fail")]


def apply(remedy: str) -> subprocess.CompletedProcess[str]:
    """As a person pastes it, but with no terminal: stdin is empty, so a prompt would fail it."""
    return subprocess.run(
        ["bash", "-c", remedy], stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False, cwd="/"
    )


@pytest.fixture
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Copies live beside the environments (hard links need the same filesystem)."""
    folder = build_real_envs.ROOT / ".scratch" / tmp_path_factory.mktemp("r").name
    folder.mkdir(parents=True)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_each_remedy_alone_keeps_torch_importable_and_clears_its_finding(
    name: str, scratch: Path, tmp_path: Path
) -> None:
    source = built(name)
    before = import_torch(source)
    code, findings = check(source, tmp_path / "home")
    if name in HEALTHY:
        assert code == 0 and before is None, [f["id"] for f in findings if f["severity"] == "fail"]
    for index, finding in enumerate(with_remedies(findings)):
        env = copy(source, scratch, f"{index}")
        _, mine = check(env, tmp_path / f"home-{index}")  # the remedy names this copy's python
        remedy = next(f["remedy"] for f in with_remedies(mine) if f["id"] == finding["id"])
        ran = apply(remedy)
        assert ran.returncode == 0, (remedy, ran.stderr[-800:])
        if before is None:
            assert import_torch(env) is None, remedy  # never breaks a working torch
        _, after = check(env, tmp_path / f"home-{index}")
        assert remedy not in {f["remedy"] for f in after}, f"{finding['id']}: the same remedy again"
        shutil.rmtree(env)


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_one_round_of_remedies_leaves_a_working_torch_and_a_clean_check(
    name: str, scratch: Path, tmp_path: Path
) -> None:
    env = copy(built(name), scratch, "round")
    code, findings = check(env, tmp_path / "home")
    for finding in with_remedies(findings):
        ran = apply(finding["remedy"])
        assert ran.returncode == 0, (finding["remedy"], ran.stderr[-800:])
    assert import_torch(env) is None
    code, after = check(env, tmp_path / "home")
    assert code == 0, [(f["id"], f["summary"]) for f in after if f["severity"] == "fail"]
