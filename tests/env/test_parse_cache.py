"""The persistent parse cache: a warm run reuses parses, and every change after a cached run is still seen.

Each test audits a fake site twice through `Environment.from_interpreter(..., cached=True)` (what the
commands use), changing files in between the way pip (write a new file, rename it over) or a stray
in-place write would, and checks that the second, cached run reports exactly what an uncached one does.
"""

from __future__ import annotations

import json
import marshal
import os
import shutil
import zlib
from pathlib import Path

import pytest

from dflash_doctor.cli import run as cli_run
from dflash_doctor.context import CheckContext
from dflash_doctor.env import parse_cache
from dflash_doctor.env.environment import Environment
from dflash_doctor.env.interpreter import InterpreterInfo
from dflash_doctor.env.parse_cache import HEADER, SCHEMA, ParseCache, cache_file_for
from dflash_doctor.findings import Finding, Severity
from dflash_doctor.libs.loader import resolve_torch_libraries
from dflash_doctor.registry import run_checks
from tests.fakeenv import FakeSite, build_elf, record_hash
from tests.libs_fixtures import ALL_PRELOADS, cuda_libs, install_cuda_torch, system_cache
from tests.packaging_fixtures import cu13_site

__all__ = ["cuda_libs"]


@pytest.fixture(autouse=True)
def hermetic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DFLASH_DOCTOR_CACHE_DIR", str(tmp_path / "hash-cache"))
    # Fixture files are seconds old at most: let the cache keep them (the racy guard has its own test).
    monkeypatch.setattr(parse_cache, "RACY_SECONDS", 0.0)


def interpreter(site: FakeSite) -> InterpreterInfo:
    path = str(site.root)
    return InterpreterInfo(
        executable="/fake/bin/python",
        version="3.11.7",
        prefix="/fake",
        base_prefix="/usr",
        sys_path=[path],
        purelib=path,
        platlib=path,
    )


def audit(site: FakeSite, *only: str, cached: bool = True) -> tuple[list[Finding], ParseCache | None]:
    """One `check` over the site, as `dflash-doctor check` runs it (the host's CUDA libraries hidden)."""
    env = Environment.from_interpreter(interpreter(site), cached=cached)
    ctx = CheckContext(env)
    ctx.shared("libs.report", lambda: resolve_torch_libraries(env, ldcache=system_cache()))
    findings = [f for r in run_checks(ctx, list(only)) for f in r.findings]
    env.save_parse_cache()
    return findings, env.parse_cache


def verdicts(findings: list[Finding]) -> list[tuple[str, Severity, str]]:
    return [(f.id, f.severity, f.summary) for f in findings]


def by_id(findings: list[Finding]) -> dict[str, Finding]:
    return {f.id: f for f in findings}


