"""ELF dynamic sections (our reader, checked against pyelftools), search paths expanded as glibc does."""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

import pytest

from dflash_doctor import elf
from dflash_doctor.elf import expand_search_path, read_elf
from dflash_doctor.ldcache import load_system_cache, parse_cache_bytes, parse_ldconfig_output
from tests.fakeenv import build_elf


def test_reads_soname_needed_and_rpath(tmp_path: Path, needs_gcc) -> None:
    lib = build_elf(
        tmp_path / "lib" / "libx.so.1", "libx.so.1", ["liba.so.2", "libb.so.3"], rpath="$ORIGIN/../dep"
    )
    info = read_elf(str(lib))
    assert info is not None
    assert info.soname == "libx.so.1" and info.needed[:2] == ("liba.so.2", "libb.so.3")
    assert info.rpath == (str(tmp_path / "dep"),) and info.runpath == ()
    assert info.machine.startswith("EM_") and info.elf_class in (32, 64)


def test_runpath_is_told_apart_from_rpath(tmp_path: Path, needs_gcc) -> None:
    lib = build_elf(tmp_path / "liby.so", "liby.so", runpath="${ORIGIN}:/opt/x")
    info = read_elf(str(lib))
    assert info is not None and info.rpath == () and info.runpath == (str(tmp_path), "/opt/x")


def test_no_soname_uses_file_name(tmp_path: Path, needs_gcc) -> None:
    info = read_elf(str(build_elf(tmp_path / "_C.so")))
    assert info is not None and info.soname is None and info.name == "_C.so"


def test_not_elf(tmp_path: Path) -> None:
    text = tmp_path / "libfake.so"
    text.write_text("INPUT(-lc)\n")  # a linker script named like a library
    assert read_elf(str(text)) is None
    assert read_elf(str(tmp_path / "absent.so")) is None


def test_dynamic_string_tokens() -> None:
    assert expand_search_path("$ORIGIN/../lib:${ORIGIN}/x", "/a/b") == ("/a/lib", "/a/b/x")
    assert expand_search_path("/opt/$LIB/$PLATFORM", "/o", lib="lib64", platform="x86_64") == (
        "/opt/lib64/x86_64",
    )
    assert expand_search_path("$ORIGINAL/x::", "/o") == ("$ORIGINAL/x",)  # not a token; empty entries dropped


def test_real_torch_library_when_available() -> None:
    path = "/work/venvs/cu13/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so"
    if not os.path.exists(path):
        pytest.skip("the cu13 venv is not on this machine")
    info = read_elf(path)
    assert info is not None and "libcudnn.so.9" in info.needed and info.runpath == ()
    assert os.path.normpath(os.path.join(os.path.dirname(path), "../../nvidia/cudnn/lib")) in info.rpath


def test_ldconfig_output_parsed() -> None:
    text = (
        "3 libs found in cache `/etc/ld.so.cache'\n"
        "\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1\n"
        "\tlibz.so.1 (libc6) => /lib/i386-linux-gnu/libz.so.1\n"
        "\tlibcudnn.so.9 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcudnn.so.9\n"
    )
    assert parse_ldconfig_output(text) == {
        "libz.so.1": "/lib/x86_64-linux-gnu/libz.so.1",
        "libcudnn.so.9": "/usr/lib/x86_64-linux-gnu/libcudnn.so.9",
    }


def test_cache_file_agrees_with_ldconfig() -> None:
    import shutil
    import subprocess

    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    if not os.path.exists("/etc/ld.so.cache") or not os.path.exists(ldconfig):
        pytest.skip("no ld.so.cache here")
    with open("/etc/ld.so.cache", "rb") as handle:
        direct = parse_cache_bytes(handle.read(), os.uname().machine)
    listed = parse_ldconfig_output(subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout)
    assert direct == listed
    assert load_system_cache().lookup("libc.so.6")


def _elf_files(root: str) -> list[str]:
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if ".so" in name and not os.path.islink(path) and os.path.isfile(path):
                with open(path, "rb") as handle:
                    if handle.read(4) == b"\x7fELF":
                        found.append(path)
    return found


def test_reader_agrees_with_pyelftools_on_every_library_of_this_environment() -> None:
    """torch's libraries, the C extensions of every installed package, the interpreter itself."""
    paths = [*_elf_files(os.path.join(sys.prefix, "lib")), os.path.realpath(sys.executable)]
    assert len(paths) > 20
    for path in paths:
        assert elf.read_elf_facts(path) == elf._read_elf_facts_pyelftools(path), path


def test_reader_agrees_with_pyelftools_on_built_libraries(tmp_path: Path, needs_gcc) -> None:
    built = [
        build_elf(
            tmp_path / "a" / "liba.so.1", "liba.so.1", ["libb.so.2", "libc.so.6"], rpath="$ORIGIN/x:/y"
        ),
        build_elf(tmp_path / "b" / "libb.so.2", "libb.so.2", runpath="${ORIGIN}"),
        build_elf(tmp_path / "c" / "_C.so"),
    ]
    for path in built:
        assert elf.read_elf_facts(str(path)) == elf._read_elf_facts_pyelftools(str(path))


