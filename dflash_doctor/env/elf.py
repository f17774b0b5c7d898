"""What the dynamic loader reads from a shared object: soname, NEEDED, RPATH, RUNPATH.

We read only the PT_DYNAMIC segment with pyelftools (never the symbol tables), so a 500 MB
`libtorch_cuda.so` costs a few milliseconds. Search paths are returned with `$ORIGIN`, `$LIB`
and `$PLATFORM` expanded the way glibc's `_dl_dst_substitute` does.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

from dflash_doctor.env.parse_cache import stamp_of

if TYPE_CHECKING:  # pyelftools is imported on the first file actually parsed (20 ms)
    from elftools.elf.dynamic import DynamicTag
    from elftools.elf.elffile import ELFFile

    from dflash_doctor.env.parse_cache import ParseCache

_ELF_MAGIC = b"\x7fELF"
_DST = re.compile(r"\$(\{(ORIGIN|LIB|PLATFORM)\}|(ORIGIN|LIB|PLATFORM)(?![A-Za-z0-9_]))")


@dataclass(frozen=True)
class ElfInfo:
    """The dynamic-section facts of one ELF file that decide how its dependencies are found.

    ``rpath`` and ``runpath`` are already expanded (absolute folders, in search order).
    ``machine`` is pyelftools' name (``EM_X86_64``); ``elf_class`` is 32 or 64.
    """

    path: str
    soname: str | None
    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]
    machine: str
    elf_class: int

    @property
    def name(self) -> str:
        """The name other objects use to find this one: its soname, else its file name."""
        return self.soname or os.path.basename(self.path)


def default_lib_dir(elf_class: int) -> str:
    """What `$LIB` expands to: glibc's build-time choice; `lib64` on 64-bit x86 and arm distros."""
    return "lib64" if elf_class == 64 else "lib"


def default_platform(machine: str) -> str:
    """What `$PLATFORM` expands to (AT_PLATFORM): the machine name, e.g. `x86_64`."""
    return machine or os.uname().machine


def expand_search_path(
    value: str, origin: str, lib: str = "lib64", platform: str | None = None
) -> tuple[str, ...]:
    """Split an RPATH/RUNPATH string and expand `$ORIGIN`, `${ORIGIN}`, `$LIB`, `$PLATFORM`.

    Empty entries mean the current directory to glibc; we keep them as `.` resolved against
    nothing useful, so we drop them (a loader would search the cwd, which we cannot predict).
    """
    substitutions = {"ORIGIN": origin, "LIB": lib, "PLATFORM": platform or default_platform("")}
    folders: list[str] = []
    for raw in value.split(":"):
        if not raw:
            continue
        expanded = _DST.sub(lambda m: substitutions[m.group(2) or m.group(3)], raw)
        folders.append(os.path.normpath(expanded))
    return tuple(folders)


# What the cache stores per file: soname, NEEDED, raw DT_RPATH, raw DT_RUNPATH, machine, class.
ElfFacts = tuple["str | None", tuple[str, ...], "str | None", "str | None", str, int]


def read_elf(path: str, lib: str | None = None, platform: str | None = None) -> ElfInfo | None:
    """The dynamic section of `path`; None when it is not a readable ELF file.

    `$ORIGIN` is the folder of the file as named (glibc uses the path it opened, not the
    symlink target), which is what makes `$ORIGIN/../../nvidia/...` work from `torch/lib`.
    """
    facts = read_elf_facts(path)
    return None if facts is None else elf_info(path, facts, lib, platform)


def read_elf_cached(path: str, cache: ParseCache) -> ElfInfo | None:
    """`read_elf`, with the parsed dynamic section reused while the file's stat signature is unchanged."""
    stamp = stamp_of(path)
    if stamp is None:
        return None  # gone or unreadable: nothing to parse, nothing to remember
    facts = cache.get("elf", path, stamp, lambda: read_elf_facts(path))
    return None if facts is None else elf_info(path, facts)


