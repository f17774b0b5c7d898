"""Pure reading of a deep-probe report against the static model: no processes, no files.

- `explain_import_error`: turn "cannot open shared object file" / "undefined symbol" into which
  distribution to reinstall or which twin to remove, using the file owners of the environment.
- `duplicate_families`: one library mapped from two files (two NCCLs in one process).
- `static_disagreements`: the process mapped another file than the static loader model predicted.
- `version_verdicts`: the loaded library's own version against what torch was compiled with.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dflash_doctor.findings import Severity

_MISSING_SONAME = re.compile(r"(?P<soname>lib[\w+.-]+?\.so[\w.]*): cannot open shared object file")
_UNDEFINED = re.compile(
    r"(?:(?P<requester>/\S+?):\s*)?undefined symbol:\s*(?P<symbol>[\w@.]+)(?:, version (?P<version>\S+))?"
)

# Which library a missing symbol belongs to, by prefix.
SYMBOL_FAMILIES = (
    ("nccl", "libnccl"),
    ("cudnn", "libcudnn"),
    ("cublasLt", "libcublasLt"),
    ("cublas", "libcublas"),
    ("cusparseLt", "libcusparseLt"),
    ("cusparse", "libcusparse"),
    ("__nvJitLink", "libnvJitLink"),
    ("nvJitLink", "libnvJitLink"),
    ("cufft", "libcufft"),
    ("curand", "libcurand"),
    ("cusolver", "libcusolver"),
    ("cuda", "libcudart"),
    ("nvshmem", "libnvshmem_host"),
)

# CUDA libraries whose second copy in one process is a real fault, not a curiosity.
CUDA_FAMILIES = frozenset(
    {
        "libnccl",
        "libcudnn",
        "libcublas",
        "libcublasLt",
        "libcudart",
        "libcusparse",
        "libcusparseLt",
        "libnvJitLink",
        "libcufft",
        "libcurand",
        "libcusolver",
        "libnvrtc",
        "libcupti",
        "libnvshmem_host",
        "libcuda",
        "libcufile",
    }
)


@dataclass(frozen=True)
class ImportExplanation:
    summary: str
    remedy: str | None
    evidence: dict[str, Any]


def library_family(path: str) -> str:
    """`/x/libnccl.so.2.28.9` -> `libnccl` (the probe child uses the same rule)."""
    return os.path.basename(path).split(".so", 1)[0]


def _files_named(owners: Mapping[str, list[str]], family: str) -> dict[str, list[str]]:
    """Files in the environment's RECORDs that belong to a library family -> their owners."""
    return {path: dists for path, dists in owners.items() if library_family(path) == family and ".so" in path}


def explain_import_error(
    message: str,
    owners: Mapping[str, list[str]],
    python: str,
    predicted: Mapping[str, str | None] | None = None,
    versions: Mapping[str, str] | None = None,
) -> ImportExplanation:
    """Why `import torch` failed, in terms of files and the distributions that own them.

    `owners`: absolute path -> distribution keys (`Environment.owners`); `predicted`: soname -> path
    the static model resolves it to (None when it found nothing); `versions`: distribution -> version,
    to pin the reinstall to what is installed.
    """
    pinned = {**(versions or {})}
    pip = f"{python} -m pip"
    missing = _MISSING_SONAME.search(message)
    if missing:
        soname = missing.group("soname")
        listed = {p: d for p, d in owners.items() if os.path.basename(p) == soname}
        gone = {p: d for p, d in listed.items() if not os.path.exists(p)}
        evidence: dict[str, Any] = {"soname": soname, "message": message}
        if predicted is not None:
            evidence["static_model"] = predicted.get(soname) or "resolves nowhere"
        if gone:
            dists = sorted({d for ds in gone.values() for d in ds})
            evidence["listed_but_deleted"] = sorted(gone)
            specs = " ".join(f"{d}=={pinned[d]}" if d in pinned else d for d in dists)
            return ImportExplanation(
                f"{soname} is missing: {', '.join(dists)} lists it in RECORD but the file was deleted "
                "(uninstalling another package that installs the same path does this)",
                f"{pip} install --force-reinstall --no-deps {specs}",
                evidence,
            )
        if listed:
            dists = sorted({d for ds in listed.values() for d in ds})
            evidence["installed_at"] = sorted(listed)
            return ImportExplanation(
                f"{soname} is installed by {', '.join(dists)} but the loader does not search there",
                "unset LD_LIBRARY_PATH; dflash-doctor check --only libs  # shows every folder searched",
                evidence,
            )
        return ImportExplanation(
            f"{soname} is installed by no distribution of this environment: its provider was uninstalled",
            "dflash-doctor why " + soname + f"  # then {pip} install the provider torch requires",
            evidence,
        )
    undefined = _UNDEFINED.search(message)
    if undefined:
        symbol, version = undefined.group("symbol"), undefined.group("version")
        family = next((fam for prefix, fam in SYMBOL_FAMILIES if symbol.startswith(prefix)), None)
        evidence = {"symbol": symbol, "requester": undefined.group("requester"), "message": message}
        if version:
            evidence["symbol_version"] = version
        if family is None:
            return ImportExplanation(
                f"undefined symbol {symbol}: a library older than torch expects", None, evidence
            )
        copies = _files_named(owners, family)
        evidence["copies"] = {p: d for p, d in sorted(copies.items())}
        claimants = sorted({d for ds in copies.values() for d in ds})
        twins = [p for p, ds in copies.items() if len(ds) > 1]
        if twins or len(claimants) > 1:
            return ImportExplanation(
                f"undefined symbol {symbol}: {family} is claimed by {', '.join(claimants)} (twins that "
                "overwrite each other's files); the surviving file is older than torch needs",
                None,  # which twin goes depends on who requires what: ownership.twins computes it
                {**evidence, "see": "ownership.twins (its remedy uninstalls the twin nothing requires)"},
            )
        return ImportExplanation(
            f"undefined symbol {symbol}: the {family} that was loaded is older than the one torch was built "
            "against (an LD_LIBRARY_PATH folder or a system copy came first?)",
            "unset LD_LIBRARY_PATH  # then: dflash-doctor check --deep",
            evidence,
        )
    return ImportExplanation(
        f"import torch failed: {message.splitlines()[0] if message else 'no message'}", None, {}
    )


