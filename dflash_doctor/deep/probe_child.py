"""The deep probe: runs INSIDE the audited interpreter, prints one JSON document on stdout.

Stdlib + torch only (the audited environment has no dflash_doctor), runnable as a plain script:

    /path/to/venv/bin/python probe_child.py [--no-flex] [--no-cuda] [--inductor-cache DIR]

Only the running process knows the truth: `torch.cuda.nccl.version()` is the compile-time NCCL, while
the library really mapped may be another (REFERENCE.md section 1). So this imports torch, initialises
CUDA, touches cuBLAS, cuDNN and NCCL, reads /proc/self/maps, asks the loaded libraries their versions
through ctypes, measures the CUDA context overhead, and proves compiled flex_attention runs.
Every step records its own error; one failing step never hides the others.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import sys
import tempfile
import time
import traceback
import warnings
from typing import Any

PROBE_SCHEMA = "dflash-doctor/probe/v1"
MIB = float(1 << 20)
DENSE_WARNINGS = ("materializes the full scores matrix", "without torch.compile")

# --- pure helpers (unit-tested without torch) --------------------------------------------------------


def parse_maps(text: str) -> list[str]:
    """Every mapped shared object in a /proc/<pid>/maps text, deduplicated, in first-mapped order."""
    seen: dict[str, None] = {}
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5].strip()
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        if not path.startswith("/"):
            continue
        name = os.path.basename(path)
        if ".so" not in name:
            continue
        seen.setdefault(path, None)
    return list(seen)


def normalise_uuid(text: str) -> str:
    """NVML says `GPU-8c1e...`, torch's device properties say `8c1e...`: compare the bare UUID."""
    text = text.strip().lower()
    return text[4:] if text.startswith("gpu-") else text


def nvml_index_for(torch_index: int, torch_uuid: str | None, nvml_uuids: dict[int, str]) -> int | None:
    """The NVML index of a torch device: by UUID (CUDA_VISIBLE_DEVICES renumbers), else the same index."""
    if torch_uuid:
        wanted = normalise_uuid(torch_uuid)
        for index, uuid in nvml_uuids.items():
            if uuid == wanted:
                return index
    if os.environ.get("CUDA_VISIBLE_DEVICES") is None and torch_index in nvml_uuids:
        return torch_index
    return None


def library_family(path: str) -> str:
    """`/x/libnccl.so.2.28.9` -> `libnccl`: two loaded files of one family are two copies of a library."""
    return os.path.basename(path).split(".so", 1)[0]


