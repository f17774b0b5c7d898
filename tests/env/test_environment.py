"""The environment model, read from files only; `--python` through a real interpreter."""

from __future__ import annotations

import json
from pathlib import Path

from dflash_doctor.cli import run
from dflash_doctor.env.distributions import read_dist_info
from dflash_doctor.env.environment import Environment
from dflash_doctor.env.interpreter import probe_interpreter
from dflash_doctor.env.torch_build import read_torch_build
from tests.conftest import env_for
from tests.fakeenv import FakeSite, make_venv


def test_dist_info_fields(site: FakeSite) -> None:
    dist_info = site.add_dist(
        "nvidia-nccl-cu13",
        "2.30.7",
        {"nvidia/nccl/lib/libnccl.so.2": b"elf"},
        requires=["packaging"],
        build="3",
    )
    dist = read_dist_info(str(dist_info))
    assert dist is not None
    assert (dist.name, dist.version, dist.key) == ("nvidia-nccl-cu13", "2.30.7", "nvidia-nccl-cu13")
    assert dist.wheel_build == "3" and dist.installer == "pip"
    lib = next(e for e in dist.record if e.path.endswith("libnccl.so.2"))
    assert lib.path == str(site.root / "nvidia/nccl/lib/libnccl.so.2")
    assert lib.size == 3 and lib.sha256 is not None and len(lib.sha256) == 64
    assert [str(r) for r in dist.requirements] == ["packaging"]


def test_owners_map_sees_twins(site: FakeSite) -> None:
    site.add_dist("nvidia-nccl-cu13", "2.30.7", {"nvidia/nccl/lib/libnccl.so.2": b"thirteen"})
    site.add_dist("nvidia-nccl-cu12", "2.27.5", {"nvidia/nccl/lib/libnccl.so.2": b"twelve"})
    env = env_for(site)
    owners = env.owners_of(str(site.root / "nvidia/nccl/lib/libnccl.so.2"))
    assert sorted(owners) == ["nvidia-nccl-cu12", "nvidia-nccl-cu13"]


def test_library_owners_come_from_the_library_rows_alone(site: FakeSite) -> None:
    """`owners_of` answers a path with `.so` in it from an index of those rows only (the loader's questions),
    the same answer as the index of every row; a path without `.so` uses that one."""
    site.add_dist(
        "nvidia-nccl-cu12", "2.21.5", {"nvidia/nccl/lib/libnccl.so.2": b"a", "nvidia/nccl/x.py": b""}
    )
    site.add_dist(
        "nvidia-nccl-cu13", "2.28.9", {"nvidia/nccl/lib/libnccl.so.2": b"b", "nvidia/nccl/y.py": b""}
    )
    site.add_dist(
        "pkg", "1.0", {"pkg/_ext.cpython-311-x86_64-linux-gnu.so": b"e", "pkg/iso.txt": b"", "pkg/m.py": b""}
    )
    env = env_for(site)
    libraries = [
        str(site.root / rel)
        for rel in ("nvidia/nccl/lib/libnccl.so.2", "pkg/_ext.cpython-311-x86_64-linux-gnu.so")
    ]
    assert [env.owners_of(path) for path in libraries] == [["nvidia-nccl-cu12", "nvidia-nccl-cu13"], ["pkg"]]
    assert "_owner_index" not in env.__dict__  # the index of every row was never built
    every = env.owners
    for path in [*libraries, str(site.root / "pkg/iso.txt"), str(site.root / "pkg/m.py"), "/nowhere/lib.so"]:
        assert env.owners_of(path) == every.get(path, [])


def test_first_site_wins_and_second_copy_is_shadowed(tmp_path: Path) -> None:
    user, venv = FakeSite(tmp_path / "user"), FakeSite(tmp_path / "venv")
    user.add_dist("torch", "2.9.0")
    venv.add_dist("torch", "2.13.0")
    env = env_for(user, venv)
    assert env.get("torch").version == "2.9.0"
    assert [d.version for d in env.shadowed] == ["2.13.0"]


def test_torch_version_py_without_import(site: FakeSite) -> None:
    site.add_torch(version="2.11.0+cu130", cuda="13.0", git="70d99e998b4955e0049d13a98d77ae1b14db1f45")
    build = read_torch_build(str(site.root / "torch"))
    assert build is not None
    assert (build.variant, build.local_tag, build.cuda_major) == ("cu13x", "cu130", 13)
    assert build.git_version.startswith("70d99e99")
    (site.root / "torch" / "__init__.py").write_text("raise ImportError('broken on purpose')\n")
    assert env_for(site).torch.version == "2.11.0+cu130"


def test_probe_other_interpreter(tmp_path: Path) -> None:
    site_dir = make_venv(tmp_path / "venv")
    FakeSite(site_dir).add_torch(version="2.14.1", cuda="13.0")
    info = probe_interpreter(str(tmp_path / "venv" / "bin" / "python"))
    assert str(site_dir) in info.sys_path and info.prefix != info.base_prefix  # a venv
    env = Environment.from_interpreter(info)
    assert env.torch is not None and env.torch.variant == "cu13x"


