"""ELF dynamic sections read with pyelftools, search paths expanded as glibc does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dflash_doctor.env.elf import expand_search_path, read_elf
from dflash_doctor.libs.ldcache import load_system_cache, parse_cache_bytes, parse_ldconfig_output
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
