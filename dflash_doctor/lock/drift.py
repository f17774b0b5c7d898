"""What changed between two environment locks: pure, so `diff`, `check --lock` and tests share it.

Severity follows the story: a different build behind the same version string (git commit, WHEEL
build, RECORD or library bytes) is a fail, because nothing else will tell you; a changed version is
a warning (you did it on purpose, or pip did); a library whose bytes changed is a fail whatever the
reason: the lock says which bytes worked. A lock diffed with itself yields nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dflash_doctor.findings import Severity
from dflash_doctor.lock.lockfile import EnvironmentLock

CONTEXT_GROWTH_MIB = 64.0  # CUDA context growth worth a warning (the story's wheel switch: ~200 MB)


@dataclass(frozen=True)
class Change:
    kind: str  # dotted: package.version, torch.commit, library.hash, env.changed, ...
    subject: str  # the package, soname, variable or device it is about
    before: Any
    after: Any
    severity: Severity
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["severity"] = self.severity.value
        return data

    @property
    def summary(self) -> str:
        text = f"{self.subject}: {_show(self.before)} -> {_show(self.after)}"
        return f"{text} ({self.note})" if self.note else text


def _show(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12]  # a sha256
    return str(value)


def diff_locks(before: EnvironmentLock, after: EnvironmentLock) -> list[Change]:
    """Every difference that matters, most severe first, then by kind and subject."""
    changes = [
        *_python(before.python, after.python),
        *_torch(before.torch, after.torch),
        *_packages(before.distributions, after.distributions),
        *_libraries(before, after),
        *_driver_and_gpus(before, after),
        *_environment(before.environment, after.environment),
        *_runtime(before.runtime, after.runtime),
    ]
    return sorted(changes, key=lambda c: (-c.severity.rank, c.kind, c.subject))


def _python(a: Mapping[str, Any], b: Mapping[str, Any]) -> Iterator[Change]:
    for key in ("version", "implementation", "machine"):
        if a.get(key) != b.get(key):
            yield Change(f"python.{key}", "python", a.get(key), b.get(key), Severity.WARN)


def _torch(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> Iterator[Change]:
    if a is None or b is None:
        if a != b:
            yield Change("torch.presence", "torch", _torch_label(a), _torch_label(b), Severity.FAIL)
        return
    same_version = a.get("version") == b.get("version")
    if not same_version:
        yield Change("torch.version", "torch", a.get("version"), b.get("version"), Severity.WARN)
    if a.get("git_version") != b.get("git_version"):
        yield Change(
            "torch.commit",
            "torch",
            a.get("git_version"),
            b.get("git_version"),
            Severity.FAIL if same_version else Severity.WARN,
            "same version string, another build" if same_version else "",
        )
    if a.get("cuda") != b.get("cuda"):
        yield Change("torch.cuda", "torch", a.get("cuda"), b.get("cuda"), Severity.WARN)


def _torch_label(t: Mapping[str, Any] | None) -> str | None:
    return None if t is None else f"{t.get('version')} ({t.get('git_version')})"


def _packages(a: Mapping[str, Mapping[str, Any]], b: Mapping[str, Mapping[str, Any]]) -> Iterator[Change]:
    for key in sorted(a.keys() - b.keys()):
        yield Change("package.removed", key, a[key].get("version"), None, Severity.WARN)
    for key in sorted(b.keys() - a.keys()):
        yield Change("package.added", key, None, b[key].get("version"), Severity.WARN)
    for key in sorted(a.keys() & b.keys()):
        old, new = a[key], b[key]
        if old.get("version") != new.get("version"):
            if key == "torch":
                continue  # reported once, with its local tag and commit, by _torch
            yield Change("package.version", key, old.get("version"), new.get("version"), Severity.WARN)
            continue
        same = "same version, another build"
        if old.get("wheel_build") != new.get("wheel_build"):
            yield Change(
                "package.build", key, old.get("wheel_build"), new.get("wheel_build"), Severity.FAIL, same
            )
        if old.get("wheel_tags") != new.get("wheel_tags"):
            yield Change(
                "package.wheel_tag", key, old.get("wheel_tags"), new.get("wheel_tags"), Severity.FAIL, same
            )
        if old.get("record_sha256") != new.get("record_sha256"):
            other_installer = old.get("installer") != new.get("installer")
            yield Change(
                "package.record",
                key,
                old.get("record_sha256"),
                new.get("record_sha256"),
                Severity.WARN if other_installer else Severity.FAIL,
                f"reinstalled with {new.get('installer')} instead of {old.get('installer')}"
                if other_installer
                else "same version, other files",
            )
        elif old.get("installer") != new.get("installer"):
            yield Change("package.installer", key, old.get("installer"), new.get("installer"), Severity.WARN)


def _libraries(a: EnvironmentLock, b: EnvironmentLock) -> Iterator[Change]:
    if a.libraries is None or b.libraries is None:
        return  # one side had no static library model: nothing to compare, not a change
    for soname in sorted(a.libraries.keys() | b.libraries.keys()):
        old, new = a.libraries.get(soname), b.libraries.get(soname)
        if old is None or new is None:
            gone = new is None or not new.get("path")
            yield Change(
                "library.removed" if new is None else "library.added",
                soname,
                None if old is None else old.get("path"),
                None if new is None else new.get("path"),
                Severity.FAIL if gone and old and old.get("path") else Severity.WARN,
            )
            continue
        if old.get("path") and not new.get("path"):
            yield Change(
                "library.unresolved", soname, old.get("path"), None, Severity.FAIL, "no longer resolves"
            )
            continue
        moved = _location(old) != _location(new)
        if old.get("sha256") != new.get("sha256"):
            owned = bool(old.get("owners") or new.get("owners"))
            yield Change(
                "library.hash",
                soname,
                old.get("sha256"),
                new.get("sha256"),
                Severity.FAIL if owned else Severity.WARN,
                f"{old.get('path')} -> {new.get('path')}" if moved else str(new.get("path")),
            )
        elif moved:
            yield Change(
                "library.path", soname, old.get("path"), new.get("path"), Severity.WARN, "same bytes"
            )
        if old.get("owners") != new.get("owners"):
            yield Change("library.owner", soname, old.get("owners"), new.get("owners"), Severity.WARN)


def _location(row: Mapping[str, Any]) -> Any:
    """Where a library lives relative to its site-packages (locks before `location` existed: the path)."""
    return row.get("location", row.get("path"))


def _driver_and_gpus(a: EnvironmentLock, b: EnvironmentLock) -> Iterator[Change]:
    old_driver, new_driver = a.driver or {}, b.driver or {}
    for key in ("version", "cuda"):
        if old_driver.get(key) != new_driver.get(key):
            yield Change(f"driver.{key}", "driver", old_driver.get(key), new_driver.get(key), Severity.WARN)
    old_gpus = [(g.get("name"), g.get("capability")) for g in a.gpus]
    new_gpus = [(g.get("name"), g.get("capability")) for g in b.gpus]
    if old_gpus != new_gpus:
        yield Change("gpu.inventory", "gpus", _gpu_text(old_gpus), _gpu_text(new_gpus), Severity.WARN)


def _gpu_text(gpus: list[tuple[Any, Any]]) -> str:
    return ", ".join(f"{name} (sm {cap})" for name, cap in gpus) or "none"


def _environment(a: Mapping[str, str], b: Mapping[str, str]) -> Iterator[Change]:
    for name in sorted(a.keys() | b.keys()):
        if a.get(name) != b.get(name):
            kind = "env.added" if name not in a else "env.removed" if name not in b else "env.changed"
            yield Change(kind, name, a.get(name), b.get(name), Severity.WARN)


def _runtime(a: Mapping[str, Any], b: Mapping[str, Any]) -> Iterator[Change]:
    """Only when both locks were taken with `--deep`: CUDA context overhead and loaded versions."""
    old_ctx, new_ctx = a.get("context_overhead_mib") or {}, b.get("context_overhead_mib") or {}
    for device in sorted(old_ctx.keys() & new_ctx.keys()):
        growth = float(new_ctx[device]) - float(old_ctx[device])
        if growth > CONTEXT_GROWTH_MIB:
            yield Change(
                "runtime.context_overhead",
                f"cuda:{device}",
                old_ctx[device],
                new_ctx[device],
                Severity.WARN,
                f"+{growth:.0f} MiB per process on this GPU",
            )
    old_v, new_v = a.get("loaded_versions") or {}, b.get("loaded_versions") or {}
    for lib in sorted(old_v.keys() & new_v.keys()):
        if old_v[lib] != new_v[lib]:
            yield Change("runtime.loaded_version", lib, old_v[lib], new_v[lib], Severity.WARN)


def worst_severity(changes: list[Change]) -> Severity:
    return max((c.severity for c in changes), key=lambda s: s.rank, default=Severity.OK)
