"""Build the real environments issue 19's remedy tests run on; idempotent and cheap.

Each environment is a venv under ROOT (default `.tmp/real-envs`, or `$DFLASH_DOCTOR_REAL_ENVS`):

  cu128                 torch 2.9.1 from the index (PyPI's default Linux build, +cu128, 15 nvidia-*-cu12)
  story                 cu128 + the CUDA 13 packages at torch 2.11's pins (what SGLang/flashinfer bring),
                        installed --no-deps beside it: their files overwrite the cu12 ones at the same paths
  story-minus-<name>    story with that cu13 package uninstalled (the story's ImportErrors)
  cu13                  torch 2.14.1 (+cu130) from the local index
  cu13-nccl-cu12        cu13 + nvidia-nccl-cu12 2.27.5 installed over its NCCL (`undefined symbol`)
  cu13-minus-<name>     cu13 with that package uninstalled

Only the two base venvs are installed; every other one is a hard-linked copy (`cp -al`, seconds, no disk)
changed with pip, which unlinks a file before writing it (so the copy never writes through a link into
its source). An environment whose folder holds `.built` is left alone; `--rebuild NAME` removes it first.

    .venv/bin/python scripts/build_real_envs.py [--root DIR] [--only NAME ...] [--rebuild NAME ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(
    os.environ.get("DFLASH_DOCTOR_REAL_ENVS", Path(__file__).resolve().parent.parent / ".tmp" / "real-envs")
)
DONE = ".built"

# torch 2.11.0+cu130's pins (the H200 image, /work/shared/reference/h200-torch211-cu130-env.json)
TORCH_211_CU13 = {
    "nvidia-cudnn-cu13": "9.19.0.56",
    "nvidia-nccl-cu13": "2.28.9",
    "nvidia-cusparselt-cu13": "0.8.0",
    "nvidia-nvshmem-cu13": "3.4.5",
}
STORY_UNINSTALLS = ("nvidia-cudnn-cu13", "nvidia-nccl-cu13", "nvidia-cusparselt-cu13")
CU13_UNINSTALLS = ("nvidia-cudnn-cu13", "nvidia-nccl-cu13", "nvidia-cusparselt-cu13")
OLD_NCCL = "nvidia-nccl-cu12==2.27.5"


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def pip(venv: Path, *args: str) -> None:
    subprocess.run([str(python_of(venv)), "-m", "pip", "-q", *args], check=True)


def fresh_venv(torch_spec: str) -> Callable[[Path], None]:
    def build(venv: Path) -> None:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip(venv, "install", torch_spec)

    return build


def copy_of(base: str, change: Callable[[Path], None]) -> Callable[[Path], None]:
    def build(venv: Path) -> None:
        source = ensure(base)
        subprocess.run(["cp", "-al", str(source), str(venv)], check=True)
        (venv / DONE).unlink(missing_ok=True)
        change(venv)

    return build


def uninstall(name: str) -> Callable[[Path], None]:
    return lambda venv: pip(venv, "uninstall", "-y", name)


def install_no_deps(*specs: str) -> Callable[[Path], None]:
    return lambda venv: pip(venv, "install", "--no-deps", *specs)


RECIPES: dict[str, Callable[[Path], None]] = {
    "cu128": fresh_venv("torch==2.9.1"),
    "story": copy_of("cu128", install_no_deps(*(f"{n}=={v}" for n, v in TORCH_211_CU13.items()))),
    **{f"story-minus-{n}": copy_of("story", uninstall(n)) for n in STORY_UNINSTALLS},
    "cu13": fresh_venv("torch==2.14.1"),
    "cu13-nccl-cu12": copy_of("cu13", install_no_deps(OLD_NCCL)),
    **{f"cu13-minus-{n}": copy_of("cu13", uninstall(n)) for n in CU13_UNINSTALLS},
}


def ensure(name: str) -> Path:
    """The environment `name`, built if it is not there yet (a half-built one is removed and rebuilt)."""
    venv = ROOT / name
    if (venv / DONE).is_file():
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    print(f"building {name} ...", flush=True)
    RECIPES[name](venv)
    (venv / DONE).write_text("ok\n")
    return venv


def main() -> None:
    global ROOT
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--only", nargs="*", choices=sorted(RECIPES), default=None)
    parser.add_argument("--rebuild", nargs="*", choices=sorted(RECIPES), default=[])
    args = parser.parse_args()
    ROOT = args.root
    for name in args.rebuild:
        shutil.rmtree(ROOT / name, ignore_errors=True)
    for name in args.only or list(RECIPES):
        print(f"{name}: {ensure(name)}")


if __name__ == "__main__":
    main()