def duplicate_families(loaded: Iterable[str]) -> dict[str, list[str]]:
    """Library families mapped from more than one file (by real path)."""
    by_family: dict[str, set[str]] = defaultdict(set)
    for path in loaded:
        if os.path.basename(path).startswith("lib"):
            by_family[library_family(path)].add(os.path.realpath(path))
    return {fam: sorted(paths) for fam, paths in sorted(by_family.items()) if len(paths) > 1}


@dataclass(frozen=True)
class Disagreement:
    soname: str
    predicted: str
    loaded: str | None  # None: the process mapped no file of that name


def static_disagreements(
    predicted: Mapping[str, str], loaded: Iterable[str], realpath: Callable[[str], str] = os.path.realpath
) -> list[Disagreement]:
    """For each soname the static model resolved: did the process map that very file?

    A soname whose file the process did not map at all is not counted (torch loads some libraries
    lazily, e.g. on first cuDNN use); a soname mapped from another file is.
    """
    mapped = [realpath(p) for p in loaded]
    mapped_set = set(mapped)
    out = []
    for soname, path in sorted(predicted.items()):
        want = realpath(path)
        if want in mapped_set:
            continue
        same_name = [
            m for m in mapped if os.path.basename(m) == soname or os.path.basename(m).startswith(soname + ".")
        ]
        if same_name:
            out.append(Disagreement(soname, want, same_name[0]))
    return out


@dataclass(frozen=True)
class VersionVerdict:
    library: str
    loaded: list[int] | None
    compiled: list[int] | None
    severity: Severity
    note: str
    path: str | None = None
    what: str = "version"  # or "cuda_build": the CUDA the library was built for against torch's


def _cuda_compiled(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(p) for p in text.split(".")[:2]]
    except ValueError:
        return None


def version_verdicts(
    torch: Mapping[str, Any], versions: Mapping[str, Mapping[str, Any]]
) -> list[VersionVerdict]:
    """The loaded libraries' own versions against torch's compile-time ones (REFERENCE.md section 2)."""
    verdicts = []
    pairs = (
        ("cudnn", torch.get("cudnn_compiled")),
        ("nccl", torch.get("nccl_compiled")),
        ("cudart", _cuda_compiled(torch.get("cuda"))),
    )
    for family, compiled in pairs:
        entry = versions.get(family) or {}
        loaded = entry.get("parsed")
        if loaded is None or compiled is None:
            continue
        loaded, compiled = [int(x) for x in loaded], [int(x) for x in compiled]
        verdicts.append(_compare(family, loaded, compiled, entry.get("path")))
    return verdicts + cuda_build_verdicts(torch, versions)


def cuda_build_verdicts(
    torch: Mapping[str, Any], versions: Mapping[str, Mapping[str, Any]]
) -> list[VersionVerdict]:
    """Each loaded library's CUDA build (`cuda_build`: cuDNN's `cudnnGetCudartVersion`, cuBLAS's
    `cublasGetCudartVersion`, NCCL's version string) against torch's CUDA: another major is a
    cross-family load (a CUDA 13 cuDNN in a CUDA 12.8 process), whatever its own version says."""
    process = _cuda_compiled(torch.get("cuda"))
    if process is None:
        return []
    verdicts = []
    for family, entry in sorted(versions.items()):
        built = entry.get("cuda_build")
        if not built:
            continue
        built = [int(x) for x in built]
        source = entry.get("cuda_build_from", "?")
        if built[0] != process[0]:
            note = f"built for CUDA {built[0]} ({source}) in a CUDA {process[0]} process: a cross-family load"
            severity = Severity.FAIL
        else:
            note = f"built for CUDA {'.'.join(map(str, built))} ({source})"
            severity = Severity.OK
        verdicts.append(
            VersionVerdict(family, built, process, severity, note, entry.get("path"), "cuda_build")
        )
    return verdicts


def _compare(family: str, loaded: list[int], compiled: list[int], path: str | None) -> VersionVerdict:
    if loaded[0] != compiled[0]:
        return VersionVerdict(family, loaded, compiled, Severity.FAIL, "another major version", path)
    if loaded[:2] < compiled[:2]:
        note = "older minor than torch was compiled against"
        if family == "cudnn":
            note = (
                f"cuDNN version incompatibility: PyTorch was compiled against {tuple(compiled)} "
                f"but found runtime version {tuple(loaded)}"
            )
        return VersionVerdict(family, loaded, compiled, Severity.FAIL, note, path)
    if loaded < compiled:
        return VersionVerdict(
            family,
            loaded,
            compiled,
            Severity.WARN,
            "older patch level than torch reports (torch reports its compile-time version)",
            path,
        )
    return VersionVerdict(family, loaded, compiled, Severity.OK, "matches or newer", path)