def replace_file(path: Path, data: bytes) -> None:
    """What pip does: write a new file beside and rename it over (a new inode)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


AREAS = ("torch", "packages", "ownership", "libs")


def test_warm_run_reuses_every_parse_and_reports_the_same(site: FakeSite, cuda_libs) -> None:
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS)
    cold, cache = audit(site, *AREAS)
    assert cache is not None and cache.misses > 0 and cache.hits == 0
    assert cache_file_for([str(site.root)]).is_file()
    warm, cache = audit(site, *AREAS)
    assert cache is not None and cache.loaded_from_disk and cache.misses == 0 and cache.hits > 0
    uncached, _ = audit(site, *AREAS, cached=False)
    assert verdicts(warm) == verdicts(cold) == verdicts(uncached)
    assert by_id(warm)["libs.resolved"].severity is Severity.OK


def test_record_rewritten_by_pip_after_a_cached_run_is_seen(site: FakeSite) -> None:
    cu13_site(site)
    assert by_id(audit(site, "ownership")[0])["ownership.missing_files"].severity is Severity.OK
    record = site.dists["nvidia-nccl-cu13"] / "RECORD"
    rows = record.read_text() + f"nvidia/nccl/lib/libnccl-net.so,{record_hash(b'net')},3\n"
    replace_file(record, rows.encode())
    found, cache = audit(site, "ownership")
    missing = by_id(found)["ownership.missing_files"]
    assert missing.severity is Severity.FAIL
    assert missing.evidence["files"] == ["nvidia/nccl/lib/libnccl-net.so"]
    # only that RECORD was parsed again, and the paths several rows claim found again (from every RECORD)
    assert cache is not None and cache.misses == 2
    assert verdicts(found) == verdicts(audit(site, "ownership", cached=False)[0])


def test_record_edited_in_place_after_a_cached_run_is_seen(site: FakeSite) -> None:
    cu13_site(site)
    audit(site, "ownership")
    record = site.dists["nvidia-cudnn-cu13"] / "RECORD"
    text = record.read_text()
    size = str(len(b"cudnn9"))
    assert f",{size}\n" in text
    record.write_text(text.replace(f",{size}\n", ",123456\n", 1))  # same inode, another size
    clobbered = by_id(audit(site, "ownership")[0])["ownership.clobbered"]
    assert clobbered.severity is Severity.FAIL and "size 6 != RECORD 123456" in str(clobbered.evidence)


def test_library_replaced_after_a_cached_run_is_seen(site: FakeSite, cuda_libs, tmp_path: Path) -> None:
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS)
    assert "libs.missing" not in by_id(audit(site, "libs")[0])
    # an update ships a libtorch_cuda.so that needs a library nothing installs
    newer = build_elf(
        tmp_path / "newer" / "libtorch_cuda.so",
        "libtorch_cuda.so",
        ["libcudart.so.13", "libcublasLt.so.13"],
        rpath="$ORIGIN",
    )
    replace_file(site.root / "torch" / "lib" / "libtorch_cuda.so", newer.read_bytes())
    found, cache = audit(site, "libs")
    missing = by_id(found)["libs.missing"]
    assert missing.severity is Severity.FAIL and missing.evidence["soname"] == "libcublasLt.so.13"
    assert cache is not None and cache.misses >= 1
    assert verdicts(found) == verdicts(audit(site, "libs", cached=False)[0])


def test_library_overwritten_in_place_after_a_cached_run_is_seen(
    site: FakeSite, cuda_libs, tmp_path: Path
) -> None:
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS)
    audit(site, "libs")
    target = site.root / "nvidia" / "cudnn" / "lib" / "libcudnn.so.9"
    stray = build_elf(tmp_path / "stray" / "libcudnn.so.9", "libcudnn.so.9", ["libcudnn_graph.so.9"])
    inode = target.stat().st_ino
    shutil.copyfile(stray, target)  # same inode: only size, mtime and ctime tell
    assert target.stat().st_ino == inode
    missing = by_id(audit(site, "libs")[0])["libs.missing"]
    assert missing.evidence["soname"] == "libcudnn_graph.so.9"


def test_metadata_changed_after_a_cached_run_is_seen(site: FakeSite) -> None:
    cu13_site(site)
    assert by_id(audit(site, "packages")[0])["packages.triton"].severity is Severity.OK
    metadata = site.dists["triton"] / "METADATA"
    replace_file(metadata, metadata.read_bytes().replace(b"Version: 3.8.0", b"Version: 3.7.0"))
    triton = by_id(audit(site, "packages")[0])["packages.triton.version"]
    assert triton.severity is Severity.FAIL


def test_uninstalled_distribution_after_a_cached_run_is_seen(site: FakeSite) -> None:
    cu13_site(site)
    audit(site, "packages")
    site.remove_dist("nvidia-cudnn-cu13")
    failed = by_id(audit(site, "packages")[0])["packages.requirements.torch"]
    assert failed.severity is Severity.FAIL and "nvidia-cudnn-cu13" in failed.summary


def framed(body: object) -> bytes:
    """A cache file with the right header and checksum around `body`."""
    data = marshal.dumps(body)
    return HEADER + zlib.crc32(data).to_bytes(4, "little") + data


CORRUPTIONS = {
    "garbage": lambda good: os.urandom(4096),
    "empty": lambda good: b"",
    "truncated": lambda good: good[: len(good) // 2],
    "flipped byte": lambda good: good[:-10] + bytes([good[-10] ^ 0xFF]) + good[-9:],
    "other schema": lambda good: good.replace(SCHEMA.encode(), b"dflash-doctor/parse-cache/v0", 1),
    "json": lambda good: json.dumps({"schema": SCHEMA}).encode(),
    "wrong shape, right checksum": lambda good: framed([1, 2]),
    "bad entry, right checksum": lambda good: framed(
        {"dists": {"x": 1}, "records": {}, "elf": {}, "derived": {}}
    ),
}


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_corrupt_or_foreign_cache_file_is_ignored_and_rebuilt(site: FakeSite, cuda_libs, how: str) -> None:
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS)
    expected = verdicts(audit(site, *AREAS, cached=False)[0])
    audit(site, *AREAS)
    path = cache_file_for([str(site.root)])
    path.write_bytes(CORRUPTIONS[how](path.read_bytes()))
    found, cache = audit(site, *AREAS)
    assert cache is not None and not cache.loaded_from_disk and cache.hits == 0
    assert verdicts(found) == expected
    _, cache = audit(site, *AREAS)  # rewritten whole by the run that ignored it
    assert cache is not None and cache.loaded_from_disk and cache.misses == 0


def test_valid_empty_cache_file_loads() -> None:
    empty = {"dists": {}, "records": {}, "elf": {}, "derived": {}}
    assert parse_cache._read_tables_from_bytes(framed(empty)) == empty


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file to another user")
def test_cache_file_owned_by_another_user_is_not_trusted(site: FakeSite) -> None:
    cu13_site(site)
    audit(site, "packages")
    os.chown(cache_file_for([str(site.root)]), 4242, -1)
    _, cache = audit(site, "packages")
    assert cache is not None and not cache.loaded_from_disk


def test_files_changed_within_the_racy_window_are_parsed_every_time(
    site: FakeSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parse_cache, "RACY_SECONDS", 3600.0)
    cu13_site(site)
    audit(site, "packages")
    _, cache = audit(site, "packages")
    assert cache is not None  # no file this fresh was stored; the requirement graph's entry, a digest of what
    # the files said, is never racy: it is the one hit
    assert not any(cache.tables[table] for table in ("dists", "records", "elf")) and cache.hits == 1
    metadata = site.dists["triton"] / "METADATA"
    metadata.write_bytes(metadata.read_bytes().replace(b"Version: 3.8.0", b"Version: 3.7.0"))  # same size
    assert by_id(audit(site, "packages")[0])["packages.triton.version"].severity is Severity.FAIL


def test_entries_of_deleted_files_are_dropped_on_save(tmp_path: Path) -> None:
    kept, gone = tmp_path / "kept.txt", tmp_path / "gone.txt"
    kept.write_text("k")
    gone.write_text("g")
    cache = ParseCache(tmp_path / "c.bin")
    for path in (kept, gone):
        cache.get("records", str(path), parse_cache.stamp_of(str(path)), lambda: [])
    cache.save()
    gone.unlink()
    later = ParseCache.load(tmp_path / "c.bin")
    later.get("elf", str(kept), parse_cache.stamp_of(str(kept)), lambda: None)  # something new to save
    later.save()
    assert set(ParseCache.load(tmp_path / "c.bin").tables["records"]) == {str(kept)}


def test_unwritable_cache_folder_is_not_an_error(site: FakeSite, tmp_path: Path, monkeypatch) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(blocker))
    cu13_site(site)
    found, cache = audit(site, "packages")
    assert cache is not None and cache.misses > 0 and by_id(found)["packages.triton"].severity is Severity.OK


def test_cli_check_cold_then_warm_gives_the_same_report(tmp_path: Path, capsys) -> None:
    """The real interpreter running the tests, through the CLI: cold and warm reports agree."""
    args = ["check", "--json", "--no-lock", "--only", "torch,packages,ownership,libs"]
    reports = []
    for _ in range(2):
        code = cli_run(args)
        report = json.loads(capsys.readouterr().out)
        reports.append((code, [(f["id"], f["severity"], f["summary"]) for f in report["findings"]]))
    assert reports[0] == reports[1]
    assert any((tmp_path / "home" / "cache" / "parse-cache").iterdir())


@pytest.fixture
def forkable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forking allowed and worth it for a few files (whatever threads the test runner has started)."""
    from dflash_doctor.env import forked

    monkeypatch.setattr(forked, "usable_cpus", lambda: 4)
    monkeypatch.setattr(forked, "thread_count", lambda: 1)


