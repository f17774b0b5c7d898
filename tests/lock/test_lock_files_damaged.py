"""A lock that is not a lock, has a wrong-typed field or was made by a newer version is exit 2 for `check
--lock` and `diff`, naming what is wrong (issue 18)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_doctor.cli import run
from dflash_doctor.lock.lockfile import LOCK_SCHEMA, build_lock
from tests.conftest import env_for
from tests.fakeenv import FakeSite


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DFLASH_DOCTOR_DEBUG", raising=False)
    return tmp_path / "home"


def good_lock(tmp_path: Path) -> dict:
    site = FakeSite(tmp_path / "site")
    site.add_torch()
    return build_lock(env_for(site), {}, None, {}).to_json()


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"garbage", "not a dflash-doctor lock"),
        (bytes(range(256)), "not UTF-8"),
        (b"[1, 2, 3]", "not a JSON object"),
    ],
)
def test_a_lock_that_is_not_a_lock_is_exit_2_for_check_and_diff(tmp_path, capsys, content, words) -> None:
    lock = tmp_path / "bad.lock"
    lock.write_bytes(content)
    for command in (["check", "--lock", str(lock), "--only", "torch"], ["diff", str(lock), str(lock)]):
        assert run(command) == 2, command
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err
    assert run(["check", "--lock", str(tmp_path / "missing.lock")]) == 2


@pytest.mark.parametrize(
    ("field", "value"),
    [("distributions", ["torch"]), ("gpus", {"0": "H200"}), ("environment", {"CUDA_HOME": 12})],
)
def test_a_lock_with_a_wrong_typed_field_names_it(tmp_path, capsys, field, value) -> None:
    data = good_lock(tmp_path)
    data[field] = value
    lock = tmp_path / "typed.lock"
    lock.write_text(json.dumps(data))
    assert run(["diff", str(lock), str(lock)]) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err
    assert run(["check", "--lock", str(lock), "--only", "torch"]) == 2
    assert field in capsys.readouterr().err


def test_a_lock_of_a_future_schema_says_made_by_a_newer_version(tmp_path, capsys) -> None:
    data = good_lock(tmp_path)
    data["schema"] = LOCK_SCHEMA.replace("/v1", "/v2")
    lock = tmp_path / "future.lock"
    lock.write_text(json.dumps(data))
    assert run(["diff", str(lock), str(lock)]) == 2
    err = capsys.readouterr().err
    assert "made by a newer version" in err and "not a dflash-doctor lock" not in err
