"""A warm start skips the warm-up child only when this exact warm-up already ran and its cache files are intact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_doctor.cache import store_restore
from dflash_doctor.cache.fingerprint import BuildFingerprint
from dflash_doctor.cache.warm_record import (
    ALWAYS_ENV,
    KEEP_RECORDS,
    WarmRecords,
    cache_files,
    run_reason,
    skip_reason,
    trainer_source_digest,
    warm_key,
)
from dflash_doctor.launch import compile_cache
from dflash_doctor.launch.compile_cache import graph_fields

BUILD = BuildFingerprint("2.11.0+cu130", "70d99e998b49", "13.0", "3.6.0", "3.12", ("NVIDIA H200",) * 2)
RAW = {
    "drafter": {"layers": 5, "block_size": 16},
    "data": {"seq_len": 3072},
    "optim": {"anchors": 512, "steps": 50, "lr": 6e-4},
    "output": {"dir": "runs/a"},
    "checkpoint": {"every": 50},
    "run": {"log_every": 10, "timeout_s": 600, "device": "cuda"},
    "topology": {"mode": "colocated", "overlap_capture": "off"},
}


def key_of(
    raw: dict = RAW,
    build: BuildFingerprint = BUILD,
    devices: tuple[str, ...] = ("cuda:1",),
    environ: dict[str, str] | None = None,
) -> str:
    environ = {"HOME": "/root", "TORCHINDUCTOR_CACHE_DIR": "/c"} if environ is None else environ
    return warm_key(
        build, graph_fields(raw), "cuda", devices, "/usr/bin/python3", environ, trainer_digest="t"
    )


def edited(section: str, field: str, value: object) -> dict:
    return {**RAW, section: {**RAW[section], field: value}}


def test_the_key_ignores_bookkeeping_and_follows_everything_a_graph_depends_on() -> None:
    base = key_of()
    for section, field, value in [
        ("optim", "steps", 5000), ("output", "dir", "runs/b"), ("checkpoint", "every", 0), ("run", "log_every", 1),
        ("topology", "overlap_capture", "optimizer"),  # which stream captures: the same graphs
        ("data", "workers", 4),  # which process makes a sequence: the same sequences
        ("optim", "lr", 1e-4),  # acts outside the compiled functions
    ]:  # fmt: skip
        assert key_of(edited(section, field, value)) == base, (section, field)
    for section, field, value in [
        ("data", "seq_len", 40000), ("optim", "anchors", 1024), ("drafter", "block_size", 32),
        ("run", "device", "cpu"), ("topology", "mode", "split"),
    ]:  # fmt: skip
        assert key_of(edited(section, field, value)) != base, (section, field)
    assert key_of(devices=("cuda:0",)) != base
    assert key_of(build=BuildFingerprint("2.12.0", None, "13.0", "3.6.0", "3.12", ("NVIDIA H200",))) != base
    assert (
        warm_key(BUILD, graph_fields(RAW), "cuda", ("cuda:1",), "/usr/bin/python3", trainer_digest="edited")
        != base
    )
    assert (
        key_of(environ={"HOME": "/elsewhere", "TORCHINDUCTOR_CACHE_DIR": "/c"}) == base
    )  # unrelated variable
    # Where the cache lives is not what it holds (the recorded files are checked where they are now).
    assert key_of(environ={"TORCHINDUCTOR_CACHE_DIR": "/other/home"}) == base
    assert key_of(environ={"TORCHINDUCTOR_CACHE_DIR": "/c", "TORCHINDUCTOR_MAX_AUTOTUNE": "1"}) != base
    assert key_of(environ={"TORCHINDUCTOR_CACHE_DIR": "/c", "CUDA_VISIBLE_DEVICES": "3"}) != base
    assert "output" not in graph_fields(RAW) and graph_fields(RAW)["optim"] == {"anchors": 512}


def test_the_trainer_digest_changes_when_a_trainer_file_changes(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text("x = 1\n")
    before = trainer_source_digest(tmp_path)
    (tmp_path / "model.py").write_text("x = 2\n")
    assert trainer_source_digest(tmp_path) != before


def cache_with_files(root: Path) -> dict[str, Path]:
    (root / "fxgraph" / "ab").mkdir(parents=True)
    (root / "fxgraph" / "ab" / "fentrykey00000000000000000000").write_bytes(b"graph")
    (root / "ke").mkdir(parents=True)
    (root / "ke" / "ckernelkey0000000000000000000.so").write_bytes(b"k" * 100)
    (root / "locks").mkdir()
    (root / "locks" / "xlockkey000000000000000000.lock").write_bytes(b"")  # transient: never recorded
    return {"inductor": root}


def test_skip_only_while_every_recorded_file_is_intact(tmp_path: Path) -> None:
    roots = cache_with_files(tmp_path / "inductor")
    records = WarmRecords(tmp_path / "warm-records.json")
    assert skip_reason(records, "k", roots, {}) is None  # nothing recorded yet
    files = cache_files(roots)
    assert set(files) == {
        "inductor/fxgraph/ab/fentrykey00000000000000000000",
        "inductor/ke/ckernelkey0000000000000000000.so",
    }
    records.save("k", ("cuda:1",), files)

    reason = skip_reason(records, "k", roots, {})
    assert reason is not None and "2 cache files are intact" in reason
    assert skip_reason(records, "other key", roots, {}) is None
    assert skip_reason(records, "k", roots, {ALWAYS_ENV: "1"}) is None
    (tmp_path / "inductor" / "later-file").write_bytes(b"new")  # the cache grew (the target's kernels): fine
    assert skip_reason(records, "k", roots, {}) is not None

    (tmp_path / "inductor" / "ke" / "ckernelkey0000000000000000000.so").write_bytes(b"k" * 99)  # rewritten
    assert skip_reason(records, "k", roots, {}) is None
    (tmp_path / "inductor" / "ke" / "ckernelkey0000000000000000000.so").write_bytes(b"k" * 100)
    assert skip_reason(records, "k", roots, {}) is not None
    (tmp_path / "inductor" / "fxgraph" / "ab" / "fentrykey00000000000000000000").unlink()  # deleted
    assert skip_reason(records, "k", roots, {}) is None


def test_state_that_torch_rewrites_in_place_counts_by_presence_artifacts_by_size(tmp_path: Path) -> None:
    """The second launch of a config ran the child again (issue 17): the run's workers had rewritten
    Inductor's benchmark cache and autotune picks, files the warm-up also left, with other sizes."""
    roots = cache_with_files(tmp_path / "inductor")
    root = roots["inductor"]
    (root / "cache").mkdir()
    (root / "cache" / "5f3c").write_text('{"cache": {}}')  # CacheBase.get_local_cache_path()
    (root / "zz").mkdir()
    (root / "zz" / "czzkernel.py").write_text("kernel source")
    (root / "zz" / "czzkernel.best_config").write_text('{"XBLOCK": 64, "time_taken_ms": 9}')
    records = WarmRecords(tmp_path / "warm-records.json")
    records.save("k", ("cuda:1",), cache_files(roots))

    (root / "cache" / "5f3c").write_text('{"cache": {"pad_mm": {"a": true}, "more": 1}}')  # a worker learnt
    (root / "zz" / "czzkernel.best_config").write_text('{"XBLOCK": 64, "time_taken_ms": 1234}')  # re-tuned
    assert skip_reason(records, "k", roots, {}) is not None
    assert records.covered_by(cache_files(roots))  # a snapshot of this cache still carries the record
    (root / "zz" / "czzkernel.py").write_text("another kernel source")  # an artifact changed: run the child
    assert skip_reason(records, "k", roots, {}) is None
    assert (
        run_reason(records, "k", roots, {}) == "changed since the recorded warm-up: inductor/zz/czzkernel.py"
    )
    (root / "zz" / "czzkernel.py").write_text("kernel source")
    (root / "zz" / "czzkernel.best_config").unlink()  # an autotune pick gone: the workers would tune again
    assert skip_reason(records, "k", roots, {}) is None


