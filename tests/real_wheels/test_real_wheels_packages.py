"""The seed's story with real wheels, in a throw-away copy of a real torch 2.14.1+cu130 venv.

Slow (a 5.4 GB copy, a 300 MB wheel from PyPI), so deselected by default:
    .venv/bin/pytest -m slow tests/real_wheels/test_real_wheels_packages.py
`DFLASH_DOCTOR_CU13_VENV` names the venv to copy (default /work/venvs/cu13, never modified);
`DFLASH_DOCTOR_WHEELHOUSE` a folder holding (or receiving) `nvidia_nccl_cu12-2.27.5-*.whl`.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflash_doctor.cli import run as cli_run

pytestmark = pytest.mark.slow

SOURCE = Path(os.environ.get("DFLASH_DOCTOR_CU13_VENV", "/work/venvs/cu13"))
CPU_VENV = Path(os.environ.get("DFLASH_DOCTOR_CPU_VENV", "/work/venvs/cpu"))
WHEELHOUSE = Path(os.environ.get("DFLASH_DOCTOR_WHEELHOUSE", "/tmp/dflash-doctor-wheelhouse"))
OLD_NCCL = "nvidia-nccl-cu12==2.27.5"  # older than torch 2.14's NCCL: no ncclCommResume


def _site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3.*/site-packages"))


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if not (SOURCE / "bin" / "python").exists():
        pytest.skip(f"no cu13 venv at {SOURCE}")
    copy = tmp_path_factory.mktemp("real-wheels") / "cu13"
    subprocess.run(["cp", "-a", str(SOURCE), str(copy)], check=True)  # a real copy: pip rewrites files
    try:
        yield copy
    finally:
        shutil.rmtree(copy, ignore_errors=True)


@pytest.fixture(scope="module")
def old_nccl_wheel(venv: Path) -> Path:
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    found = sorted(WHEELHOUSE.glob("nvidia_nccl_cu12-2.27.5-*.whl"))
    if not found:
        done = subprocess.run(
            [str(venv / "bin/python"), "-m", "pip", "download", "--no-deps", OLD_NCCL, "-d", str(WHEELHOUSE)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot download {OLD_NCCL}: {done.stderr.strip()[-200:]}")
        found = sorted(WHEELHOUSE.glob("nvidia_nccl_cu12-2.27.5-*.whl"))
    return found[0]


@pytest.fixture(autouse=True)
def hermetic_hash_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASH_DOCTOR_CACHE_DIR", str(tmp_path / "hash-cache"))


def pip(venv: Path, *args: str) -> None:
    subprocess.run([str(venv / "bin/python"), "-m", "pip", *args], check=True, capture_output=True)


def restore(venv: Path, dist_info_glob: str) -> None:
    """Put a distribution back exactly as the source venv has it (no download needed)."""
    source_site, site = _site(SOURCE), _site(venv)
    dist_info = next(source_site.glob(dist_info_glob))
    with open(dist_info / "RECORD", newline="") as handle:
        for row in csv.reader(handle):
            if row and row[0]:
                target = site / row[0]
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source_site / row[0], target)


def check(
    python: Path, capsys: pytest.CaptureFixture[str], only: str = "packages,ownership"
) -> tuple[int, dict]:
    args = ["check", "--python", str(python), "--json"] + (["--only", only] if only else [])
    code = cli_run(args)
    report = json.loads(capsys.readouterr().out)
    failing = {f["id"]: f for f in report["findings"] if f["severity"] == "fail"}
    return code, failing


def test_healthy_real_venvs_exit_0(venv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for python in (venv / "bin/python", CPU_VENV / "bin/python"):
        if python.exists():
            code, failing = check(python, capsys, only="")
            assert (code, failing) == (0, {})


@pytest.mark.parametrize(
    ("dist", "dist_info_glob", "pin"),
    [
        ("nvidia-cudnn-cu13", "nvidia_cudnn_cu13-*.dist-info", "nvidia-cudnn-cu13==9.24.0.43"),
        ("nvidia-cusparselt-cu13", "nvidia_cusparselt_cu13-*.dist-info", "nvidia-cusparselt-cu13==0.8.1"),
        ("nvidia-nccl-cu13", "nvidia_nccl_cu13-*.dist-info", "nvidia-nccl-cu13==2.30.7"),
    ],
)
def test_uninstalling_a_load_bearing_package_fails(
    venv: Path, capsys: pytest.CaptureFixture[str], dist: str, dist_info_glob: str, pin: str
) -> None:
    pip(venv, "uninstall", "-y", dist)
    try:
        code, failing = check(venv / "bin/python", capsys)
        assert code == 1
        found = failing["packages.requirements.torch"]
        assert found["evidence"]["installed"] == "missing"
        assert found["remedy"].endswith(f"pip install {pin}")
    finally:
        restore(venv, dist_info_glob)
    assert check(venv / "bin/python", capsys)[0] == 0


def test_nccl_twin_then_its_uninstall(
    venv: Path, old_nccl_wheel: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    python = venv / "bin/python"
    pip(venv, "install", "--no-deps", str(old_nccl_wheel))
    try:
        broken = subprocess.run(
            [str(python), "-c", "import torch"], capture_output=True, text=True, check=False
        )
        assert "undefined symbol: ncclCommResume" in broken.stderr  # the story's failure, for real

        code, failing = check(python, capsys)
        assert code == 1
        twins = failing["ownership.twins"]
        assert twins["evidence"]["owners"] == {"nvidia-nccl-cu12": "2.27.5", "nvidia-nccl-cu13": "2.30.7"}
        assert twins["evidence"]["bytes_on_disk_match"]["nvidia/nccl/lib/libnccl.so.2"] == "nvidia-nccl-cu12"
        assert twins["remedy"] == (
            f"{python} -m pip uninstall -y nvidia-nccl-cu12 && "
            f"{python} -m pip install --force-reinstall --no-deps nvidia-nccl-cu13==2.30.7"
        )
        assert "packages.cuda_family.collision" in failing

        pip(venv, "uninstall", "-y", "nvidia-nccl-cu12")  # the survivor loses the shared files
        code, failing = check(python, capsys)
        assert code == 1
        missing = failing["ownership.missing_files"]
        assert "nvidia/nccl/lib/libnccl.so.2" in missing["evidence"]["files"]
        assert (
            missing["remedy"]
            == f"{python} -m pip install --force-reinstall --no-deps nvidia-nccl-cu13==2.30.7"
        )
        still_fine = subprocess.run([str(python), "-m", "pip", "check"], capture_output=True, text=True)
        assert "No broken requirements found" in still_fine.stdout  # what pip says meanwhile
    finally:
        restore(venv, "nvidia_nccl_cu13-*.dist-info")
    assert check(python, capsys)[0] == 0


def test_nccl_cu13_replaced_by_cu12(
    venv: Path, old_nccl_wheel: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    python = venv / "bin/python"
    pip(venv, "uninstall", "-y", "nvidia-nccl-cu13")
    pip(venv, "install", "--no-deps", str(old_nccl_wheel))
    try:
        code, failing = check(python, capsys)
        assert code == 1
        loaded = failing["packages.cuda_family.loaded"]
        assert "libnccl.so.2" in loaded["evidence"]["libraries"]
        assert loaded["remedy"] == (
            f"{python} -m pip uninstall -y nvidia-nccl-cu12 && {python} -m pip install nvidia-nccl-cu13==2.30.7"
        )
        assert failing["packages.requirements.torch"]["evidence"]["installed"] == "missing"
    finally:
        pip(venv, "uninstall", "-y", "nvidia-nccl-cu12")
        restore(venv, "nvidia_nccl_cu13-*.dist-info")
    assert check(python, capsys)[0] == 0
