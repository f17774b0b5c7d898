"""The known-good environment, recorded: what `dflash-doctor lock` writes and `check --lock` compares.

"The same torch version" is not the same build: the lock keeps what tells builds apart (git commit,
WHEEL build tag, the sha256 of RECORD and of every library torch resolves to), so a later `diff`
can say exactly what changed. The file is JSON with sorted keys (readable, diffable), written atomically.

`build_lock` is pure (facts in, lock out); `capture_lock` gathers the facts; `read_lock`/`write_lock`
do the file I/O. Environment variables are this process's: with `--python` the audited interpreter
runs as our child and inherits them, so they are the ones it will see.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dflash_base.atomic import write_json_atomic
from dflash_base.errors import DoctorError
from dflash_doctor import __version__
from dflash_doctor.env.environment import Environment
from dflash_doctor.env.file_hashes import HashCache
from dflash_doctor.env.gpus import GpuInventory

LOCK_SCHEMA = "dflash-doctor/lock/v1"
LOCK_SCHEMA_PREFIX = "dflash-doctor/lock/"
DEFAULT_LOCK_NAME = "dflash.lock"

ENV_PREFIXES = ("TORCH", "TRITON", "NCCL", "CUDA", "LD_")  # TORCH also covers TORCHINDUCTOR*, TORCHDYNAMO*
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL", "AUTH")
NOT_SECRET = frozenset({"TORCH_COMPILE_CACHE_KEY_TAG"})  # a cache salt, and drift in it matters
REDACTED = "<redacted>"
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")

LIBRARIES_UNAVAILABLE = "static library model unavailable"


@dataclass
class EnvironmentLock:
    """One environment's identity. Every section is plain JSON; `created` is never compared."""

    python: dict[str, Any]
    distributions: dict[str, dict[str, Any]]
    torch: dict[str, Any] | None
    triton: dict[str, Any] | None
    libraries: dict[str, dict[str, Any]] | None  # soname -> {path, sha256, owners}; None: not modelled
    libraries_note: str | None
    driver: dict[str, Any] | None
    gpus: list[dict[str, Any]]
    environment: dict[str, str]
    runtime: dict[str, Any] = field(default_factory=dict)  # from `lock --deep`: context overhead, versions
    created: str = ""
    tool: str = __version__
    schema: str = LOCK_SCHEMA

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "tool": self.tool,
            "created": self.created,
            "python": self.python,
            "distributions": self.distributions,
            "torch": self.torch,
            "triton": self.triton,
            "libraries": self.libraries,
            "libraries_note": self.libraries_note,
            "driver": self.driver,
            "gpus": self.gpus,
            "environment": self.environment,
            "runtime": self.runtime,
        }

    @classmethod
    def from_json(cls, data: Any) -> EnvironmentLock:
        """Validated section by section: a wrong-typed field is a LockShapeError naming it."""
        if not isinstance(data, dict):
            raise LockShapeError(f"not a JSON object but a {type(data).__name__}")
        schema = data.get("schema")
        if schema != LOCK_SCHEMA:
            if isinstance(schema, str) and schema.startswith(LOCK_SCHEMA_PREFIX):
                raise NewerLockError(schema)
            raise LockShapeError(f"schema {schema!r}, expected {LOCK_SCHEMA!r}")
        check_lock_shape(data)
        return cls(
            python=dict(data["python"]),
            distributions=dict(data["distributions"]),
            torch=data.get("torch"),
            triton=data.get("triton"),
            libraries=data.get("libraries"),
            libraries_note=data.get("libraries_note"),
            driver=data.get("driver"),
            gpus=list(data.get("gpus") or []),
            environment=dict(data.get("environment") or {}),
            runtime=dict(data.get("runtime") or {}),
            created=str(data.get("created", "")),
            tool=str(data.get("tool", "")),
        )


class LockShapeError(ValueError):
    """The file is JSON but not a lock of this schema: the message names the field."""


