"""test_dflash_mask_kernel.py under Triton's CPU interpreter, in a pytest of its own.

The interpreter is chosen when triton is first imported (TRITON_INTERPRET=1), for the whole process; in this
session it would also route CPU decoding through the interpreted decode-attention kernel. So a machine without
a GPU runs the kernel's tests in a child pytest with the variable set, and requires that none of them skipped.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernel's tests run in this session")
def test_kernel_tests_pass_under_the_interpreter(request: pytest.FixtureRequest) -> None:
    pytest.importorskip("triton")
    marks = "slow" if request.config.getoption("-m") == "slow" else "not slow and not gpu"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marks, "-rs",
         "tests/bench/test_dflash_mask_kernel.py"],
        cwd=ROOT, env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    summary = done.stdout.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary) and "skipped" not in summary, tail
