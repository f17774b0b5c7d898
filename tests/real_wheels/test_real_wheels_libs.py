"""The story, reproduced on a real copy of the torch 2.14.1 cu130 venv (slow; needs ~6 GB of disk).

Set DFLASH_CU13_VENV (default /work/venvs/cu13; it is copied, never touched) and optionally
DFLASH_NCCL_CU12_WHEEL (a downloaded nvidia-nccl-cu12 wheel) and DFLASH_OLD_NCCL (an older
libnccl.so.2 for the LD_LIBRARY_PATH case). Each step compares the static verdict with what a real
`import torch` does in the same venv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dflash_doctor.context import CheckContext
from dflash_doctor.env.environment import Environment
from dflash_doctor.libs.loader import library_report
from dflash_doctor.registry import run_checks
from tests.libs_fixtures import compare_with_maps

pytestmark = pytest.mark.slow

SOURCE = Path(os.environ.get("DFLASH_CU13_VENV", "/work/venvs/cu13"))
NCCL12_WHEEL = os.environ.get("DFLASH_NCCL_CU12_WHEEL", "")
OLD_NCCL = os.environ.get("DFLASH_OLD_NCCL", "")
_IMPORT = (
    "import json, sys\n"
    "try:\n    import torch\nexcept Exception as e:\n"
    "    print(json.dumps({'error': f'{type(e).__name__}: {e}'})); sys.exit(0)\n"
    "maps = sorted({l.split()[5] for l in open('/proc/self/maps') if len(l.split()) > 5 and '.so' in l})\n"
    "print(json.dumps({'maps': maps}))\n"
)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (SOURCE / "bin" / "python").exists():
        pytest.skip(f"no cu13 venv at {SOURCE}")
    copy = tmp_path_factory.mktemp("cu13") / "venv"
    subprocess.run(["cp", "-a", str(SOURCE), str(copy)], check=True)
    yield copy
    shutil.rmtree(copy, ignore_errors=True)


def site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def real_import(venv: Path, ld_library_path: str = "") -> dict[str, object]:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", LD_LIBRARY_PATH=ld_library_path)
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", _IMPORT], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def audit(venv: Path, ld_library_path: str | None = None) -> tuple[CheckContext, dict[str, list]]:
    env = Environment.load(str(venv / "bin" / "python"))
    if ld_library_path is not None:
        env.interpreter = type(env.interpreter)(
            **{**env.interpreter.__dict__, "ld_library_path": ld_library_path}
        )
    ctx = CheckContext(env)
    found: dict[str, list] = {}
    for run in run_checks(ctx, ["libs"]):
        for f in run.findings:
            found.setdefault(f.id, []).append(f)
    return ctx, found


def pip(venv: Path, *args: str) -> None:
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", *args], check=True, capture_output=True)


def restore(venv: Path, folder: str, dist_glob: str) -> None:
    """Put a distribution back from the pristine venv (no network needed)."""
    src, dst = site(SOURCE), site(venv)
    shutil.rmtree(dst / folder, ignore_errors=True)
    shutil.copytree(src / folder, dst / folder, symlinks=True, dirs_exist_ok=True)
    for info in src.glob(dist_glob):
        shutil.copytree(info, dst / info.name, dirs_exist_ok=True)


def test_healthy_matches_proc_maps(venv: Path) -> None:
    ctx, found = audit(venv)
    assert set(found) == {"libs.resolved"}
    real = real_import(venv)
    assert "maps" in real, real
    comparison = compare_with_maps(library_report(ctx), real["maps"])
    assert comparison.agrees, comparison
    assert len(comparison.agreed) > 30


@pytest.mark.parametrize(
    ("dist", "folder", "soname"),
    [
        ("nvidia-cudnn-cu13", "nvidia/cudnn", "libcudnn.so.9"),
        ("nvidia-cusparselt-cu13", "nvidia/cusparselt", "libcusparseLt.so.0"),
        ("nvidia-nccl-cu13", "nvidia/nccl", "libnccl.so.2"),
    ],
)
def test_uninstalled_provider_fails_like_the_real_import(
    venv: Path, dist: str, folder: str, soname: str
) -> None:
    pip(venv, "uninstall", "-y", dist)
    try:
        ctx, found = audit(venv)
        (miss,) = [f for f in found["libs.missing"] if f.evidence["soname"] == soname]
        assert miss.severity.value == "fail" and dist in (miss.remedy or "")
        real = real_import(venv)
        assert real.get("error") == library_report(ctx).import_error, real
    finally:
        restore(venv, folder, dist.replace("-", "_") + "-*.dist-info")


def test_old_nccl_on_ld_library_path_stays_unused(venv: Path) -> None:
    if not OLD_NCCL or not os.path.exists(OLD_NCCL):
        pytest.skip("set DFLASH_OLD_NCCL to an older libnccl.so.2")
    folder = os.path.dirname(OLD_NCCL)
    ctx, found = audit(venv, ld_library_path=folder)
    assert "libs.shadowed" not in found and "libs.outside" not in found
    real = real_import(venv, ld_library_path=folder)
    assert OLD_NCCL not in real["maps"]
    assert compare_with_maps(library_report(ctx), real["maps"]).agrees


def test_cu12_twin_then_its_uninstall(venv: Path) -> None:
    if not NCCL12_WHEEL or not os.path.exists(NCCL12_WHEEL):
        pytest.skip("set DFLASH_NCCL_CU12_WHEEL to a downloaded nvidia-nccl-cu12 wheel")
    pip(venv, "install", "--no-deps", "--no-index", NCCL12_WHEEL)
    try:
        _, found = audit(venv)
        assert "libs.missing" not in found  # the file is there; whose bytes it holds is ownership's verdict
        pip(venv, "uninstall", "-y", "nvidia-nccl-cu12")
        _, found = audit(venv)
        (miss,) = found["libs.missing"]
        assert miss.evidence["soname"] == "libnccl.so.2" and "nvidia-nccl-cu13==2.30.7" in (miss.remedy or "")
    finally:
        restore(venv, "nvidia/nccl", "nvidia_nccl_cu13-*.dist-info")
