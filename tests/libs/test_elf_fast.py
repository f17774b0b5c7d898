"""The struct reader of the dynamic section (issue 40 §2.3) equals pyelftools on every file it takes, and a
check's findings are the same read cold, uncached, or from the parse cache."""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path

import pytest

from dflash_doctor.context import CheckContext, CheckOptions
from dflash_doctor.env import elf, parse_cache
from dflash_doctor.env.environment import Environment
from dflash_doctor.env.parse_cache import ParseCache
from dflash_doctor.registry import run_checks
from tests.conftest import env_for
from tests.fakeenv import FakeSite
from tests.libs_fixtures import cuda_libs, install_cuda_torch  # noqa: F401  (fixture)


def torch_libraries() -> list[str]:
    """The real ELF files of this venv's torch: the tree `check` parses (hundreds on a CUDA build)."""
    import torch

    root = os.path.dirname(torch.__file__)
    return sorted(glob.glob(f"{root}/**/*.so*", recursive=True))


def test_the_fast_reader_equals_pyelftools_and_takes_every_ordinary_library(
    cuda_libs: dict[str, Path],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    files = [str(p) for p in cuda_libs.values()] + torch_libraries()
    files += [p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/bin/ls") if os.path.exists(p)]
    assert len(files) > len(cuda_libs)
    expected = {path: elf.read_elf_facts_pyelftools(path) for path in files}
    assert any(facts and facts[2] for facts in expected.values())  # some RPATH among them
    assert any(facts and facts[3] for facts in expected.values())  # some RUNPATH

    def no_fallback(path: str) -> None:
        raise AssertionError(f"{path} fell back to pyelftools")

    monkeypatch.setattr(elf, "read_elf_facts_pyelftools", no_fallback)
    assert {path: elf.read_elf_facts(path) for path in files} == expected


def test_broken_and_foreign_files_read_as_pyelftools_reads_them(
    cuda_libs: dict[str, Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    source = cuda_libs["cuda"].read_bytes()
    cases = {
        "text": b"not an elf file at all",
        "magic-only": b"\x7fELF",
        "truncated": source[:200],
        "bad-class": source[:4] + b"\x07" + source[5:],
        "no-strings": source[: len(source) // 3],
    }
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        assert elf.read_elf_facts(str(path)) == elf.read_elf_facts_pyelftools(str(path)), name
    assert elf.read_elf_facts(str(tmp_path / "missing")) is None


def libs_findings(env: Environment) -> list[dict]:
    return [
        f.to_json()
        for run in run_checks(CheckContext(env, CheckOptions()), only=["libs"])
        for f in run.findings
    ]


def test_libs_findings_are_the_same_uncached_cold_and_warm(
    site: FakeSite,
    cuda_libs: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install_cuda_torch(site, cuda_libs)
    shutil.copy(cuda_libs["cuda"], site.root / "torch/lib/libextra_ops.so")  # one more for the extension scan
    monkeypatch.setattr(parse_cache, "RACY_SECONDS", 0.0)  # the fixtures were written a moment ago
    interpreter = env_for(site).interpreter
    uncached = libs_findings(env_for(site))
    cache_file = tmp_path / "parse-cache.bin"
    cold = ParseCache.load(cache_file)
    assert libs_findings(Environment.from_interpreter(interpreter, parse_cache=cold)) == uncached
    cold.save()
    warm = ParseCache.load(cache_file)
    assert libs_findings(Environment.from_interpreter(interpreter, parse_cache=warm)) == uncached
    assert warm.hits > 0 and warm.tables["elf"]  # the warm run read the ELF facts from the cache
    assert uncached and any(f["id"] == "libs.resolved" for f in uncached)