def test_prefill_parses_what_the_cache_never_saw_in_processes(tmp_path: Path, forkable: None) -> None:
    """A first run: every key parsed in forked slices and stored as `get` stores it, so `get` is then a hit
    with the same value; a key the cache holds (even a stale one) is left to `get`; a gone file is not stored."""
    files = []
    for index in range(13):
        path = tmp_path / f"f{index}.txt"
        path.write_text(f"content {index}\n")
        files.append(str(path))
    cache = ParseCache(tmp_path / "cache.bin")
    cache.tables["records"][files[0]] = ((0, 0, 0, 0, 0), "stale")  # an entry from an earlier install
    gone = str(tmp_path / "gone.txt")
    parsed_here = parse_cache.absorb(
        cache.start_prefill("records", [*files, gone], lambda p: Path(p).read_text().split(), per_process=3)
    )
    assert parsed_here == 13  # 12 new files and the gone one; the stale entry was not touched
    assert cache.tables["records"][files[0]][1] == "stale" and gone not in cache.tables["records"]

    def must_not_parse() -> list[str]:
        raise AssertionError("prefilled: get must not parse again")

    for index, path in enumerate(files[1:], start=1):
        assert cache.get("records", path, parse_cache.stamp_of(path), must_not_parse) == [
            "content",
            str(index),
        ]
    assert cache.get("records", files[0], parse_cache.stamp_of(files[0]), lambda: ["fresh"]) == ["fresh"]


