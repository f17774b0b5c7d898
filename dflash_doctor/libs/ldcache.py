"""The system loader's own knowledge: `/etc/ld.so.cache` and the default library folders.

These are the last two places glibc looks for a soname, after RPATH, `LD_LIBRARY_PATH` and
RUNPATH. We read the cache file directly (glibc 2.32+ "new" format, a few ms); when it cannot be
parsed we fall back to `ldconfig -p`. Tests pass their own `LdCache`, so nothing here is global.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field

CACHE_FILE = "/etc/ld.so.cache"
DEFAULT_DIRS: tuple[str, ...] = (
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
)

_NEW_MAGIC = b"glibc-ld.so.cache1.1"
_OLD_MAGIC = b"ld.so-1.7.0"
_HEADER = struct.Struct("<20sIIB3xI3I")  # magic+version, nlibs, len_strings, flags, extension, unused
_ENTRY = struct.Struct("<iIIIQ")  # flags, key, value, osversion, hwcap
# flags & 0xff00 is the architecture; 64-bit x86 and arm are the ones torch wheels exist for.
_ARCH_FLAGS = {"x86_64": 0x0300, "aarch64": 0x0A00}
_LDCONFIG_LINE = re.compile(r"^\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)\s*$")


@dataclass(frozen=True)
class LdCache:
    """soname -> path as `ld.so.cache` lists it (first entry wins), plus the default folders."""

    entries: Mapping[str, str] = field(default_factory=dict)
    default_dirs: tuple[str, ...] = DEFAULT_DIRS
    source: str = "empty"

    def lookup(self, soname: str) -> str | None:
        return self.entries.get(soname)


def parse_cache_bytes(data: bytes, machine: str = "x86_64") -> dict[str, str]:
    """Parse the glibc 2.32+ cache format (also found after an old-format prefix)."""
    start = data.find(_NEW_MAGIC)
    if start < 0:
        raise ValueError("no glibc-ld.so.cache1.1 header")
    _magic, nlibs, _len_strings, _flags, _ext, *_ = _HEADER.unpack_from(data, start)
    want_arch = _ARCH_FLAGS.get(machine)
    entries: dict[str, str] = {}
    offset = start + _HEADER.size
    for _ in range(nlibs):
        flags, key, value, _os, _hwcap = _ENTRY.unpack_from(data, offset)
        offset += _ENTRY.size
        if want_arch is not None and (flags & 0xFF00) != want_arch:
            continue
        name, path = _c_string(data, start + key), _c_string(data, start + value)
        entries.setdefault(name, path)
    return entries


def _c_string(data: bytes, at: int) -> str:
    end = data.index(b"\0", at)
    return data[at:end].decode("utf-8", "replace")


def parse_ldconfig_output(text: str, machine: str = "x86_64") -> dict[str, str]:
    """Parse `ldconfig -p`: `libz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1`."""
    arch_word = {"x86_64": "x86-64", "aarch64": "AArch64"}.get(machine)
    entries: dict[str, str] = {}
    for line in text.splitlines():
        match = _LDCONFIG_LINE.match(line)
        if not match:
            continue
        name, flags, path = match.groups()
        if arch_word is not None and arch_word not in flags:
            continue
        entries.setdefault(name, path)
    return entries


def load_system_cache(path: str = CACHE_FILE, machine: str | None = None) -> LdCache:
    """The running system's cache; an empty one when there is none (containers often lack it)."""
    arch = machine or os.uname().machine
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        if data.startswith(_OLD_MAGIC) or data.startswith(_NEW_MAGIC):
            return LdCache(parse_cache_bytes(data, arch), source=path)
    except (OSError, ValueError, struct.error):
        pass
    ldconfig = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), None
    )
    if ldconfig:
        try:
            done = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=10, check=False)
            return LdCache(parse_ldconfig_output(done.stdout, arch), source=f"{ldconfig} -p")
        except (OSError, subprocess.TimeoutExpired):
            pass
    return LdCache()