def synthetic_elf(
    path: Path,
    wide: bool,
    endian: str,
    machine: int = 62,
    needed: tuple[str, ...] = ("liba.so.1", "libb.so.2"),
    soname: str | None = "libx.so.1",
    rpath: str | None = "$ORIGIN/../lib",
    runpath: str | None = None,
    strtab_mapped: bool = True,
) -> Path:
    """A minimal shared object: ELF header, PT_LOAD + PT_DYNAMIC, the dynamic table, its strings."""
    strings = b"\0"
    offsets: dict[str, int] = {}
    for text in (*needed, soname, rpath, runpath):
        if text is not None and text not in offsets:
            offsets[text] = len(strings)
            strings += text.encode() + b"\0"
    tags = [(1, offsets[n]) for n in needed]
    tags += [(14, offsets[soname])] if soname else []
    tags += [(15, offsets[rpath])] if rpath else []
    tags += [(29, offsets[runpath])] if runpath else []
    ehsize, phentsize, entsize = (64, 56, 16) if wide else (52, 32, 8)
    dynamic_at = ehsize + 2 * phentsize
    strtab_at = dynamic_at + (len(tags) + 3) * entsize
    base = 0x400000
    tags += [(5, base + strtab_at if strtab_mapped else 0x7000000), (10, len(strings)), (0, 0)]
    total = strtab_at + len(strings)
    ident = b"\x7fELF" + bytes([2 if wide else 1, 1 if endian == "<" else 2, 1]) + bytes(9)
    if wide:
        header = struct.pack(
            endian + "HHIQQQIHHHHHH", 3, machine, 1, 0, ehsize, 0, 0, ehsize, phentsize, 2, 64, 0, 0
        )
        load = struct.pack(endian + "IIQQQQQQ", 1, 5, 0, base, base, total, total, 0x1000)
        dyn = struct.pack(endian + "IIQQQQQQ", 2, 6, dynamic_at, base + dynamic_at, 0, (len(tags)) * 16, 0, 8)
        table = b"".join(struct.pack(endian + "qQ", t, v) for t, v in tags)
    else:
        header = struct.pack(
            endian + "HHIIIIIHHHHHH", 3, machine, 1, 0, ehsize, 0, 0, ehsize, phentsize, 2, 40, 0, 0
        )
        load = struct.pack(endian + "IIIIIIII", 1, 0, base, base, total, total, 5, 0x1000)
        dyn = struct.pack(endian + "IIIIIIII", 2, dynamic_at, base + dynamic_at, 0, len(tags) * 8, 0, 6, 4)
        table = b"".join(struct.pack(endian + "iI", t, v) for t, v in tags)
    path.write_bytes(ident + header + load + dyn + table + strings)
    return path


@pytest.mark.parametrize("wide", [True, False], ids=["64-bit", "32-bit"])
@pytest.mark.parametrize("endian", ["<", ">"], ids=["little", "big"])
def test_reader_agrees_with_pyelftools_on_each_class_and_byte_order(
    tmp_path: Path, wide: bool, endian: str
) -> None:
    path = synthetic_elf(tmp_path / "libx.so.1", wide, endian, runpath="/opt/r")
    facts = elf.read_elf_facts(str(path))
    assert facts == elf._read_elf_facts_pyelftools(str(path))
    assert facts == (
        "libx.so.1",
        ("liba.so.1", "libb.so.2"),
        "$ORIGIN/../lib",
        "/opt/r",
        "EM_X86_64",
        64 if wide else 32,
    )


def test_unknown_machine_is_left_to_pyelftools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = synthetic_elf(tmp_path / "liby.so", True, "<", machine=0x1234)
    handed: list[str] = []
    reference = elf._read_elf_facts_pyelftools
    monkeypatch.setattr(elf, "_read_elf_facts_pyelftools", lambda p: handed.append(p) or reference(p))
    facts = elf.read_elf_facts(str(path))
    assert handed == [str(path)] and facts == reference(str(path)) and facts is not None
    assert facts[0] == "libx.so.1"


def test_strings_nothing_maps_are_left_to_pyelftools_and_unreadable(tmp_path: Path) -> None:
    """DT_STRTAB outside every PT_LOAD and no .dynstr section: ld.so could not read it; neither can we."""
    path = synthetic_elf(tmp_path / "libw.so", True, "<", strtab_mapped=False)
    assert elf.read_elf_facts(str(path)) is None


def test_truncated_elf_is_not_a_usable_elf(tmp_path: Path) -> None:
    whole = synthetic_elf(tmp_path / "libz.so", True, "<").read_bytes()
    assert elf.read_elf_facts(str(tmp_path / "libz.so")) is not None
    for cut in (5, 20, 70, len(whole) - 30):  # in the header, the program headers, the strings
        short = tmp_path / f"cut{cut}.so"
        short.write_bytes(whole[:cut])
        assert elf.read_elf_facts(str(short)) is None, cut
