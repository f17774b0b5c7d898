"""Issue 18's cache rows through the CLI: damaged state and bad input give a named error and exit 2
(never a traceback), `--out` writes exactly the path given, `cache restore` goes where `train` looks,
and names and paths print whole in a pipe at 80 columns."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dflash_base.errors import DoctorError
from dflash_doctor.cache import store as store_module
from dflash_doctor.cache.warm_record import cache_files, default_records
from dflash_doctor.cli import run
from tests.cache.helpers import make_tree, manifest_for, tree_digests, write_raw_archive


def outcome(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = run(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_row5_a_manifest_whose_fingerprint_is_null_is_a_named_error(
    cache_env: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = manifest_for({"inductor/ab/c.py": b"x"}).to_json()
    data["fingerprint"] = None
    archive = write_raw_archive(
        tmp_path / "null.tar.zst", json.dumps(data).encode(), [("inductor/ab/c.py", b"x")]
    )
    code, _, err = outcome(capsys, ["cache", "restore", str(archive)])
    assert code == 2 and "fingerprint must be an object" in err and "Traceback" not in err


@pytest.mark.parametrize("damaged", ["home", "snapshots"])
@pytest.mark.parametrize("command", [["cache", "snapshot"], ["cache", "list"], ["cache", "restore", "x"]])
def test_row6_a_home_or_store_that_is_a_file_is_a_named_error(
    cache_env: dict[str, Path], capsys: pytest.CaptureFixture[str], damaged: str, command: list[str]
) -> None:
    make_tree(cache_env["inductor"], files=2)
    where = cache_env["home"] if damaged == "home" else cache_env["snapshots"]
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text("not a folder")
    code, _, err = outcome(capsys, command)
    err = err.replace("\n", "")  # the error console wraps at 80 columns
    assert code == 2 and "is a file, not a folder" in err and str(where) in err


def test_row6_a_read_only_home_is_a_named_error(
    cache_env: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    make_tree(cache_env["inductor"], files=2)
    real_mkdir = Path.mkdir

    def read_only(self: Path, *args: object, **kwargs: object) -> None:
        if str(self).startswith(str(cache_env["home"])):
            raise PermissionError(13, "Permission denied", str(self))
        real_mkdir(self, *args, **kwargs)  # type: ignore[arg-type]

    real_os_mkdir = os.mkdir

    def read_only_os(path: object, *args: object, **kwargs: object) -> None:
        if str(path).startswith(str(cache_env["home"])):
            raise PermissionError(13, "Permission denied", str(path))
        real_os_mkdir(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", read_only)  # root ignores a 0500 folder's mode
    monkeypatch.setattr(os, "mkdir", read_only_os)  # paths.make_private_dirs
    code, _, err = outcome(capsys, ["cache", "snapshot"])
    assert code == 2 and "permission denied" in err and "Traceback" not in err


def test_row6_warm_records_that_are_a_folder_do_not_break_snapshot_or_restore(
    cache_env: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    make_tree(cache_env["inductor"], files=2)
    records = default_records()
    records.save("k" * 64, ("cpu",), cache_files({"inductor": cache_env["inductor"]}))
    assert outcome(capsys, ["cache", "snapshot", "--name", "s"])[0] == 0  # it carries the record
    records.path.unlink()
    records.path.mkdir()
    code, out, err = outcome(capsys, ["cache", "restore", "s"])
    assert (
        code == 0 and "cannot write the warm-up records" in out.replace("\n", "") and "Traceback" not in err
    )
    record = {"key": "k" * 64, "when": 1.0, "devices": ["cpu"], "files": {"inductor/ab/c.py": 1}}
    with pytest.raises(DoctorError, match="cannot write the warm-up records"):
        default_records().adopt([record], "s")


@pytest.mark.parametrize("out", ["/proc/version", "/dev/null"])
def test_row6_row11_out_that_exists_is_refused_and_nothing_is_made_beside_it(
    cache_env: dict[str, Path], capsys: pytest.CaptureFixture[str], out: str
) -> None:
    make_tree(cache_env["inductor"], files=2)
    code, _, err = outcome(capsys, ["cache", "snapshot", "--out", out])
    assert code == 2 and "already exists and is not a folder" in err
    assert not os.path.lexists(out + ".tar.zst")


def test_row11_out_without_the_suffix_is_refused_and_with_it_written_exactly(
    cache_env: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_tree(cache_env["inductor"], files=2)
    notes = tmp_path / "notes.txt"
    code, _, err = outcome(capsys, ["cache", "snapshot", "--out", str(notes)])
    assert code == 2 and "must end in .tar.zst" in err
    assert not notes.exists() and not Path(f"{notes}.tar.zst").exists()
    exact = tmp_path / "exact.tar.zst"
    code, out, _ = outcome(capsys, ["cache", "snapshot", "--out", str(exact), "--json"])
    assert code == 0 and json.loads(out)["path"] == str(exact) and exact.is_file()


def test_row10_restore_without_the_variable_goes_to_the_managed_cache(
    cache_env: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snapped = make_tree(cache_env["inductor"], files=3)
    assert outcome(capsys, ["cache", "snapshot", "--name", "s"])[0] == 0
    machine_wide = tmp_path / "tmp"
    machine_wide.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(machine_wide))  # where torch's default would be
    default = machine_wide / f"torchinductor_{os.environ.get('USER', 'x')}"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    code, out, _ = outcome(capsys, ["cache", "restore", "s", "--json"])
    managed = cache_env["home"] / "cache" / "inductor"
    assert code == 0 and json.loads(out)["targets"] == {"inductor": str(managed)}
    assert tree_digests(managed) == snapped
    assert list(machine_wide.iterdir()) == [] and not default.exists()


def test_row13_names_and_paths_print_whole_in_a_pipe_at_80_columns(
    cache_env: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    deep = tmp_path / ("a-rather-long-folder-name-" * 4) / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(deep))
    make_tree(deep, files=2)
    name = "snapshot-with-a-long-name-" + "x" * 70
    assert outcome(capsys, ["cache", "snapshot", "--name", name])[0] == 0
    _, listed, _ = outcome(capsys, ["cache", "list"])
    assert any(line.startswith(name + " ") for line in listed.splitlines()), listed
    assert str(store_module.Path(cache_env["snapshots"])) in listed
    _, status, _ = outcome(capsys, ["cache", "status"])
    assert any(line.endswith(str(deep)) for line in status.splitlines()), status
