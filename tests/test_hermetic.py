"""The test session compiles and keeps state only in its own folder (tests/conftest.py), never in the
machine-wide `/tmp/torchinductor_<user>` another torch process may be using, nor in the user's caches."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from dflash_doctor.cache.locations import default_inductor_dir
from dflash_doctor.paths import cache_root, state_root
from tests.conftest import MACHINE_TEMP

# A compile in a child process (it inherits the session's variables, as torchrun and the warm-up child do),
# reporting where torch put things. The constant makes the generated kernel's source unique to this test.
_COMPILE = """
import json, sys, torch
from torch._inductor import codecache
from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir
fn = torch.compile(lambda x: (x * {marker}).sin() + 1.0, dynamic=False)
fn(torch.ones(8))
print(json.dumps({{"cache_dir": cache_dir(), "default": default_cache_dir(), "headers": codecache._HEADER_DIR}}))
"""


def _inside(path: str | Path, root: Path) -> bool:
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))


def _sources_mentioning(root: Path, text: str, since: float) -> list[Path]:
    """Generated kernel sources under `root` written since `since` that contain `text`."""
    hits = []
    for pattern in ("*.py", "*.cpp"):
        for path in root.rglob(pattern) if root.is_dir() else []:
            try:
                if path.stat().st_mtime >= since and text in path.read_text(errors="replace"):
                    hits.append(path)
            except OSError:
                continue
    return hits


def test_every_cache_and_state_folder_is_inside_the_session_folder(session_root: Path) -> None:
    from torch._inductor import codecache
    from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir

    for where in (cache_dir(), default_cache_dir(), codecache._HEADER_DIR, cache_root(), state_root()):
        assert _inside(where, session_root), where
    assert _inside(os.environ["TRITON_CACHE_DIR"], session_root)
    assert _inside(os.environ["HF_HOME"], session_root)


def test_a_real_compile_in_a_child_lands_in_the_session_folder_not_the_machine_wide_one(
    session_root: Path,
) -> None:
    marker = f"1.{secrets.randbelow(10**8):08d}7"  # never ends in 0: the kernel source writes repr(float)
    began = time.time() - 1
    done = subprocess.run(
        [sys.executable, "-c", _COMPILE.format(marker=marker)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    where = json_line(done.stdout)
    for key in ("cache_dir", "default", "headers"):
        assert _inside(where[key], session_root), (key, where[key])
    assert _sources_mentioning(Path(where["cache_dir"]), marker, began), "the kernel was not cached here"
    assert Path(where["headers"]).is_dir()  # CPU kernels precompile their header in the session's folder
    machine_wide = default_inductor_dir(tempdir=MACHINE_TEMP)
    assert not _sources_mentioning(machine_wide, marker, began), f"{machine_wide} got this test's kernel"


def json_line(stdout: str) -> dict[str, str]:
    data = json.loads(stdout.strip().splitlines()[-1])
    assert isinstance(data, dict)
    return data
