"""What the dynamic loader reads from a shared object: soname, NEEDED, RPATH, RUNPATH.

We read only what ld.so reads: the ELF header, the program headers, the PT_DYNAMIC segment and the
strings it names through DT_STRTAB (mapped to a file offset by the PT_LOAD segments), never the
section or symbol tables, so a 500 MB `libtorch_cuda.so` costs a few reads (~50 us with `struct`).
An ELF file outside that common shape (PN_XNUM program headers, a DT_STRTAB no PT_LOAD maps, an
e_machine not in our table) is handed to pyelftools, the reference this reader is tested against
(`tests/test_elf.py` compares both on every ELF file of the test interpreter's environment).
Search paths are returned with `$ORIGIN`, `$LIB` and `$PLATFORM` expanded the way glibc's
`_dl_dst_substitute` does.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

from dflash_doctor.parse_cache import stamp_of

if TYPE_CHECKING:  # pyelftools is imported only for the rare file our reader hands to it
    from elftools.elf.dynamic import DynamicTag
    from elftools.elf.elffile import ELFFile

    from dflash_doctor.parse_cache import ParseCache

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


def is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == _ELF_MAGIC
    except OSError:
        return False


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
    """Parse the dynamic section; None when `path` is not a readable ELF file."""
    try:
        with open(path, "rb") as handle:
            ident = handle.read(16)
            if ident[:4] != _ELF_MAGIC:
                return None
            facts = _read_dynamic(handle, ident)
    except (OSError, struct.error, ValueError, IndexError):
        return None
    return _read_elf_facts_pyelftools(path) if facts is _UNUSUAL else facts


class _Unusual:
    """Marks a file our reader leaves to pyelftools."""


_UNUSUAL = _Unusual()
_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_SONAME, _DT_RPATH, _DT_RUNPATH = 0, 1, 5, 14, 15, 29
# e_machine -> pyelftools' name, for the machines torch wheels and their hosts use.
_MACHINES = {3: "EM_386", 40: "EM_ARM", 62: "EM_X86_64", 21: "EM_PPC64", 22: "EM_S390", 183: "EM_AARCH64"}


def _read_dynamic(handle: BinaryIO, ident: bytes) -> ElfFacts | _Unusual | None:
    """soname, NEEDED, RPATH, RUNPATH as ld.so finds them; `_UNUSUAL` for the cases left to pyelftools."""
    elf_class = {1: 32, 2: 64}.get(ident[4])
    endian = {1: "<", 2: ">"}.get(ident[5])
    if elf_class is None or endian is None:
        return None  # pyelftools: "invalid EI_CLASS/EI_DATA"
    wide = elf_class == 64
    header = struct.Struct(endian + ("HHIQQQIHHHHHH" if wide else "HHIIIIIHHHHHH"))
    _type, e_machine, _version, _entry, phoff, _shoff, _flags, _ehsize, phentsize, phnum, *_ = header.unpack(
        handle.read(header.size)
    )
    machine = _MACHINES.get(e_machine)
    if machine is None or phnum == 0xFFFF:
        return _UNUSUAL
    # (p_type, p_offset, p_vaddr, p_filesz) of each program header
    program = struct.Struct(endian + ("IIQQQQQQ" if wide else "IIIIIIII"))
    handle.seek(phoff)
    table = handle.read(phentsize * phnum)
    loads: list[tuple[int, int, int]] = []
    dynamic: tuple[int, int] | None = None
    for index in range(phnum):
        fields = program.unpack_from(table, index * phentsize)
        if wide:
            p_type, _pflags, p_offset, p_vaddr, _paddr, p_filesz = fields[:6]
        else:
            p_type, p_offset, p_vaddr, _paddr, p_filesz = fields[:5]
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_filesz, p_offset))
        elif p_type == _PT_DYNAMIC and dynamic is None:
            dynamic = (p_offset, p_filesz)
    soname: str | None = None
    needed: list[int] = []
    rpath: int | None = None
    runpath: int | None = None
    soname_at: int | None = None
    strtab: int | None = None
    if dynamic is not None and dynamic[1] > 0:
        entry = struct.Struct(endian + ("qQ" if wide else "iI"))
        handle.seek(dynamic[0])
        data = handle.read(dynamic[1])
        for tag, value in entry.iter_unpack(data[: len(data) - len(data) % entry.size]):
            if tag == _DT_NULL:
                break
            if tag == _DT_NEEDED:
                needed.append(value)
            elif tag == _DT_SONAME:
                soname_at = value
            elif tag == _DT_RPATH:
                rpath = value
            elif tag == _DT_RUNPATH:
                runpath = value
            elif tag == _DT_STRTAB and strtab is None:
                strtab = value
    if needed or soname_at is not None or rpath is not None or runpath is not None:
        table_offset = next(
            (strtab - va + off for va, size, off in loads if strtab is not None and va <= strtab < va + size),
            None,
        )
        if table_offset is None:
            return _UNUSUAL  # pyelftools then looks for a .dynstr section

        def string(at: int) -> str:
            return _c_string(handle, table_offset + at)

        soname = string(soname_at) if soname_at is not None else None
        return (
            soname,
            tuple(string(at) for at in needed),
            string(rpath) if rpath is not None else None,
            string(runpath) if runpath is not None else None,
            machine,
            elf_class,
        )
    return (None, (), None, None, machine, elf_class)


def _c_string(handle: BinaryIO, offset: int) -> str:
    """The NUL-terminated string at `offset`, as a path (undecodable bytes kept, as os functions do).
    A string cut off by the end of the file means a truncated file, which ld.so would not map either."""
    handle.seek(offset)
    chunks = []
    while True:
        chunk = handle.read(256)
        end = chunk.find(b"\0")
        if end >= 0:
            chunks.append(chunk[:end])
            return os.fsdecode(b"".join(chunks))
        if not chunk:
            raise ValueError("string runs past the end of the file: truncated")
        chunks.append(chunk)


def _read_elf_facts_pyelftools(path: str) -> ElfFacts | None:
    """The reference reader (pyelftools), for the files `_read_dynamic` does not take on."""
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
                    needed.append(tag.needed)
                elif kind == "DT_SONAME":
                    soname = tag.soname
                elif kind == "DT_RPATH":
                    rpath_raw = tag.rpath
                elif kind == "DT_RUNPATH":
                    runpath_raw = tag.runpath
            machine = str(elf.header.e_machine)
            elf_class = int(elf.elfclass)
    except (OSError, ELFError, ValueError, KeyError, AttributeError, AssertionError):
        return None  # pyelftools asserts on some malformed files (a DT_STRTAB nothing maps, no .dynstr)
    return (soname, tuple(needed), rpath_raw, runpath_raw, machine, elf_class)


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
