"""Issue 19: every remedy the doctor prints is a promise, proven on real environments (slow).

The environments come from `scripts/build_real_envs.py` (torch 2.9.1+cu128 and the story's states from
the index, torch 2.14.1+cu130 and its broken copies; hard-linked copies, built once):

    .venv/bin/python scripts/build_real_envs.py
    .venv/bin/python -m pytest -m slow tests/real_wheels/test_real_wheels_remedies.py

For each environment the ground truth is a real `import torch` in it. `bench/doctor/remedy_table.py` applies
every remedy, as printed and with no terminal, to a hard-linked copy; here: each must exit 0, keep
`import torch` working wherever it worked, and not be printed again; one round of all remedies must leave
`import torch` working and a re-check exiting 0; a healthy environment must not fail. Environments not
built (under `DFLASH_DOCTOR_REAL_ENVS`, default `.tmp/real-envs`) are skipped.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.doctor import remedy_table

pytestmark = pytest.mark.slow

build_real_envs = remedy_table.build_real_envs
HEALTHY = {"cu128", "cu13"}


@pytest.fixture
def scratch() -> Iterator[Path]:
    """Copies live beside the environments (hard links need one filesystem)."""
    folder = Path(tempfile.mkdtemp(prefix=".scratch-", dir=build_real_envs.ROOT))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("name", sorted(build_real_envs.RECIPES))
def test_every_remedy_is_a_promise(name: str, scratch: Path) -> None:
    if not (build_real_envs.ROOT / name / build_real_envs.DONE).is_file():
        pytest.skip(f"{name} not built: .venv/bin/python scripts/build_real_envs.py --only {name}")
    row = remedy_table.audit_environment(name, scratch)
    if name in HEALTHY:
        assert row.ground_truth == "ok" and row.check_exit == 0, row.findings
    for outcome in row.remedies:
        assert outcome.exit_code == 0, (outcome.remedy, outcome.stderr_tail)
        if row.ground_truth == "ok":
            assert outcome.import_torch == "ok", outcome  # never breaks a working torch
        assert not outcome.still_there, outcome
    assert row.one_round_import == "ok" and row.one_round_exit == 0, row.one_round_left