def test_cli_check_through_python_flag(tmp_path: Path, capsys) -> None:
    site_dir = make_venv(tmp_path / "venv")
    FakeSite(site_dir).add_torch(version="2.13.0+cpu")
    code = run(["check", "--json", "--only", "torch", "--python", str(tmp_path / "venv" / "bin" / "python")])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    build = next(f for f in data["findings"] if f["id"] == "torch.build")
    assert build["evidence"]["variant"] == "cpu"


def test_extra_only_requirements_are_parsed_only_when_that_extra_is_asked_for(site: FakeSite) -> None:
    from dflash_doctor.env.requirement_graph import build_requirement_graph, marker_environment

    site.add_dist(
        "pkg",
        "1.0",
        requires=[
            'a; extra == "x"',
            "b",
            'c; extra == ""',  # holds without an extra: not skipped
            "d; extra == 'y' or python_version > '1'",
            "e @ https://example.invalid/e.whl ; extra == 'x'",  # a URL: always parsed
            "not a requirement ((",
        ],
    )
    site.add_dist("user", "1.0", requires=["pkg[x]"])
    env = env_for(site)
    pkg = env.get("pkg")
    assert pkg is not None
    assert [(i, r.name) for i, r in pkg.numbered_requirements(maybe_in_base=True)] == [
        (1, "b"),
        (2, "c"),
        (3, "d"),
        (4, "e"),
    ]
    assert 0 not in pkg._parsed_requirements  # `a; extra == "x"` untouched so far
    graph = build_requirement_graph(env.distributions, marker_environment(env.interpreter))
    assert {(e.requester, e.target, e.extra) for e in graph.edges if e.requester == "pkg"} == {
        ("pkg", "b", ""),
        ("pkg", "c", ""),
        ("pkg", "d", ""),
        ("pkg", "a", "x"),
        ("pkg", "e", "x"),
    }
    assert [r.name for r in pkg.requirements] == ["a", "b", "c", "d", "e"]


def test_record_paths_are_normalised_like_normpath(tmp_path: Path) -> None:
    import csv
    import os

    from dflash_doctor.env.distributions import read_record_rows

    rels = [
        "pkg/mod.py",
        "../../bin/tool",
        "./pkg/a.py",
        "pkg//b.py",
        "pkg/./c.py",
        "pkg/sub/../d.py",
        "/opt/abs/e.so",
        ".hidden/f.py",
        "numpy.libs/.libs/g.so",
        "pkg/dir/",
        "pkg/h.",
        "pkg/with,comma.py",
    ]
    record = tmp_path / "RECORD"
    with open(record, "w", newline="") as handle:
        csv.writer(handle).writerows([[rel, "", ""] for rel in rels])
    site_packages = tmp_path / "site-packages"
    for site in (str(site_packages), str(site_packages) + "/", str(tmp_path / "a" / ".." / "site-packages")):
        got = [row[0] for row in read_record_rows(str(record), site)]
        assert got == [os.path.normpath(r if os.path.isabs(r) else os.path.join(site, r)) for r in rels]


def test_the_bytecode_pip_compiled_is_left_out_of_record_rows(tmp_path: Path) -> None:
    """pip lists each `.pyc` it compiled at install without a hash (a third of a GPU host's rows): never
    audited, so never parsed into rows; a hashed `.pyc` (a sourceless wheel's code) stays."""
    import csv

    from dflash_doctor.env.distributions import read_record_rows

    record = tmp_path / "RECORD"
    rows = [
        ["pkg/__init__.py", "sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU", "0"],
        ["pkg/__pycache__/__init__.cpython-311.pyc", "", ""],
        ["pkg/__pycache__/mod.cpython-311.pyc", "", ""],
        ["pkg/__pycache__/code.cpython-311.pyc", "sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU", "0"],
        ["pkg-1.0.dist-info/RECORD", "", ""],
    ]
    with open(record, "w", newline="") as handle:
        csv.writer(handle).writerows(rows)
    got = [row[0].rsplit("/", 2)[-2:] for row in read_record_rows(str(record), str(tmp_path / "site"))]
    assert got == [
        ["pkg", "__init__.py"],
        ["__pycache__", "code.cpython-311.pyc"],
        ["pkg-1.0.dist-info", "RECORD"],
    ]


def test_target_folder_record_paths_resolve_inside_the_folder(tmp_path: Path) -> None:
    """`pip install --target DIR` writes RECORD relative to `<tmp>/lib/python` and moves `<tmp>/bin`
    to `DIR/bin`: `../../bin/readelf.py` is `DIR/bin/readelf.py` (seen on the H200 image: reported
    missing at `/bin/readelf.py`). A real site-packages keeps the plain join."""
    import csv

    from dflash_doctor.env.distributions import read_record_rows

    record = tmp_path / "RECORD"
    with open(record, "w", newline="") as handle:
        csv.writer(handle).writerows([["../../bin/readelf.py", "", ""], ["elftools/__init__.py", "", ""]])
    target = tmp_path / "opt" / "tools"
    got = [row[0] for row in read_record_rows(str(record), str(target))]
    assert got == [str(target / "bin" / "readelf.py"), str(target / "elftools" / "__init__.py")]
    venv_site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    got = [row[0] for row in read_record_rows(str(record), str(venv_site))]
    assert got[0] == str(tmp_path / "venv" / "lib" / "bin" / "readelf.py")