class NewerLockError(ValueError):
    """A lock of a later schema than this version reads."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        super().__init__(f"schema {schema!r}; this dflash-doctor {__version__} reads {LOCK_SCHEMA!r}")


# Each section: the JSON types it may hold, whether it may be null, and the type of its values.
_SECTIONS: dict[str, tuple[type, bool, type | None]] = {
    "python": (dict, False, None),
    "distributions": (dict, False, dict),
    "torch": (dict, True, None),
    "triton": (dict, True, None),
    "libraries": (dict, True, dict),
    "libraries_note": (str, True, None),
    "driver": (dict, True, None),
    "gpus": (list, True, dict),
    "environment": (dict, True, str),
    "runtime": (dict, True, None),
    "created": (str, True, None),
    "tool": (str, True, None),
}


def check_lock_shape(data: dict[str, Any]) -> None:
    """Every section of the type the differ expects (a list where a table belongs: named, not a crash)."""
    for name in ("python", "distributions"):
        if name not in data:
            raise LockShapeError(f"no {name!r} section")
    for name, (kind, nullable, values) in _SECTIONS.items():
        value = data.get(name)
        if value is None and (nullable or name not in data):
            continue
        if not isinstance(value, kind):
            raise LockShapeError(f"{name!r} must be a JSON {_JSON_NAMES[kind]}, got {json.dumps(value)[:60]}")
        items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        if values is not None and any(not isinstance(item, values) for item in items):
            raise LockShapeError(f"every entry of {name!r} must be a JSON {_JSON_NAMES[values]}")


_JSON_NAMES: dict[type, str] = {dict: "object", list: "array", str: "string"}


# --- redaction -----------------------------------------------------------------------------------


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return upper not in NOT_SECRET and any(word in upper for word in SECRET_WORDS)


def redact_value(value: str) -> str:
    """Drop userinfo from URLs (`redis://user:pw@host` -> `redis://<redacted>@host`)."""
    return _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", value)


def relevant_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """TORCH*, TORCHINDUCTOR*, TRITON*, NCCL*, CUDA*, LD_* variables, secrets redacted."""
    picked = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIXES):
            continue
        picked[name] = REDACTED if is_secret_name(name) else redact_value(value)
    return dict(sorted(picked.items()))


# --- building the lock ---------------------------------------------------------------------------


def record_digest(record_path: str) -> str | None:
    """sha256 of a RECORD's rows for files inside site-packages, sorted.

    Not the raw file: rows for `../../../bin/*` scripts hash a shebang that names the venv's own
    python, and `__pycache__` rows depend on the installer's compile setting, so the raw RECORD of
    one wheel differs between two venvs. What is left changes exactly when the installed files do.
    """
    try:
        with open(record_path, newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
    except OSError:
        return None
    kept = sorted(
        ",".join(row[:3])
        for row in rows
        if row
        and row[0]
        and not row[0].startswith("..")
        and "__pycache__" not in row[0]
        and not row[0].endswith(".dist-info/RECORD")
    )
    return hashlib.sha256("\n".join(kept).encode()).hexdigest()


def distribution_rows(env: Environment) -> dict[str, dict[str, Any]]:
    rows = {}
    for key, dist in sorted(env.distributions.items()):
        rows[key] = {
            "name": dist.name,
            "version": dist.version,
            "wheel_tags": list(dist.wheel_tags),
            "wheel_build": dist.wheel_build,
            "installer": dist.installer,
            "record_sha256": record_digest(os.path.join(dist.dist_info, "RECORD")),
        }
    return rows


def build_lock(
    env: Environment,
    libraries: dict[str, dict[str, Any]] | None,
    gpus: GpuInventory | None,
    environ: Mapping[str, str],
    libraries_note: str | None = None,
    runtime: dict[str, Any] | None = None,
    created: str | None = None,
) -> EnvironmentLock:
    """Pure apart from reading dist-info RECORDs: the lock for these facts."""
    interp = env.interpreter
    build = env.torch
    torch = None
    if build is not None:
        torch = {
            "version": build.version,
            "local_tag": build.local_tag,
            "git_version": build.git_version,
            "cuda": build.cuda,
            "hip": build.hip,
        }
    triton_dist = env.get("triton")
    triton = {"version": triton_dist.version} if triton_dist is not None else None
    driver = None
    gpu_rows: list[dict[str, Any]] = []
    if gpus is not None:
        driver = {"version": gpus.driver_version, "cuda": gpus.cuda_driver}
        gpu_rows = [
            {"index": d.index, "name": d.name, "capability": list(d.capability), "total_bytes": d.total_bytes}
            for d in gpus.host  # the machine's GPUs; CUDA_VISIBLE_DEVICES is in `environment`
        ]
    return EnvironmentLock(
        python={
            "version": interp.version,
            "implementation": interp.implementation,
            "machine": interp.machine,
            "executable": interp.executable,
        },
        distributions=distribution_rows(env),
        torch=torch,
        triton=triton,
        libraries=libraries,
        libraries_note=libraries_note,
        driver=driver,
        gpus=gpu_rows,
        environment=relevant_environment(environ),
        runtime=runtime or {},
        created=created if created is not None else datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


SITE = "<site>"


def site_relative(path: str, site_dirs: list[str]) -> str:
    """`<site>/torch/lib/libc10.so` for a file inside site-packages, so a moved venv is no change."""
    for site_dir in site_dirs:
        root = os.path.realpath(site_dir).rstrip(os.sep) + os.sep
        if path.startswith(root):
            return f"{SITE}/{path[len(root) :]}"
    return path


def hash_libraries(
    by_soname: Mapping[str, Any],
    owners_of: Callable[[str], list[str]],
    digest: Callable[[str], str | None],
    site_dirs: list[str] = [],  # noqa: B006 (read only)
) -> dict[str, dict[str, Any]]:
    """soname -> {path, location, sha256, owners} for every library the static model resolved.

    `path` is the absolute real path (evidence); `location` is what drift compares.
    """
    rows: dict[str, dict[str, Any]] = {}
    for soname, resolution in sorted(by_soname.items()):
        path = getattr(resolution, "path", None)
        if not path:
            rows[soname] = {"path": None, "location": None, "sha256": None, "owners": []}
            continue
        real = os.path.realpath(path)
        rows[soname] = {
            "path": real,
            "location": site_relative(real, site_dirs),
            "sha256": digest(real),
            "owners": sorted(owners_of(path)),
        }
    return rows


def _digest_function() -> tuple[Callable[[str], str | None], Callable[[], None]]:
    """The shared hash cache: a warm run only stats files."""
    cache = HashCache.load()
    return cache.digest, cache.save


def library_hashes(ctx: Any) -> tuple[dict[str, dict[str, Any]] | None, str | None]:
    """(rows, None) from the static library model, or (None, reason) when it is not available."""
    try:
        from dflash_doctor.libs.loader import library_report
    except ImportError:
        return None, LIBRARIES_UNAVAILABLE
    report = library_report(ctx)
    digest, save = _digest_function()
    rows = hash_libraries(report.by_soname, ctx.env.owners_of, digest, ctx.env.interpreter.site_dirs)
    with contextlib.suppress(OSError):
        save()
    return rows, None


def capture_lock(ctx: Any, runtime: dict[str, Any] | None = None) -> EnvironmentLock:
    """The lock of the environment a check context audits (memoise with ctx.shared("lock.current"))."""
    from dflash_doctor.env.gpus import query_gpus

    libraries, note = library_hashes(ctx)
    return build_lock(ctx.env, libraries, query_gpus(), os.environ, note, runtime)


def current_lock(ctx: Any) -> EnvironmentLock:
    """This environment as a lock, computed once per check run (drift, the probe key, the run record)."""
    return ctx.shared("lock.current", lambda: capture_lock(ctx))


# --- file I/O ------------------------------------------------------------------------------------


def write_lock(lock: EnvironmentLock, path: str | os.PathLike[str]) -> Path:
    """Atomic; readable by the group like any file the user writes (the lock holds no secrets)."""
    written = write_json_atomic(path, lock.to_json())
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(written, 0o666 & ~umask)
    return written


def read_lock(path: str | os.PathLike[str]) -> EnvironmentLock:
    """Raises DoctorError (exit 2) with what to do when the file is missing, not JSON, not a lock, or a
    lock of a newer schema."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise DoctorError(
            f"lock {path}: cannot read it ({exc.strerror})", hint="create one with `dflash-doctor lock`"
        ) from exc
    try:
        return EnvironmentLock.from_json(json.loads(raw.decode("utf-8")))
    except NewerLockError as exc:
        raise DoctorError(
            f"lock {path}: made by a newer version of dflash-doctor ({exc})",
            hint="upgrade dflash-doctor (pip install -U dflash-doctor), or re-create the lock with this one",
        ) from exc
    except UnicodeDecodeError as exc:
        raise DoctorError(
            f"lock {path}: not a dflash-doctor lock (not UTF-8 text: a binary file?)",
            hint="re-create it with `dflash-doctor lock`",
        ) from exc
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DoctorError(
            f"lock {path}: not a dflash-doctor lock ({exc})", hint="re-create it with `dflash-doctor lock`"
        ) from exc