def test_prefill_leaves_too_few_files_and_racy_ones_alone(
    tmp_path: Path, forkable: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = [str(tmp_path / f"f{i}.txt") for i in range(6)]
    for path in files:
        Path(path).write_text("x")
    cache = ParseCache(tmp_path / "cache.bin")
    assert cache.start_prefill("records", files, lambda p: "x", per_process=6) is None  # one process's worth
    assert cache.tables["records"] == {}
    monkeypatch.setattr(parse_cache, "RACY_SECONDS", 3600.0)  # every file just written: parsed, not kept
    assert parse_cache.absorb(cache.start_prefill("records", files, lambda p: "x", per_process=2)) == 6
    assert cache.tables["records"] == {}


def test_a_first_check_in_processes_reports_what_one_process_does(
    site: FakeSite, cuda_libs, tmp_path: Path, forkable: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """METADATA, RECORDs and extensions' ELF headers prefilled in forked processes (thresholds lowered to this
    small site): the findings are those of a run that parses everything in this process."""
    from dflash_doctor.env import distributions, environment

    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS)
    extensions = {
        f"ext/_op{index}.so": build_elf(
            tmp_path / "built" / f"_op{index}.so", None, ["libcudart.so.13"] if index % 2 else ["libc.so.6"]
        )
        for index in range(4)
    }
    site.add_dist("ext", "1.0", extensions)
    one, _ = audit(site, cached=False)
    monkeypatch.setattr(environment, "RECORDS_PER_PROCESS", 2)
    monkeypatch.setattr(environment, "ELF_FILES_PER_PROCESS", 1)
    monkeypatch.setattr(distributions, "DISTS_PER_PROCESS", 2)
    prefilled: list[int] = []
    real = Environment.prefetch_elf
    monkeypatch.setattr(
        Environment, "prefetch_elf", lambda env, paths: prefilled.append(real(env, paths)) or 0
    )
    by_table: dict[str, int] = {}
    real_prefill = ParseCache.start_prefill

    def counted(cache: ParseCache, table: str, *args: object, **kwargs: object) -> object:
        started = real_prefill(cache, table, *args, **kwargs)  # type: ignore[arg-type]
        by_table[table] = len(started.todo) if started is not None else 0
        return started

    monkeypatch.setattr(ParseCache, "start_prefill", counted)
    env = Environment.from_interpreter(interpreter(site), cached=True)
    assert by_table == {"dists": len(env.distributions)}  # every METADATA, read in forked slices
    assert env.prefetch_records() == len(env.distributions)
    env.save_parse_cache()
    first, cache = audit(site)
    assert prefilled == [4]  # the extension headers, read in forked slices
    assert cache is not None and {str(site.root / rel) for rel in extensions} <= set(cache.tables["elf"])
    assert verdicts(first) == verdicts(one)


def test_the_headers_read_beside_the_checks_are_those_the_library_report_reads(
    site: FakeSite, cuda_libs, tmp_path: Path, forkable: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`libs.*`'s starter reads every shared object's ELF header in forked children on a first run; the report
    that takes them is the report of a run that reads each header itself; a warm run starts nothing."""
    from dflash_doctor.env import environment
    from dflash_doctor.libs import loader

    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS)
    for index in range(4):
        needed = ["libcudart.so.13"] if index % 2 else ["libc.so.6"]
        site.add_dist(
            f"ext{index}", "1.0", {f"ext{index}/_op.so": build_elf(tmp_path / f"_op{index}.so", None, needed)}
        )
    real = loader.resolve_torch_libraries
    monkeypatch.setattr(loader, "resolve_torch_libraries", lambda env: real(env, ldcache=system_cache()))
    monkeypatch.setattr(environment, "ELF_FILES_PER_PROCESS", 1)
    want = real(Environment.from_interpreter(interpreter(site)), ldcache=system_cache())

    env = Environment.from_interpreter(interpreter(site), cached=True)
    ctx = CheckContext(env)
    loader.start_reading_headers(ctx)
    headers = ctx._started[loader.HEADERS]
    assert headers.started.children >= 2  # read beside whatever this process does next
    got = loader.library_report(ctx)
    assert loader.HEADERS not in ctx._started  # taken by the report
    assert env.parse_cache is not None and set(loader.shared_objects(env)) <= set(
        env.parse_cache.tables["elf"]
    )
    assert (got.loaded_paths, got.import_error) == (want.loaded_paths, want.import_error)
    assert loader.cuda_extension_libraries(env, env.read_elf) == loader.cuda_extension_libraries(
        Environment.from_interpreter(interpreter(site))
    )
    env.save_parse_cache()
    warm = CheckContext(Environment.from_interpreter(interpreter(site), cached=True))
    loader.start_reading_headers(warm)
    assert loader.HEADERS not in warm._started  # every header in the cache: nothing to start