@pytest.mark.parametrize("content", ["", "{", "[]", json.dumps({"schema": "other", "records": []}),
                                     json.dumps({"schema": "dflash-doctor/warm-records/v1", "records": "x"})])  # fmt: skip
def test_an_unreadable_or_foreign_records_file_means_run_the_child(tmp_path: Path, content: str) -> None:
    roots = cache_with_files(tmp_path / "inductor")
    path = tmp_path / "warm-records.json"
    path.write_text(content)
    records = WarmRecords(path)
    assert skip_reason(records, "k", roots, {}) is None
    records.save("k", (), cache_files(roots))  # and it is rewritten whole
    assert skip_reason(records, "k", roots, {}) is not None


def test_concurrent_writers_lose_no_record(tmp_path: Path) -> None:
    """Launches from one home write at the same time: each read-merge-write happens under the lock."""
    import threading

    records = WarmRecords(tmp_path / "warm-records.json")
    keys = [f"{i:064x}" for i in range(KEEP_RECORDS)]
    start = threading.Barrier(len(keys))

    def write(key: str) -> None:
        start.wait()
        WarmRecords(records.path).adopt([record(key=key)], "snap")

    threads = [threading.Thread(target=write, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r["key"] for r in json.loads(records.path.read_text())["records"]) == keys


def test_records_are_bounded_and_the_newest_wins(tmp_path: Path) -> None:
    roots = cache_with_files(tmp_path / "inductor")
    records = WarmRecords(tmp_path / "warm-records.json")
    for i in range(30):
        records.save(f"k{i}", (), cache_files(roots))
    kept = json.loads((tmp_path / "warm-records.json").read_text())["records"]
    assert len(kept) == 20 and kept[-1]["key"] == "k29" and records.find("k0") is None


def test_the_launcher_runs_the_child_once_then_skips_it_until_a_file_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer.runspec.config_file import resolve_config_path

    home = tmp_path / "home"
    inductor = home / "cache" / "inductor"
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(home))
    monkeypatch.setattr(compile_cache, "current_fingerprint", lambda env: BUILD)
    children: list[list[str]] = []

    def fake_child(command: list[str], environ: dict[str, str]) -> dict:
        children.append(command)
        cache_with_files(inductor) if not any(inductor.iterdir()) else None  # made empty by the claim (TR1)
        return {"first_call_seconds": 1.0, "counters": {}}

    monkeypatch.setattr(compile_cache, "run_warm_child", fake_child)

    class Interpreter:
        executable = "/usr/bin/python3"

    class Env:
        interpreter = Interpreter()

    environ = {"TORCHINDUCTOR_CACHE_DIR": str(inductor)}
    config = resolve_config_path("tiny-cpu")

    def prepare(*overrides: str) -> str:
        return compile_cache.prepare_compile_cache(Env(), environ, config, "cpu", (), overrides).detail  # type: ignore[arg-type]

    first = prepare()
    assert "warm-up on cpu" in first and "(ran: no warm-up of this build" in first and len(children) == 1
    assert "warm-up skipped" in prepare() and len(children) == 1
    assert "warm-up skipped" in prepare("optim.steps=7") and len(children) == 1  # bookkeeping only
    assert "warm-up on cpu" in prepare("data.seq_len=64") and len(children) == 2  # other shapes
    (inductor / "fxgraph" / "ab" / "fentrykey00000000000000000000").unlink()
    assert "warm-up on cpu" in prepare() and len(children) == 3