def version_int_to_tuple(value: int, family: str) -> list[int]:
    """Decode the integers the libraries return (cuDNN 9: 91900, NCCL: 22809, CUDA: 13000)."""
    if family == "cudart" or family == "cuda":
        return [value // 1000, (value % 1000) // 10]
    if family == "nccl" and value < 10000:  # NCCL < 2.9 encoded major*1000 + minor*100 + patch
        return [value // 1000, (value % 1000) // 100, value % 100]
    return [value // 10000, (value % 10000) // 100, value % 100]


# --- the probe steps ---------------------------------------------------------------------------------


def _step_error(exc: BaseException) -> dict[str, object]:
    return {"error_type": type(exc).__name__, "message": str(exc).strip()[:2000]}


def read_loaded() -> list[str]:
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as handle:
            return parse_maps(handle.read())
    except OSError:
        return []


# (family, file-name prefix, how to ask the loaded copy its version)
VERSION_QUERIES = [
    ("cudart", "libcudart.so", "cudaRuntimeGetVersion"),
    ("cuda", "libcuda.so", "cuDriverGetVersion"),
    ("cudnn", "libcudnn.so", "cudnnGetVersion"),
    ("nccl", "libnccl.so", "ncclGetVersion"),
    ("cublas", "libcublas.so", "cublasGetProperty"),
]


# Which CUDA a library was built for: a cuDNN or cuBLAS built for CUDA 13 in a CUDA 12 process (its
# files overwrote the cu12 package's) reports a fine version of its own and still fails at first use.
CUDA_BUILD_QUERIES = {"cudnn": "cudnnGetCudartVersion", "cublas": "cublasGetCudartVersion"}
NCCL_VERSION_STRING = re.compile(rb"NCCL version [0-9.]+[^+\x00]{0,32}\+cuda(\d+)\.(\d+)")


def loaded_versions(loaded: list[str]) -> dict[str, dict[str, object]]:
    """Ask each already-loaded library its version through its own handle (RTLD_NOLOAD: never load a
    new copy), and the CUDA it was built for (`cuda_build`, [major, minor])."""
    found: dict[str, dict[str, object]] = {}
    for family, prefix, func in VERSION_QUERIES:
        for path in loaded:
            if not os.path.basename(path).startswith(prefix):
                continue
            entry: dict[str, object] = {"path": path, "function": func}
            try:
                handle = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
                version: Any = _ask_version(handle, func)
                entry["version"] = version
                entry["parsed"] = (
                    version if isinstance(version, list) else version_int_to_tuple(int(version), family)
                )
                entry.update(cuda_build_of(family, handle, path))
            except (OSError, AttributeError, ValueError) as exc:
                entry.update(_step_error(exc))
            found.setdefault(family, entry)
    return found


def cuda_build_of(family: str, handle: ctypes.CDLL, path: str) -> dict[str, object]:
    """`{"cuda_build": [13, 0], "cuda_build_from": ...}`, or {} when the library does not say."""
    func = CUDA_BUILD_QUERIES.get(family)
    if func is not None:
        try:
            fn = getattr(handle, func)
        except AttributeError:
            return {}
        fn.restype = ctypes.c_size_t
        return {"cuda_build": version_int_to_tuple(int(fn()), "cudart"), "cuda_build_from": func}
    if family == "nccl":
        found = nccl_cuda_build(path)
        return {"cuda_build": found, "cuda_build_from": "NCCL version string"} if found else {}
    return {}


def nccl_cuda_build(path: str) -> list[int] | None:
    """NCCL has no call for it, but carries `NCCL version 2.27.5+cuda12.9` in its read-only data."""
    import mmap

    try:
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            at = data.find(b"NCCL version ")
            while at != -1:
                match = NCCL_VERSION_STRING.match(data, at)
                if match:
                    return [int(match.group(1)), int(match.group(2))]
                at = data.find(b"NCCL version ", at + 1)
    except (OSError, ValueError):
        return None
    return None


def _ask_version(handle: ctypes.CDLL, func: str) -> object:
    if func == "cudnnGetVersion":
        fn = handle.cudnnGetVersion
        fn.restype = ctypes.c_size_t
        return int(fn())
    if func == "cublasGetProperty":
        parts = []
        for prop in (0, 1, 2):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            value = ctypes.c_int()
            status = handle.cublasGetProperty(prop, ctypes.byref(value))
            if status != 0:
                raise ValueError(f"cublasGetProperty returned {status}")
            parts.append(value.value)
        return parts
    value = ctypes.c_int()
    status = getattr(handle, func)(ctypes.byref(value))
    if status != 0:
        raise ValueError(f"{func} returned status {status}")
    return int(value.value)


class Nvml:
    """Just enough NVML through ctypes to read device memory before CUDA exists in this process."""

    class _Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise OSError("nvmlInit_v2 failed")

    def used_bytes(self, index: int) -> int:
        handle = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
            raise OSError(f"no NVML handle for device {index}")
        memory = self._Memory()
        if self.lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) != 0:
            raise OSError(f"nvmlDeviceGetMemoryInfo failed for device {index}")
        return int(memory.used)

    def uuid(self, index: int) -> str:
        handle = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
            raise OSError(f"no NVML handle for device {index}")
        buf = ctypes.create_string_buffer(96)
        if self.lib.nvmlDeviceGetUUID(handle, buf, 96) != 0:
            raise OSError(f"nvmlDeviceGetUUID failed for device {index}")
        return normalise_uuid(buf.value.decode())

    def count(self) -> int:
        value = ctypes.c_uint()
        if self.lib.nvmlDeviceGetCount_v2(ctypes.byref(value)) != 0:
            raise OSError("nvmlDeviceGetCount_v2 failed")
        return int(value.value)


def torch_facts(torch: object) -> dict[str, object]:
    t = torch  # typed loosely: this file must not import anything but the stdlib at module level
    facts: dict[str, object] = {
        "version": t.__version__,  # type: ignore[attr-defined]
        "git_version": getattr(t.version, "git_version", None),  # type: ignore[attr-defined]
        "cuda": t.version.cuda,  # type: ignore[attr-defined]
        "file": t.__file__,  # type: ignore[attr-defined]
    }
    try:
        cudnn = t._C._cudnn  # type: ignore[attr-defined]
        facts["cudnn_compiled"] = list(cudnn.getCompileVersion())
        facts["cudnn_runtime_torch"] = list(cudnn.getRuntimeVersion())
    except Exception as exc:
        facts["cudnn_error"] = _step_error(exc)
    try:
        facts["nccl_compiled"] = list(t.cuda.nccl.version())[:3]  # type: ignore[attr-defined]
    except Exception as exc:
        facts["nccl_error"] = _step_error(exc)
    return facts


def cuda_steps(
    torch: object, nvml: Nvml | None, nvml_used_before: dict[int, int] | None
) -> dict[str, object]:
    """Init every device, touch cuBLAS (matmul) and cuDNN (conv), measure the context overhead."""
    t = torch
    report: dict[str, object] = {"available": bool(t.cuda.is_available())}  # type: ignore[attr-defined]
    if not report["available"]:
        report["reason"] = _cuda_unavailable_reason(t)
        return report
    count = t.cuda.device_count()  # type: ignore[attr-defined]
    report["device_count"] = count
    report["arch_list"] = list(t.cuda.get_arch_list())  # type: ignore[attr-defined]
    devices, overhead, touch = [], {}, {}
    nvml_uuids: dict[int, str] = {}
    if nvml is not None and nvml_used_before is not None:
        for nvml_i in nvml_used_before:
            try:
                nvml_uuids[nvml_i] = nvml.uuid(nvml_i)
            except OSError:
                continue
    for index in range(count):
        props = t.cuda.get_device_properties(index)  # type: ignore[attr-defined]
        devices.append(
            {
                "index": index,
                "name": props.name,
                "capability": [props.major, props.minor],
                "total": props.total_memory,
            }
        )
        dev = f"cuda:{index}"
        steps: dict[str, object] = {}
        try:
            a = t.randn(256, 256, device=dev)  # type: ignore[attr-defined]
            (a @ a).sum().item()
            steps["cublas"] = "ok"
        except Exception as exc:
            steps["cublas"] = _step_error(exc)
        try:
            x = t.randn(1, 3, 16, 16, device=dev)  # type: ignore[attr-defined]
            w = t.randn(4, 3, 3, 3, device=dev)  # type: ignore[attr-defined]
            t.nn.functional.conv2d(x, w).sum().item()  # type: ignore[attr-defined]
            steps["cudnn"] = "ok"
        except Exception as exc:
            steps["cudnn"] = _step_error(exc)
        t.cuda.synchronize(index)  # type: ignore[attr-defined]
        touch[str(index)] = steps
        reserved = t.cuda.memory_reserved(index)  # type: ignore[attr-defined]
        nvml_index = nvml_index_for(index, str(getattr(props, "uuid", "") or ""), nvml_uuids)
        if nvml is not None and nvml_used_before is not None and nvml_index in nvml_used_before:
            # The same NVML counter before and after: the driver's reserved memory cancels out.
            used_after = nvml.used_bytes(nvml_index)
            overhead[str(index)] = round((used_after - nvml_used_before[nvml_index] - reserved) / MIB, 1)
    report.update(devices=devices, touch=touch)
    report["context_overhead_mib"] = overhead
    report["overhead_method"] = (
        "NVML used memory of the device before CUDA init and after init + cuBLAS + cuDNN on it, "
        "minus torch's reserved memory (device-wide: other processes starting meanwhile add noise)"
        if overhead
        else "not measured: NVML (libnvidia-ml.so.1) not readable before init"
    )
    report["nccl"] = nccl_one_rank(t)
    return report


def _cuda_unavailable_reason(t: object) -> str:
    if t.version.cuda is None:  # type: ignore[attr-defined]
        return "torch is a CPU build"
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return f"no NVIDIA driver: {exc}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            count = t.cuda.device_count()  # type: ignore[attr-defined]
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
    said = "; ".join(str(w.message).strip().splitlines()[0] for w in caught if str(w.message).strip())
    return said or f"no CUDA device visible (device_count={count})"


def nccl_one_rank(t: object) -> dict[str, object]:
    """A one-rank NCCL process group and an all_reduce: proves NCCL initialises and runs a kernel."""
    try:
        dist = t.distributed  # type: ignore[attr-defined]
        if not dist.is_available() or not dist.is_nccl_available():
            return {"status": "skipped", "reason": "torch.distributed has no NCCL backend"}
        store = dist.HashStore()
        start = time.perf_counter()
        dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=t.device("cuda:0"))  # type: ignore[attr-defined]
        try:
            value = t.ones(4, device="cuda:0")  # type: ignore[attr-defined]
            dist.all_reduce(value)
            t.cuda.synchronize()  # type: ignore[attr-defined]
        finally:
            dist.destroy_process_group()
        return {"status": "ok", "seconds": round(time.perf_counter() - start, 3)}
    except Exception as exc:
        return {"status": "error", **_step_error(exc)}


def flex_proof(t: object, device: str) -> dict[str, object]:
    """Compile flex_attention with a DFlash-like mask; prove the compiled path ran and matches dense."""
    report: dict[str, object] = {"device": device}
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except Exception as exc:
        return {"status": "skipped", "reason": f"flex_attention not importable: {exc}"}
    from torch._dynamo.utils import counters

    on_cuda = device.startswith("cuda")
    # CUDA: big enough that the dense score matrix (320 MiB) dwarfs what the fused kernel needs.
    heads, dim, block, n_anchors, context = (4, 64, 16, 128, 8192) if on_cuda else (2, 16, 16, 8, 256)
    q_len, kv_len = n_anchors * block, context + n_anchors * block
    gen = t.Generator().manual_seed(0)  # type: ignore[attr-defined]
    anchors_list = sorted(
        int(a)
        for a in t.randperm(context - 1, generator=gen)[:n_anchors] + 1  # type: ignore[attr-defined]
    )
    anchors = t.tensor(anchors_list, device=device)  # type: ignore[attr-defined]

    def dflash_mask(b, h, q_idx, kv_idx):
        blk = q_idx // block
        anchor = anchors[blk.clamp(max=n_anchors - 1)]
        in_context = (kv_idx < context) & (kv_idx < anchor)
        own_block = (kv_idx >= context) & ((kv_idx - context) // block == blk)
        return in_context | own_block

    report["shape"] = {"heads": heads, "head_dim": dim, "q_len": q_len, "kv_len": kv_len, "block": block}
    counters.clear()
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            mask = create_block_mask(dflash_mask, B=None, H=None, Q_LEN=q_len, KV_LEN=kv_len, device=device)
            compiled = t.compile(flex_attention)  # type: ignore[attr-defined]
            q, k, v = (
                t.randn(1, heads, n, dim, device=device, requires_grad=on_cuda)  # type: ignore[attr-defined]
                for n in (q_len, kv_len, kv_len)
            )
            out = compiled(q, k, v, block_mask=mask)  # compiles the forward
            if on_cuda:
                grad_out = t.randn_like(out)  # type: ignore[attr-defined]
                out.backward(grad_out)  # compiles the backward
                q.grad = k.grad = v.grad = None
                # Measure a second, already-compiled step: compile-time buffers are not the kernel's.
                t.cuda.synchronize()  # type: ignore[attr-defined]
                t.cuda.reset_peak_memory_stats()  # type: ignore[attr-defined]
                baseline = t.cuda.memory_allocated()  # type: ignore[attr-defined]
                out = compiled(q, k, v, block_mask=mask)
                out.backward(grad_out)
                t.cuda.synchronize()  # type: ignore[attr-defined]
                peak = t.cuda.max_memory_allocated() - baseline  # type: ignore[attr-defined]
                report["peak_extra_mib"] = round(peak / MIB, 2)
        except Exception as exc:
            report.update(
                status="error", **_step_error(exc), traceback=traceback.format_exc().splitlines()[-8:]
            )
            return report
    report["compile_seconds"] = round(time.perf_counter() - start, 3)
    report["dense_score_matrix_mib"] = round(heads * q_len * kv_len * 4 / MIB, 2)
    report["counters"] = {
        "frames_ok": int(counters["frames"]["ok"]),
        "unique_graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "fxgraph_cache_miss": int(counters["inductor"]["fxgraph_cache_miss"]),
        "fxgraph_cache_hit": int(counters["inductor"]["fxgraph_cache_hit"]),
    }
    report["dense_warnings"] = [
        str(w.message)[:300] for w in caught if any(s in str(w.message) for s in DENSE_WARNINGS)
    ]
    # The dense reference: the same mask as a boolean matrix, exact SDPA math.
    dense_mask = dense_dflash_mask(t, anchors, block, context, q_len, kv_len)
    qr, kr, vr = (x.detach().clone().requires_grad_(on_cuda) for x in (q, k, v))
    scores = (qr @ kr.transpose(-2, -1)) / (dim**0.5)
    ref = t.softmax(scores.masked_fill(~dense_mask, float("-inf")), dim=-1) @ vr  # type: ignore[attr-defined,operator]
    report["forward_max_abs_diff"] = float((out.detach() - ref.detach()).abs().max())
    report["forward_rel_err"] = _relative(t, out.detach(), ref.detach())
    if on_cuda:
        ref.backward(grad_out)
        report["backward_max_abs_diff"] = max(
            float((a.grad - b.grad).abs().max()) for a, b in ((q, qr), (k, kr), (v, vr))
        )
        report["backward_rel_err"] = max(_relative(t, a.grad, b.grad) for a, b in ((q, qr), (k, kr), (v, vr)))
    report["status"] = "ok"
    return report


def dense_dflash_mask(
    t: object, anchors: object, block: int, context: int, q_len: int, kv_len: int
) -> object:
    """The DFlash mask as a boolean tensor (query rows, key columns: context strictly before the query block's
    anchor, its own block both ways), built with whole-tensor ops (fast at any shape)."""
    q_block = t.arange(q_len, device=anchors.device) // block  # type: ignore[attr-defined]
    kv = t.arange(kv_len, device=anchors.device)  # type: ignore[attr-defined]
    anchor = anchors[q_block]  # type: ignore[index]
    in_context = (kv[None, :] < context) & (kv[None, :] < anchor[:, None])
    own_block = (kv[None, :] >= context) & ((kv[None, :] - context) // block == q_block[:, None])
    return in_context | own_block


def _relative(t: object, got: object, want: object) -> float:
    """max |got - want| / max |want|: TF32 and fp32 rounding stay near 1e-3, a wrong kernel near 1."""
    scale = float(want.abs().max())  # type: ignore[attr-defined]
    return float((got - want).abs().max()) / max(scale, 1e-12)  # type: ignore[operator]


def keep_inductor_state_in(folder: str) -> None:
    """Every file Inductor and Triton write goes under `folder`: the cache, the triton cache, and the
    temp folder, which is where Inductor keeps its precompiled headers (`<tmp>/torchinductor_<user>/
    precompiled_headers`, not under TORCHINDUCTOR_CACHE_DIR) and its scratch files."""
    scratch = os.path.join(folder, "tmp")
    os.makedirs(scratch, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    os.environ["TRITON_CACHE_DIR"] = os.path.join(folder, "triton")
    os.environ["TMPDIR"] = scratch
    tempfile.tempdir = scratch


def main(argv: list[str]) -> int:
    want_flex = "--no-flex" not in argv
    want_cuda = "--no-cuda" not in argv
    if "--inductor-cache" in argv:
        cache = argv[argv.index("--inductor-cache") + 1]
    else:
        cache = tempfile.mkdtemp(prefix="dflash-probe-inductor-")
    if cache != "inherit":
        keep_inductor_state_in(cache)
    report: dict[str, object] = {
        "schema": PROBE_SCHEMA,
        "python": sys.executable,
        "python_version": ".".join(str(part) for part in sys.version_info[:3]),
        "pid": os.getpid(),
        "inductor_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
        "temp_dir": tempfile.gettempdir(),
        "ld_library_path": os.environ.get("LD_LIBRARY_PATH", ""),
    }
    nvml_before: dict[int, int] | None = None
    nvml: Nvml | None = None
    if want_cuda:
        try:
            nvml = Nvml()
            nvml_before = {i: nvml.used_bytes(i) for i in range(nvml.count())}
            report["nvml"] = "ok"
        except (OSError, AttributeError) as exc:
            report["nvml"] = _step_error(exc)
            nvml = None
    start = time.perf_counter()
    try:
        import torch
    except BaseException as exc:  # ImportError, OSError, undefined symbol...: the message is the finding
        report["import"] = {
            "ok": False,
            **_step_error(exc),
            "traceback": traceback.format_exc().splitlines()[-6:],
        }
        report["libraries"] = {"loaded": read_loaded(), "versions": {}}
        report["seconds"] = round(time.perf_counter() - start, 3)
        print(json.dumps(report))
        return 0
    report["import"] = {"ok": True, "seconds": round(time.perf_counter() - start, 3)}
    report["torch"] = torch_facts(torch)
    if want_cuda:
        try:
            report["cuda"] = cuda_steps(torch, nvml, nvml_before)
        except Exception as exc:
            report["cuda"] = {"available": False, "reason": "CUDA init failed", **_step_error(exc)}
    else:
        report["cuda"] = {"available": False, "reason": "skipped (--no-cuda)"}
    loaded = read_loaded()
    report["libraries"] = {"loaded": loaded, "versions": loaded_versions(loaded)}
    if want_flex:
        device = "cuda:0" if report["cuda"].get("available") else "cpu"  # type: ignore[attr-defined]
        try:
            report["flex"] = flex_proof(torch, device)
        except Exception as exc:
            report["flex"] = {
                "status": "error",
                **_step_error(exc),
                "traceback": traceback.format_exc().splitlines()[-8:],
            }
        report["libraries"]["loaded"] = read_loaded()  # type: ignore[index]
    else:
        report["flex"] = {"status": "skipped", "reason": "skipped (--no-flex)"}
    report["seconds"] = round(time.perf_counter() - start, 3)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