def elf_info(path: str, facts: ElfFacts, lib: str | None = None, platform: str | None = None) -> ElfInfo:
    """The ElfInfo of `path` from its raw facts, search paths expanded for where it is named."""
    soname, needed, rpath_raw, runpath_raw, machine, elf_class = facts
    origin = os.path.dirname(os.path.abspath(path))
    lib_dir = lib or default_lib_dir(elf_class)
    plat = platform or default_platform(_uname_for(machine))

    def expand(raw: str | None) -> tuple[str, ...]:
        return expand_search_path(raw, origin, lib_dir, plat) if raw else ()

    return ElfInfo(
        path=path,
        soname=soname,
        needed=tuple(needed),
        rpath=expand(rpath_raw),
        runpath=expand(runpath_raw),
        machine=machine,
        elf_class=elf_class,
    )


def read_elf_facts(path: str) -> ElfFacts | None:
    """Parse the dynamic section; None when `path` is not a readable ELF file.

    The common file (a little- or big-endian ELF32/64 whose DT_STRTAB lies in a PT_LOAD segment) is read
    with `struct` (`_struct_facts`); anything else goes through pyelftools, which the fast path equals on
    every file it takes (tests/libs/test_elf_fast.py). A cold `check` parsed 338 files of a CPU torch tree
    in `cuda_extension_libraries`, most of the first run's time, through pyelftools' construct parsers.
    """
    try:
        with open(path, "rb") as handle:
            head = handle.read(64)
            if head[:4] != _ELF_MAGIC:
                return None
            return _struct_facts(handle, head)
    except OSError:
        return None
    except _Unusual:
        return read_elf_facts_pyelftools(path)


def read_elf_facts_pyelftools(path: str) -> ElfFacts | None:
    """`read_elf_facts` through pyelftools: every ELF file its fast path does not take."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as handle:
            if handle.read(4) != _ELF_MAGIC:
                return None
            handle.seek(0)
            elf = ELFFile(handle)
            soname: str | None = None
            needed: list[str] = []
            rpath_raw: str | None = None
            runpath_raw: str | None = None
            for tag in _dynamic_tags(elf, handle):
                kind = tag.entry.d_tag
                if kind == "DT_NEEDED":
                    needed.append(tag.needed)  # type: ignore[attr-defined]  # pyelftools sets it per tag kind
                elif kind == "DT_SONAME":
                    soname = tag.soname  # type: ignore[attr-defined]  # pyelftools sets it per tag kind
                elif kind == "DT_RPATH":
                    rpath_raw = tag.rpath  # type: ignore[attr-defined]  # pyelftools sets it per tag kind
                elif kind == "DT_RUNPATH":
                    runpath_raw = tag.runpath  # type: ignore[attr-defined]  # pyelftools sets it per tag kind
            machine = str(elf.header.e_machine)
            elf_class = int(elf.elfclass)
    except (OSError, ELFError, ValueError, KeyError, AttributeError):
        return None
    return (soname, tuple(needed), rpath_raw, runpath_raw, machine, elf_class)


class _Unusual(Exception):
    """The fast path's "not mine": pyelftools decides."""


# pyelftools' names of the machines the fast path knows; any other goes through pyelftools
_MACHINES = {3: "EM_386", 40: "EM_ARM", 62: "EM_X86_64", 183: "EM_AARCH64", 21: "EM_PPC64", 243: "EM_RISCV"}
_PT_LOAD, _PT_DYNAMIC, _PN_XNUM = 1, 2, 0xFFFF
_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_SONAME, _DT_RPATH, _DT_RUNPATH = 0, 1, 5, 14, 15, 29