def record(key: str = "a" * 64, files: object = None) -> dict:
    return {
        "key": key,
        "when": 1.0,
        "devices": ["cuda:1"],
        "files": {"inductor/x": 5} if files is None else files,
    }


def test_a_snapshot_carries_only_the_records_whose_files_it_holds(tmp_path: Path) -> None:
    from dflash_doctor.cache.manifest import CacheManifest
    from dflash_doctor.cache.snapshot import take_snapshot

    roots = cache_with_files(tmp_path / "inductor")
    records = WarmRecords(tmp_path / "warm-records.json")
    records.save("k" * 64, ("cuda:1",), cache_files(roots))
    records.save("g" * 64, ("cuda:1",), {"inductor/gone": 3})  # a file the cache no longer has
    records.save(
        "s" * 64, ("cuda:1",), {"inductor/fxgraph/ab/fentrykey00000000000000000000": 4}
    )  # the file changed size since
    taken = take_snapshot(roots, BUILD, "s", tmp_path / "s.tar.zst", records=records)
    assert [r["key"] for r in taken.manifest.warm_records] == ["k" * 64]
    reread = CacheManifest.from_bytes(taken.manifest.to_bytes())
    assert reread.warm_records == taken.manifest.warm_records
    assert take_snapshot(roots, BUILD, "t", tmp_path / "t.tar.zst").manifest.warm_records == []


@pytest.mark.parametrize("carried", [None, "x", 3, {"key": "k"}, ["x", 3]])
def test_a_manifest_without_or_with_garbage_records_reads_as_carrying_none(carried: object) -> None:
    from dflash_doctor.cache.manifest import CacheManifest

    data = json.loads(CacheManifest("n", 1.0, BUILD, {}).to_bytes())
    data.pop("warm_records")
    if carried is not None:
        data["warm_records"] = carried
    assert CacheManifest.from_bytes(json.dumps(data).encode()).warm_records == []


def test_adopt_keeps_well_formed_records_and_names_the_snapshot(tmp_path: Path) -> None:
    roots = {"inductor": tmp_path / "inductor"}
    (tmp_path / "inductor").mkdir()
    (tmp_path / "inductor" / "x").write_bytes(b"12345")
    records = WarmRecords(tmp_path / "warm-records.json")
    bad = [
        "x", record(key="short"), record(files={}), record(files={"inductor/x": -1}), record(files=["inductor/x"]),
        {**record(), "devices": "cuda:1"}, {**record(), "when": "today"},
    ]  # fmt: skip
    assert records.adopt(bad, "snap") == 0 and not records.path.exists()
    assert records.adopt([*bad, record()], "snap") == 1
    reason = skip_reason(records, "a" * 64, roots, {})
    assert reason is not None and "carried by snapshot snap" in reason
    records.save("a" * 64, ("cuda:1",), {"inductor/x": 5})  # the warm-up ran here after all: a local record
    reason = skip_reason(records, "a" * 64, roots, {})
    assert reason is not None and "carried" not in reason


