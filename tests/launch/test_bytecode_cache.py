"""The launch's own bytecode folder: given when `startup.bytecode` warns, never over the user's choice."""

from __future__ import annotations

from pathlib import Path

from dflash_doctor.findings import ok, warn
from dflash_doctor.launch.bytecode_cache import OPT_OUT, with_bytecode_cache

UNCACHED = warn("startup.bytecode", "no cached bytecode for torch (679 of 679 sampled modules)")
CACHED = ok("startup.bytecode", "bytecode cached for torch, triton, sympy")


def test_an_interpreter_that_caches_no_bytecode_gets_a_folder_it_may_write(tmp_path: Path) -> None:
    environ, note = with_bytecode_cache(
        {"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/bin"}, [UNCACHED], tmp_path / "pyc"
    )
    assert environ["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pyc")
    assert "PYTHONDONTWRITEBYTECODE" not in environ and environ["PATH"] == "/bin"
    assert (tmp_path / "pyc").is_dir()
    assert note is not None and str(tmp_path / "pyc") in note and OPT_OUT in note


def test_cached_bytecode_leaves_the_environment_alone(tmp_path: Path) -> None:
    base = {"PYTHONDONTWRITEBYTECODE": "1"}
    environ, note = with_bytecode_cache(base, [CACHED], tmp_path / "pyc")
    assert environ == base and note is None
    assert not (tmp_path / "pyc").exists()


def test_the_users_own_prefix_and_the_opt_out_win(tmp_path: Path) -> None:
    mine = {"PYTHONPYCACHEPREFIX": "/mine", "PYTHONDONTWRITEBYTECODE": "1"}
    assert with_bytecode_cache(mine, [UNCACHED], tmp_path / "pyc") == (mine, None)
    off = {OPT_OUT: "0", "PYTHONDONTWRITEBYTECODE": "1"}
    assert with_bytecode_cache(off, [UNCACHED], tmp_path / "pyc") == (off, None)


def test_a_process_started_with_it_writes_and_the_next_reads(tmp_path: Path) -> None:
    """What the folder buys: the first process writes the module's bytecode there, though
    PYTHONDONTWRITEBYTECODE was set for the launch; none lands beside the source."""
    import subprocess
    import sys

    source = tmp_path / "src"
    source.mkdir()
    (source / "heavy_module.py").write_text("VALUE = 42\n")
    environ, _ = with_bytecode_cache({"PYTHONDONTWRITEBYTECODE": "1"}, [UNCACHED], tmp_path / "pyc")
    command = [sys.executable, "-c", "import heavy_module; print(heavy_module.VALUE)"]
    for _ in range(2):
        done = subprocess.run(
            command, env={**environ, "PYTHONPATH": str(source)}, capture_output=True, text=True, check=True
        )
        assert done.stdout.strip() == "42"
    written = list((tmp_path / "pyc").rglob("heavy_module*.pyc"))
    assert len(written) == 1
    assert not (source / "__pycache__").exists()
