"""deep.*: the probe's pure parts, the verdicts on fake reports, and real children of the CPU/CUDA venvs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from dflash_doctor.cli import run
from dflash_doctor.context import CheckContext, CheckOptions
from dflash_doctor.deep import probe_child
from dflash_doctor.deep.compare import (
    duplicate_families,
    explain_import_error,
    static_disagreements,
    version_verdicts,
)
from dflash_doctor.deep.run import ProbeReport, parse_probe_output, run_probe
from dflash_doctor.env.gpus import GpuInventory
from dflash_doctor.findings import Finding, Severity
from dflash_doctor.lock.lockfile import build_lock, write_lock
from dflash_doctor.registry import run_checks
from tests.conftest import env_for
from tests.fakeenv import FakeSite
from tests.libs_fixtures import cuda_libs, install_cuda_torch

__all__ = ["cuda_libs"]

# Any interpreter with a CPU torch: the test run's own (the project venv has torch 2.13 CPU).
CPU_PYTHON = os.environ.get("DFLASH_DOCTOR_CPU_PYTHON", sys.executable)
CU13_PYTHON = "/work/venvs/cu13/bin/python"

MAPS = """\
7f00-7f10 r--p 00000000 08:01 1234  /v/site-packages/torch/lib/libtorch_cpu.so
7f10-7f20 r-xp 00010000 08:01 1234  /v/site-packages/torch/lib/libtorch_cpu.so
7f20-7f30 rw-p 00000000 00:00 0
7f30-7f40 r--p 00000000 08:01 99    /usr/lib/x86_64-linux-gnu/libnccl.so.2.28.3 (deleted)
7f40-7f50 r--p 00000000 08:01 77    /v/site-packages/nvidia/nccl/lib/libnccl.so.2
7f50-7f60 r--p 00000000 00:00 0     [vdso]
7f60-7f70 r--p 00000000 08:01 5     /usr/lib/locale/C.utf8/LC_CTYPE
7f70-7f80 r--p 00000000 08:01 6     /v/site-packages/torch/_C.cpython-311-x86_64-linux-gnu.so
"""


# --- the child's pure parts -----------------------------------------------------------------------


def test_parse_maps_keeps_shared_objects_once_in_order() -> None:
    assert probe_child.parse_maps(MAPS) == [
        "/v/site-packages/torch/lib/libtorch_cpu.so",
        "/usr/lib/x86_64-linux-gnu/libnccl.so.2.28.3",
        "/v/site-packages/nvidia/nccl/lib/libnccl.so.2",
        "/v/site-packages/torch/_C.cpython-311-x86_64-linux-gnu.so",
    ]


def test_version_integers_decode_like_the_libraries_encode() -> None:
    assert probe_child.version_int_to_tuple(91900, "cudnn") == [9, 19, 0]
    assert probe_child.version_int_to_tuple(22809, "nccl") == [2, 28, 9]
    assert probe_child.version_int_to_tuple(2708, "nccl") == [2, 7, 8]  # NCCL < 2.9 encoding
    assert probe_child.version_int_to_tuple(13000, "cudart") == [13, 0]


def dflash_mask_reference(
    anchors: list[int], block: int, context: int, q_len: int, kv_len: int
) -> list[list[bool]]:
    """The DFlash mask as a dense list, element by element: the oracle for the probe's tensor version."""
    rows = []
    for q in range(q_len):
        b = q // block
        anchor = anchors[b]
        row = []
        for kv in range(kv_len):
            if kv < context:
                row.append(kv < anchor)
            else:
                row.append((kv - context) // block == b)
        rows.append(row)
    return rows


def test_dflash_mask_sees_context_strictly_before_anchor_and_own_block() -> None:
    torch = pytest.importorskip("torch")
    mask = probe_child.dense_dflash_mask(torch, torch.tensor([3, 5]), 2, 6, 4, 10).tolist()
    assert mask == dflash_mask_reference(anchors=[3, 5], block=2, context=6, q_len=4, kv_len=10)
    # query 0 (block 0, anchor 3): context 0..2 (not 3), own block kv 6,7, not block 1 (kv 8,9)
    assert mask[0] == [True, True, True, False, False, False, True, True, False, False]
    assert mask[3] == [True, True, True, True, True, False, False, False, True, True]


def test_the_child_imports_nothing_but_the_stdlib() -> None:
    source = Path(probe_child.__file__).read_text()
    top_level = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert all(
        line.split()[1].split(".")[0] in sys.stdlib_module_names | {"__future__"} for line in top_level
    )


def test_probe_output_without_json_is_a_crash() -> None:
    report = parse_probe_output("", "Segmentation fault\n", -11)
    assert not report.ran and "signal 11" in (report.error or "")
    good = parse_probe_output('noise\n{"schema": "x", "seconds": 1.5}\n', "", 0)
    assert good.ran and good.seconds == 1.5


def test_a_missing_interpreter_is_reported_not_raised(tmp_path: Path) -> None:
    report = run_probe(str(tmp_path / "nope" / "python"), timeout=5)
    assert not report.ran and "cannot run" in (report.error or "")


# --- comparisons ----------------------------------------------------------------------------------


def test_cudnn_older_minor_than_compiled_fails_with_torchs_own_words() -> None:
    torch = {"cudnn_compiled": [9, 19, 0], "nccl_compiled": [2, 28, 9], "cuda": "13.0"}
    versions = {
        "cudnn": {"parsed": [9, 14, 0], "path": "/usr/lib/libcudnn.so.9"},
        "nccl": {"parsed": [2, 28, 3]},
        "cudart": {"parsed": [13, 0]},
    }
    got = {v.library: v for v in version_verdicts(torch, versions)}
    assert got["cudnn"].severity is Severity.FAIL
    assert "compiled against (9, 19, 0) but found runtime version (9, 14, 0)" in got["cudnn"].note
    assert got["nccl"].severity is Severity.WARN  # the REFERENCE story: 2.28.3 loaded, torch says 2.28.9
    assert got["cudart"].severity is Severity.OK


def test_duplicates_by_library_family() -> None:
    loaded = probe_child.parse_maps(MAPS)
    assert duplicate_families(loaded) == {
        "libnccl": [
            "/usr/lib/x86_64-linux-gnu/libnccl.so.2.28.3",
            "/v/site-packages/nvidia/nccl/lib/libnccl.so.2",
        ]
    }
    assert duplicate_families(["/a/libcudnn.so.9", "/a/libcudnn_graph.so.9"]) == {}


def test_static_disagreement_only_when_the_name_came_from_elsewhere() -> None:
    predicted = {
        "libnccl.so.2": "/v/nvidia/nccl/lib/libnccl.so.2",
        "libcudnn.so.9": "/v/nvidia/cudnn/lib/libcudnn.so.9",
    }
    same = static_disagreements(predicted, ["/v/nvidia/nccl/lib/libnccl.so.2"], realpath=lambda p: p)
    assert same == []  # cudnn not mapped yet (lazy): not a disagreement
    other = static_disagreements(predicted, ["/opt/old/libnccl.so.2"], realpath=lambda p: p)
    assert [(d.soname, d.loaded) for d in other] == [("libnccl.so.2", "/opt/old/libnccl.so.2")]


def test_missing_soname_listed_but_deleted_names_the_owner(site: FakeSite) -> None:
    site.add_dist("nvidia-cudnn-cu13", "9.24.0.43", {"nvidia/cudnn/lib/libcudnn.so.9": b"\x7fELF"})
    (site.root / "nvidia/cudnn/lib/libcudnn.so.9").unlink()  # a twin's uninstall deleted it
    env = env_for(site)
    why = explain_import_error(
        "libcudnn.so.9: cannot open shared object file: No such file or directory",
        env.owners,
        "/v/bin/python",
    )
    assert "nvidia-cudnn-cu13" in why.summary
    assert why.remedy == "/v/bin/python -m pip install --force-reinstall --no-deps nvidia-cudnn-cu13"


def test_undefined_nccl_symbol_with_twins_names_both(site: FakeSite) -> None:
    site.add_dist("nvidia-nccl-cu12", "2.27.3", {"nvidia/nccl/lib/libnccl.so.2": b"old"})
    site.add_dist("nvidia-nccl-cu13", "2.30.7", {"nvidia/nccl/lib/libnccl.so.2": b"new"})
    msg = "/v/torch/lib/libtorch_cuda.so: undefined symbol: ncclCommResume"
    why = explain_import_error(msg, env_for(site).owners, "python")
    assert "nvidia-nccl-cu12" in why.summary and "nvidia-nccl-cu13" in why.summary
    assert why.evidence["symbol"] == "ncclCommResume"


# --- the checks on fake reports -------------------------------------------------------------------

CPU_FLEX_OK = {
    "status": "ok",
    "device": "cpu",
    "counters": {"frames_ok": 1, "unique_graphs": 1, "graph_breaks": 0},
    "dense_warnings": [],
    "forward_max_abs_diff": 3e-7,
    "dense_score_matrix_mib": 0.38,
}


def report_for(**raw: Any) -> ProbeReport:
    base: dict[str, Any] = {
        "schema": "dflash-doctor/probe/v1",
        "import": {"ok": True, "seconds": 1.0},
        "torch": {
            "version": "2.14.1+cu130",
            "cuda": "13.0",
            "cudnn_compiled": [9, 24, 0],
            "nccl_compiled": [2, 30, 7],
        },
        "cuda": {"available": False, "reason": "no NVIDIA driver"},
        "libraries": {"loaded": [], "versions": {}},
        "flex": CPU_FLEX_OK,
        "seconds": 2.0,
    }
    base.update(raw)
    return ProbeReport(raw=base, seconds=2.0)


def deep_findings(ctx: CheckContext, report: ProbeReport) -> dict[str, list[Finding]]:
    ctx.shared("deep.report", lambda: report)
    out: dict[str, list[Finding]] = {}
    for f in (f for r in run_checks(ctx, ["deep"]) for f in r.findings):
        out.setdefault(f.id, []).append(f)
    return out


def deep_ctx(*sites: FakeSite, lock: Path | None = None) -> CheckContext:
    return CheckContext(env_for(*sites), CheckOptions(deep=True, lock_path=lock))


def test_healthy_cpu_report_is_quiet(site: FakeSite) -> None:
    site.add_torch()
    got = deep_findings(deep_ctx(site), report_for())
    assert {
        k: v[0].severity for k, v in got.items() if v[0].severity not in (Severity.OK, Severity.SKIP)
    } == {}
    assert got["deep.flex"][0].severity is Severity.OK
    assert got["deep.cuda"][0].severity is Severity.SKIP and "no NVIDIA driver" in got["deep.cuda"][0].summary


def test_dense_fallback_fails_the_flex_proof(site: FakeSite) -> None:
    site.add_torch()
    dense = dict(
        CPU_FLEX_OK,
        counters={"frames_ok": 0, "unique_graphs": 0, "graph_breaks": 0},
        dense_warnings=[
            "flex_attention called without torch.compile() - ... materializes the full scores matrix"
        ],
    )
    flex = deep_findings(deep_ctx(site), report_for(flex=dense))["deep.flex"][0]
    assert flex.severity is Severity.FAIL and "dense path" in flex.summary


def test_flex_mismatch_and_dense_sized_memory_fail(site: FakeSite) -> None:
    site.add_torch()
    bad = dict(
        CPU_FLEX_OK,
        device="cuda:0",
        forward_max_abs_diff=float("nan"),
        backward_max_abs_diff=0.5,
        peak_extra_mib=80.0,
        dense_score_matrix_mib=80.0,
    )
    flex = deep_findings(deep_ctx(site), report_for(flex=bad))["deep.flex"][0]
    assert flex.severity is Severity.FAIL
    assert (
        "forward differs" in flex.summary
        and "gradients differ" in flex.summary
        and "near the dense" in flex.summary
    )


def test_import_failure_is_explained_with_the_static_model(site: FakeSite) -> None:
    site.add_torch(version="2.14.1+cu130", cuda="13.0")
    site.add_dist("nvidia-cusparselt-cu13", "0.8.1", {"nvidia/cusparselt/lib/libcusparseLt.so.0": b"x"})
    (site.root / "nvidia/cusparselt/lib/libcusparseLt.so.0").unlink()
    failed = report_for(
        **{
            "import": {
                "ok": False,
                "error_type": "ImportError",
                "message": "libcusparseLt.so.0: cannot open shared object file: No such file or directory",
            }
        }
    )
    got = deep_findings(deep_ctx(site), failed)
    imp = got["deep.import"][0]
    assert imp.severity is Severity.FAIL and "nvidia-cusparselt-cu13" in imp.summary
    assert "--force-reinstall --no-deps nvidia-cusparselt-cu13==0.8.1" in (imp.remedy or "")
    assert got["deep.flex"][0].severity is Severity.SKIP  # nothing else pretends to know


def test_probe_that_never_answered_fails(site: FakeSite) -> None:
    site.add_torch()
    got = deep_findings(deep_ctx(site), ProbeReport(error="the probe did not finish within 300 s"))
    assert got["deep.probe"][0].severity is Severity.FAIL
    assert got["deep.flex"][0].severity is Severity.SKIP


def test_context_overhead_compared_with_the_lock(site: FakeSite, tmp_path: Path) -> None:
    site.add_torch(version="2.11.0+cu130", cuda="13.0")
    lock = build_lock(env_for(site), None, GpuInventory("580.159.04", 13000, []), {})
    lock.runtime = {"context_overhead_mib": {"0": 540.0}}
    path = write_lock(lock, tmp_path / "dflash.lock")
    cuda = {
        "available": True,
        "devices": [{"index": 0, "name": "NVIDIA H200", "capability": [9, 0]}],
        "touch": {"0": {"cublas": "ok", "cudnn": "ok"}},
        "nccl": {"status": "ok"},
        "context_overhead_mib": {"0": 746.8},
        "overhead_method": "NVML",
    }
    got = deep_findings(deep_ctx(site, lock=path), report_for(cuda=cuda))
    grew = got["deep.context.grew"][0]
    assert grew.severity is Severity.WARN and "207 MiB more" in grew.summary
    assert got["deep.context"][0].severity is Severity.OK
    quiet = deep_findings(deep_ctx(site), report_for(cuda=cuda))
    assert "deep.context.grew" not in quiet


def test_cuda_step_failure_fails(site: FakeSite) -> None:
    site.add_torch(version="2.11.0+cu130", cuda="13.0")
    cuda = {
        "available": True,
        "devices": [{"index": 0, "name": "NVIDIA H200", "capability": [9, 0]}],
        "touch": {
            "0": {
                "cublas": "ok",
                "cudnn": {"error_type": "RuntimeError", "message": "cuDNN version incompatibility"},
            }
        },
        "nccl": {"status": "ok"},
    }
    got = deep_findings(deep_ctx(site), report_for(cuda=cuda))
    assert (
        got["deep.cuda"][0].severity is Severity.FAIL
        and "cuDNN version incompatibility" in got["deep.cuda"][0].summary
    )


def test_loaded_from_elsewhere_than_the_static_model_fails(site: FakeSite, cuda_libs, tmp_path: Path) -> None:
    install_cuda_torch(site, cuda_libs)
    root = site.root
    predicted_paths = [
        root / "torch/lib/libtorch_global_deps.so",
        root / "torch/lib/libtorch_cuda.so",
        root / "nvidia/cu13/lib/libcudart.so.13",
        root / "nvidia/nccl/lib/libnccl.so.2",
    ]
    agree = report_for(libraries={"loaded": [str(p) for p in predicted_paths], "versions": {}})
    got = deep_findings(deep_ctx(site), agree)
    assert got["deep.libraries.static"][0].severity is Severity.OK
    owners = got["deep.libraries"][0].evidence["loaded"]
    assert any("libnccl.so.2  [nvidia-nccl-cu13]" in row for row in owners)

    stray = tmp_path / "old" / "libnccl.so.2"
    stray.parent.mkdir()
    stray.write_bytes(b"older")
    elsewhere = [str(p) for p in predicted_paths if p.name != "libnccl.so.2"] + [str(stray)]
    got = deep_findings(deep_ctx(site), report_for(libraries={"loaded": elsewhere, "versions": {}}))
    bad = got["deep.libraries.static"][0]
    assert bad.severity is Severity.FAIL and bad.evidence["soname"] == "libnccl.so.2"
    assert str(stray) in bad.summary


def test_two_nccls_in_one_process_fail(site: FakeSite) -> None:
    site.add_torch()
    loaded = ["/v/nvidia/nccl/lib/libnccl.so.2", "/usr/lib/x86_64-linux-gnu/libnccl.so.2.28.3"]
    got = deep_findings(deep_ctx(site), report_for(libraries={"loaded": loaded, "versions": {}}))
    assert got["deep.libraries.duplicate"][0].severity is Severity.FAIL


# --- real children ----------------------------------------------------------------------------------


@pytest.mark.skipif(not os.path.exists(CPU_PYTHON), reason="needs the CPU torch venv")
def test_real_check_deep_in_the_cpu_venv_without_flex(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DFLASH_DOCTOR_DEEP_FLEX", "0")
    code = run(["check", "--deep", "--python", CPU_PYTHON, "--only", "deep", "--json"])
    report = json.loads(capsys.readouterr().out)
    got = {f["id"]: f for f in report["findings"]}
    assert code == 0, got
    assert got["deep.import"]["severity"] == "ok"
    assert got["deep.libraries.static"]["severity"] in ("ok", "skip")
    assert got["deep.cuda"]["severity"] == "skip" and "CPU build" in got["deep.cuda"]["summary"]
    assert any("libtorch_cpu.so" in row for row in got["deep.libraries"]["evidence"]["loaded"])


@pytest.mark.skipif(not os.path.exists(CU13_PYTHON), reason="needs the CUDA 13 torch venv")
def test_real_cuda_venv_without_gpu_maps_libraries_and_agrees_with_static(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    report = run_probe(CU13_PYTHON, timeout=120, flex=False)
    assert report.ran and report.import_ok, report.error
    assert report.versions["cudnn"]["parsed"][:2] == report.torch["cudnn_compiled"][:2]
    from dflash_doctor.env.environment import Environment

    ctx = CheckContext(Environment.load(CU13_PYTHON), CheckOptions(deep=True))
    got = deep_findings(ctx, report)
    assert got["deep.libraries.static"][0].severity is Severity.OK  # else: a bug in the static model
    assert got["deep.versions"][0].severity is Severity.OK
    assert got["deep.cuda"][0].severity is Severity.SKIP


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(CPU_PYTHON), reason="needs the CPU torch venv")
def test_real_flex_proof_on_cpu_and_its_dense_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    report = run_probe(CPU_PYTHON, timeout=300)
    flex = report.flex
    assert flex["status"] == "ok" and flex["counters"]["frames_ok"] >= 1 and flex["dense_warnings"] == []
    assert flex["forward_max_abs_diff"] < 1e-4
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")  # what silencing compile does: the dense path
    dense = run_probe(CPU_PYTHON, timeout=300).flex
    assert dense["counters"]["frames_ok"] == 0 and dense["dense_warnings"]


# --- the CUDA branch of the child, against a fake torch and a fake NVML ------------------------------


class FakeTensor:
    def __matmul__(self, other: FakeTensor) -> FakeTensor:
        return self

    def sum(self) -> FakeTensor:
        return self

    def item(self) -> float:
        return 0.0


class FakeTorchCuda:
    """The torch.cuda calls `cuda_steps` makes, for two H200s; cuDNN broken on device 1."""

    def __init__(self, nvml: FakeChildNvml) -> None:
        self.nvml = nvml

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 2

    def get_arch_list(self) -> list[str]:
        return ["sm_90", "sm_100"]

    def get_device_properties(self, i: int) -> Any:
        from types import SimpleNamespace

        # CUDA_VISIBLE_DEVICES=3,2: torch's device 0 is NVML's device 3
        uuid = ["aaaa-3", "aaaa-2"][i]
        return SimpleNamespace(name="NVIDIA H200", major=9, minor=0, total_memory=140 << 30, uuid=uuid)

    def synchronize(self, i: int | None = None) -> None:
        # initialising a device costs its context on the matching NVML device
        if i is not None:
            self.nvml.used[[3, 2][i]] += [747, 760][i] << 20

    def memory_reserved(self, i: int) -> int:
        return 2 << 20


class FakeChildNvml:
    def __init__(self) -> None:
        self.used = {0: 0, 1: 0, 2: 100 << 20, 3: 0}

    def used_bytes(self, i: int) -> int:
        return self.used[i]

    def uuid(self, i: int) -> str:
        return f"aaaa-{i}"


def fake_torch(nvml: FakeChildNvml) -> Any:
    from types import SimpleNamespace

    def conv2d(x: Any, w: Any) -> FakeTensor:
        if conv2d.calls == 1:
            raise RuntimeError("cuDNN error: CUDNN_STATUS_NOT_INITIALIZED")
        conv2d.calls += 1
        return FakeTensor()

    conv2d.calls = 0  # type: ignore[attr-defined]
    dist = SimpleNamespace(is_available=lambda: True, is_nccl_available=lambda: False)
    return SimpleNamespace(
        cuda=FakeTorchCuda(nvml),
        randn=lambda *a, **k: FakeTensor(),
        nn=SimpleNamespace(functional=SimpleNamespace(conv2d=conv2d)),
        distributed=dist,
        version=SimpleNamespace(cuda="13.0"),
    )


def test_cuda_steps_measure_overhead_per_device_through_nvml_uuids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,2")
    nvml = FakeChildNvml()
    before = dict(nvml.used)
    report = probe_child.cuda_steps(fake_torch(nvml), nvml, before)  # type: ignore[arg-type]
    assert report["context_overhead_mib"] == {"0": 745.0, "1": 758.0}  # minus torch's own 2 MiB
    assert report["touch"]["0"] == {"cublas": "ok", "cudnn": "ok"}
    assert report["touch"]["1"]["cudnn"]["error_type"] == "RuntimeError"
    assert report["nccl"]["status"] == "skipped"
    findings = {
        f.id: f for f in __import__("checks.deep", fromlist=["x"]).cuda_findings(report_for(cuda=report))
    }
    assert findings["deep.cuda"].severity is Severity.FAIL and "cuda:1.cudnn" in findings["deep.cuda"].summary


def test_cuda_steps_without_nvml_say_why_overhead_is_missing() -> None:
    nvml = FakeChildNvml()
    report = probe_child.cuda_steps(fake_torch(nvml), None, None)  # type: ignore[arg-type]
    assert report["context_overhead_mib"] == {}
    assert "not measured" in str(report["overhead_method"])


def test_dense_mask_tensor_matches_the_reference() -> None:
    torch = pytest.importorskip("torch")
    anchors = [3, 9, 17]
    want = dflash_mask_reference(anchors, block=4, context=20, q_len=12, kv_len=32)
    got = probe_child.dense_dflash_mask(torch, torch.tensor(anchors), 4, 20, 12, 32)
    assert got.tolist() == want


@pytest.mark.skipif(not os.path.exists(CPU_PYTHON), reason="needs the CPU torch venv")
def test_probe_command_prints_and_saves_the_raw_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "probe.json"
    assert run(["probe", "--python", CPU_PYTHON, "--no-flex", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert printed["raw"]["schema"] == "dflash-doctor/probe/v1" and printed["raw"]["import"]["ok"]
    assert printed["raw"]["flex"]["status"] == "skipped"


# --- what each loaded library was built for (issue 19 D) -----------------------------------------------

CU128_TORCH = {
    "version": "2.9.1+cu128",
    "cuda": "12.8",
    "cudnn_compiled": [9, 10, 2],
    "nccl_compiled": [2, 27, 5],
}


def test_cuda13_cudnn_in_a_cuda12_process_fails_as_a_cross_family_load(site: FakeSite) -> None:
    """The issue's box: the loaded cuDNN says 9.28.1 (fine on its own) but cudnnGetCudartVersion 13050."""
    site.add_torch(version="2.9.1+cu128", cuda="12.8")
    cudnn = {
        "parsed": [9, 28, 1],
        "path": "/v/nvidia/cudnn/lib/libcudnn.so.9",
        "cuda_build": [13, 5],
        "cuda_build_from": "cudnnGetCudartVersion",
    }
    versions = {
        "cudnn": cudnn,
        "nccl": {"parsed": [2, 32, 3], "cuda_build": [12, 9]},
        "cudart": {"parsed": [12, 8]},
    }
    report = report_for(torch=CU128_TORCH, libraries={"loaded": [], "versions": versions})
    got = deep_findings(deep_ctx(site), report)
    cross = got["deep.versions.cross_family"]
    assert [f.severity for f in cross] == [Severity.FAIL]
    assert "cudnn is built for CUDA 13 (cudnnGetCudartVersion) in a CUDA 12 process" in cross[0].summary
    assert "deep.versions" not in got  # no "ok: loaded libraries match torch's build"


def test_same_family_builds_are_named_in_the_ok(site: FakeSite) -> None:
    site.add_torch(version="2.9.1+cu128", cuda="12.8")
    versions = {
        "cudnn": {"parsed": [9, 10, 2], "cuda_build": [12, 9], "cuda_build_from": "cudnnGetCudartVersion"},
        "cublas": {"parsed": [12, 8, 4], "cuda_build": [12, 8], "cuda_build_from": "cublasGetCudartVersion"},
    }
    got = deep_findings(
        deep_ctx(site), report_for(torch=CU128_TORCH, libraries={"loaded": [], "versions": versions})
    )
    assert got["deep.versions"][0].severity is Severity.OK
    assert "cudnn CUDA 12.9" in got["deep.versions"][0].summary
    assert "deep.versions.cross_family" not in got


def test_nccl_without_a_version_string_is_judged_by_the_package_that_installed_it(site: FakeSite) -> None:
    from tests.packaging_fixtures import nccl_files

    site.add_torch(version="2.9.1+cu128", cuda="12.8", requires=["nvidia-nccl-cu12==2.27.5"])
    site.add_dist("nvidia-nccl-cu13", "2.27.5", nccl_files("cu13"))  # same NCCL version, CUDA 13 build
    path = str(site.root / "nvidia/nccl/lib/libnccl.so.2")
    versions = {"nccl": {"parsed": [2, 27, 5], "path": path}}
    report = report_for(torch=CU128_TORCH, libraries={"loaded": [path], "versions": versions})
    cross = deep_findings(deep_ctx(site), report)["deep.versions.cross_family"]
    assert "nccl is built for CUDA 13 (installed by nvidia-nccl-cu13)" in cross[0].summary


def test_nccl_cuda_build_is_read_from_its_version_string(tmp_path: Path) -> None:
    lib = tmp_path / "libnccl.so.2"
    lib.write_bytes(
        b"\x7fELF junk NCCL version info only\x00 more NCCL version %s, but\x00"
        b"NCCL version 2.30.7+cuda13.3\x00NCCL_MNNVL_UUID\x00"
    )
    assert probe_child.nccl_cuda_build(str(lib)) == [13, 3]
    (tmp_path / "plain.so").write_bytes(b"nothing here")
    assert probe_child.nccl_cuda_build(str(tmp_path / "plain.so")) is None


def test_probe_keeps_every_inductor_file_in_its_own_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 19 E: precompiled headers live under `<tmp>/torchinductor_<user>`, not the cache dir."""
    import tempfile

    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TMPDIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)
    probe_child.keep_inductor_state_in(str(tmp_path))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path)
    assert os.environ["TRITON_CACHE_DIR"].startswith(str(tmp_path))
    assert tempfile.gettempdir() == str(tmp_path / "tmp") and os.environ["TMPDIR"] == str(tmp_path / "tmp")
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    assert default_cache_dir().startswith(str(tmp_path))  # where precompiled_headers go