def test_a_restored_snapshot_lets_a_fresh_home_skip_the_warm_up_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Machine A warms and snapshots; machine B (an empty home, the snapshot copied in) restores it and
    skips the child; B's child runs when the key differs, as it would without the record."""
    from trainer.runspec.config_file import resolve_config_path

    children: list[list[str]] = []

    def fake_child(command: list[str], environ: dict[str, str]) -> dict:
        children.append(command)
        inductor = Path(environ["TORCHINDUCTOR_CACHE_DIR"])
        cache_with_files(inductor) if not any(inductor.iterdir()) else None  # made empty by the claim (TR1)
        return {"first_call_seconds": 1.0, "counters": {}}

    class Interpreter:
        executable = "/usr/bin/python3"

    class Env:
        interpreter = Interpreter()

    monkeypatch.setattr(compile_cache, "run_warm_child", fake_child)
    monkeypatch.setattr(compile_cache, "current_fingerprint", lambda env: BUILD)
    config = resolve_config_path("tiny-cpu")

    def on_machine(home: Path, *overrides: str) -> tuple[str, dict[str, str]]:
        monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(home))
        environ = {"TORCHINDUCTOR_CACHE_DIR": str(home / "cache" / "inductor")}
        detail = compile_cache.prepare_compile_cache(Env(), environ, config, "cpu", (), overrides).detail  # type: ignore[arg-type]
        return detail, environ

    detail, environ = on_machine(tmp_path / "a")
    assert "warm-up on cpu" in detail and len(children) == 1
    assert compile_cache.snapshot_after_success(Env(), environ).startswith("snapshot train-")  # type: ignore[arg-type]
    (snapshot,) = (tmp_path / "a" / "cache" / "snapshots").glob("*.tar.zst")
    (tmp_path / "b" / "cache" / "snapshots").mkdir(parents=True)
    snapshot.rename(tmp_path / "b" / "cache" / "snapshots" / snapshot.name)

    detail, _ = on_machine(tmp_path / "b")
    assert "restored snapshot" in detail and "carried by snapshot" in detail and len(children) == 1
    assert "warm-up on cpu" in on_machine(tmp_path / "b", "data.seq_len=64")[0] and len(children) == 2


def test_a_snapshot_that_cannot_be_restored_never_stops_the_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37 F2: `train`'s automatic restore fails (a cache it refuses, a full disk): the launch warns and
    compiles cold instead of stopping."""
    from dflash_base.errors import DoctorError
    from trainer.runspec.config_file import resolve_config_path

    children: list[list[str]] = []

    def fake_child(command: list[str], environ: dict[str, str]) -> dict:
        children.append(command)
        cache_with_files(Path(environ["TORCHINDUCTOR_CACHE_DIR"]))
        return {"first_call_seconds": 1.0, "counters": {}}

    class Interpreter:
        executable = "/usr/bin/python3"

    class Env:
        interpreter = Interpreter()

    monkeypatch.setattr(compile_cache, "run_warm_child", fake_child)
    monkeypatch.setattr(compile_cache, "current_fingerprint", lambda env: BUILD)
    config = resolve_config_path("tiny-cpu")
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "a"))
    environ = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "a" / "cache" / "inductor")}
    compile_cache.prepare_compile_cache(Env(), environ, config, "cpu", (), ())  # type: ignore[arg-type]
    compile_cache.snapshot_after_success(Env(), environ)  # type: ignore[arg-type]
    (snapshot,) = (tmp_path / "a" / "cache" / "snapshots").glob("*.tar.zst")
    (tmp_path / "b" / "cache" / "snapshots").mkdir(parents=True)
    snapshot.rename(tmp_path / "b" / "cache" / "snapshots" / snapshot.name)

    def refuse(*args: object, **kwargs: object) -> None:
        raise DoctorError("the cache folder is not a compile cache")

    monkeypatch.setattr(store_restore, "restore_snapshot", refuse)
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "b"))
    environ = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "b" / "cache" / "inductor")}
    prep = compile_cache.prepare_compile_cache(Env(), environ, config, "cpu", (), ())  # type: ignore[arg-type]
    assert "not restored (the cache folder is not a compile cache); compiling cold" in prep.detail
    assert "warm-up on cpu" in prep.detail and len(children) == 2
