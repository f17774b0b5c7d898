"""What the dynamic loader reads from a shared object: soname, NEEDED, RPATH, RUNPATH.

We read only the PT_DYNAMIC segment with pyelftools (never the symbol tables), so a 500 MB
`libtorch_cuda.so` costs a few milliseconds. Search paths are returned with `$ORIGIN`, `$LIB`
and `$PLATFORM` expanded the way glibc's `_dl_dst_substitute` does.
"""

from __future__ import annotations

import os
import re
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