def _struct_facts(handle: BinaryIO, head: bytes) -> ElfFacts:
    """The dynamic section read as ld.so reads it: program headers, PT_DYNAMIC, strings via DT_STRTAB
    mapped through the PT_LOAD segments. `_Unusual` for anything it does not handle exactly."""
    if len(head) < 52 or head[4] not in (1, 2) or head[5] not in (1, 2):
        raise _Unusual  # not a class or byte order ld.so loads
    wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
    machine = _MACHINES.get(struct.unpack_from(order + "H", head, 0x12)[0])
    if machine is None or (wide and len(head) < 64):
        raise _Unusual
    if wide:
        (phoff,) = struct.unpack_from(order + "Q", head, 0x20)
        phentsize, phnum = struct.unpack_from(order + "HH", head, 0x36)
        ph_format, fields = order + "IIQQQQQQ", (0, 2, 3, 5)  # type, offset, vaddr, filesz
    else:
        (phoff,) = struct.unpack_from(order + "I", head, 0x1C)
        phentsize, phnum = struct.unpack_from(order + "HH", head, 0x2A)
        ph_format, fields = order + "IIIIIIII", (0, 1, 2, 4)
    size = struct.calcsize(ph_format)
    if phnum == _PN_XNUM or phentsize < size:
        raise _Unusual
    handle.seek(phoff)
    table = handle.read(phentsize * phnum)
    if len(table) < phentsize * phnum:
        raise _Unusual
    loads, dynamic = [], None
    for index in range(phnum):
        row = struct.unpack_from(ph_format, table, index * phentsize)
        kind, offset, vaddr, filesz = (row[i] for i in fields)
        if kind == _PT_LOAD:
            loads.append((vaddr, filesz, offset))
        elif kind == _PT_DYNAMIC and dynamic is None:
            dynamic = (offset, filesz)
    tags: list[tuple[int, int]] = []
    if dynamic is not None and dynamic[1]:
        entry = order + ("qQ" if wide else "iI")
        step = struct.calcsize(entry)
        handle.seek(dynamic[0])
        data = handle.read(dynamic[1])
        for start in range(0, len(data) - step + 1, step):
            tag, value = struct.unpack_from(entry, data, start)
            tags.append((tag, value))
            if tag == _DT_NULL:
                break
        else:
            raise _Unusual  # no DT_NULL inside the segment
    strtab = next((value for tag, value in tags if tag == _DT_STRTAB), None)
    wanted = [(tag, value) for tag, value in tags if tag in (_DT_NEEDED, _DT_SONAME, _DT_RPATH, _DT_RUNPATH)]
    if not wanted:
        return (None, (), None, None, machine, 64 if wide else 32)
    base = next(
        (strtab - va + off for va, sz, off in loads if strtab is not None and va <= strtab < va + sz), None
    )
    if base is None:
        raise _Unusual  # pyelftools falls back to the section headers
    soname: str | None = None
    needed: list[str] = []
    rpath_raw: str | None = None
    runpath_raw: str | None = None
    for tag, value in wanted:
        text = _cstring(handle, base + value)
        if text is None:
            raise _Unusual
        if tag == _DT_NEEDED:
            needed.append(text)
        elif tag == _DT_SONAME:
            soname = text
        elif tag == _DT_RPATH:
            rpath_raw = text
        else:
            runpath_raw = text
    return (soname, tuple(needed), rpath_raw, runpath_raw, machine, 64 if wide else 32)


def _cstring(handle: BinaryIO, offset: int) -> str | None:
    """The NUL-terminated UTF-8 string at `offset` ('' for an empty one); None where pyelftools would fail."""
    handle.seek(offset)
    chunks = []
    while True:
        chunk = handle.read(256)
        if not chunk:
            return None
        end = chunk.find(b"\0")
        if end >= 0:
            chunks.append(chunk[:end])
            break
        chunks.append(chunk)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        return None


def _dynamic_tags(elf: ELFFile, stream: BinaryIO) -> Iterator[DynamicTag]:
    """The tags of PT_DYNAMIC, with strings read through DT_STRTAB as ld.so does.

    pyelftools' DynamicSegment would first build every section object to find `.dynstr`
    (hundreds of ms over a torch tree); a `Dynamic` without a string table locates DT_STRTAB
    through the program headers instead, which is what the loader itself does.
    """
    from elftools.elf.dynamic import Dynamic

    for index in range(elf.num_segments()):
        header = elf._get_segment_header(index)
        if header["p_type"] == "PT_DYNAMIC":
            dynamic = Dynamic(stream, elf, None, header["p_offset"], header["p_filesz"] == 0)
            yield from dynamic.iter_tags()
            return


def _uname_for(machine: str) -> str:
    return {"EM_X86_64": "x86_64", "EM_AARCH64": "aarch64", "EM_386": "i686"}.get(machine, "")
