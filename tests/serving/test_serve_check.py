"""`dflash-doctor serve-check` against a fake engine python: each verdict path, without vLLM or SGLang.

The fake "engine python" is a shell script that records how it was run, prints a canned verdict and exits
with the code the real loader scripts use (0 ok, 1 mis-loaded, 3 engine missing, 4 internals changed).
The last tests run the real loader scripts with our own python, which has neither engine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dflash_doctor.cli import run
from dflash_doctor.serving.check import ENGINES

SGLANG_LINE = "python -m sglang.launch_server --model-path t --speculative-algorithm DFLASH --dtype bfloat16"


def fake_export(folder: Path) -> Path:
    """What serve-check looks at before it runs anything: the three files, a DFlash config.json."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"dflash_config": {"target_layer_ids": [0, 2]}}))
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "README.md").write_text(f"vllm serve t\n\n{SGLANG_LINE}\n")
    return folder


def fake_python(folder: Path, verdict: dict[str, Any], code: int, sleep_s: float = 0) -> Path:
    """An executable that writes its arguments and $HOME to `ran.txt`, prints `verdict` and exits `code`;
    asked to run a line of Python (`-c`: is it a python?), it is the real one."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "verdict.json").write_text("engine log line\n" + json.dumps(verdict) + "\n")
    script = folder / "python"
    script.write_text(
        "#!/bin/sh\n"
        f'[ "$1" = "-c" ] && exec "{sys.executable}" "$@"\n'
        f'printf "%s\\n" "$@" "HOME=$HOME" > "{folder}/ran.txt"\n'
        f"sleep {sleep_s}\n"
        f'cat "{folder}/verdict.json"\n'
        f"exit {code}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def loaded(missing: list[str] | None = None, wrong_field: bool = False) -> dict[str, Any]:
    return {
        "engine": "sglang",
        "engine_version": "0.5.23",
        "ok": not missing and not wrong_field,
        "parameters": {
            "equal": 19 - len(missing or []),
            "missing": missing or [],
            "different": [],
            "unused": [],
        },
        "config": {
            "block_size": {"engine": 4, "ours": 4, "ok": True},
            "mask_token_id": {"engine": 5 if wrong_field else 96, "ours": 96, "ok": not wrong_field},
        },
    }


def serve_check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    """Exit code and the --json report (findings by id)."""
    code = run(["serve-check", *args, "--json"])
    report = json.loads(capsys.readouterr().out)
    report["by_id"] = {f["id"]: f for f in report["findings"]}
    return code, report


def test_an_export_the_engine_loads_right_is_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    export = fake_export(tmp_path / "export")
    python = fake_python(tmp_path / "engine", loaded(), 0)
    code, report = serve_check(capsys, "--export", str(export), "--engine", "sglang", "--python", str(python))
    assert code == 0 and report["exit_code"] == 0 and report["schema"] == "dflash-doctor/report/v1"
    load, config = report["by_id"]["serve.sglang.load"], report["by_id"]["serve.sglang.config"]
    assert load["severity"] == "ok" and load["evidence"]["equal"] == 19
    assert load["summary"] == "SGLang 0.5.23 loads all 19 parameters, equal to the export's"
    assert config["severity"] == "ok" and config["evidence"]["fields"] == ["block_size", "mask_token_id"]
    assert report["context"]["verified_against"] == "0.5.23" and report["verdict"]["ok"] is True
    # The script ran by path, with the dtype the export's SGLang command gives, in a scratch HOME.
    ran = (tmp_path / "engine" / "ran.txt").read_text().splitlines()
    assert ran[:4] == [str(ENGINES["sglang"].script), "--dtype", "bfloat16", str(export.resolve())]
    assert ran[4].startswith("HOME=") and "dflash-serve-check-" in ran[4]
    assert not Path(ran[4].removeprefix("HOME=")).exists()  # the scratch folder is gone afterwards
    # The human table says the same.
    assert run(["serve-check", "--export", str(export), "--engine", "sglang", "--python", str(python)]) == 0
    assert "serve.sglang.load" in capsys.readouterr().out


def test_a_mis_loaded_export_fails_naming_the_parameter_and_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export = fake_export(tmp_path / "export")
    verdict = loaded(missing=["layers.1.mlp.gate_up_proj.weight"], wrong_field=True)
    python = fake_python(tmp_path / "engine", verdict, 1)
    code, report = serve_check(capsys, "--export", str(export), "--engine", "sglang", "--python", str(python))
    assert code == 1 and report["summary"]["fail"] == 2
    load, config = report["by_id"]["serve.sglang.load"], report["by_id"]["serve.sglang.config"]
    assert load["evidence"]["missing"] == ["layers.1.mlp.gate_up_proj.weight"]
    assert load["summary"].startswith("SGLang 0.5.23 mis-loads the export (1 missing)")
    assert load["remedy"].startswith("dflash-doctor train --config RUN.toml")
    assert config["evidence"] == {"mask_token_id": "sglang 5, ours 96"}


def test_a_changed_engine_is_a_plain_skip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    export = fake_export(tmp_path / "export")
    verdict = {"engine": "vllm", "engine_version": "9.9", "ok": False, "reason": "internals changed"}
    python = fake_python(tmp_path / "engine", {**verdict, "error": "no module"}, 4)
    exit_code, report = serve_check(
        capsys, "--export", str(export), "--engine", "vllm", "--python", str(python)
    )
    load = report["by_id"]["serve.vllm.load"]
    says = "not checked: vLLM 9.9 differs from vLLM 0.33.0, the version this check"
    assert exit_code == 0 and load["severity"] == "skip" and load["summary"].startswith(says)
    assert load["evidence"]["error"] == "no module"


def test_a_python_without_the_engine_is_exit_2_never_no_issues(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing was checked: exit 0 with "No issues found (0 ok, 1 skipped)" read as a pass."""
    export = fake_export(tmp_path / "export")
    verdict = {"engine": "vllm", "ok": False, "reason": "engine missing", "error": "cannot import vllm"}
    python = fake_python(tmp_path / "engine", verdict, 3)
    assert run(["serve-check", "--export", str(export), "--engine", "vllm", "--python", str(python)]) == 2
    captured = capsys.readouterr()
    err = " ".join(captured.err.split())
    assert f"{python} has no vLLM: the export was not checked (cannot import vllm)" in err
    assert "install vLLM 0.33.0 there, or pass the python that has it with --python" in err
    assert "No issues found" not in captured.out


def test_a_loader_that_runs_past_the_timeout_is_stopped_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export = fake_export(tmp_path / "export")
    python = fake_python(tmp_path / "engine", loaded(), 0, sleep_s=30)
    args = ("--export", str(export), "--engine", "sglang", "--python", str(python), "--timeout", "1")
    code, report = serve_check(capsys, *args)
    load = report["by_id"]["serve.sglang.load"]
    assert code == 1 and "did not finish within 1 s" in load["summary"] and "--timeout" in load["remedy"]


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        ("none", ["--engine", "vllm"], "no such folder"),
        ("empty", ["--engine", "vllm"], "is not a DFlash export: it lacks config.json, model.safetensors"),
        ("export", ["--engine", "tgi"], "--engine 'tgi' is not an engine serve-check knows"),
        ("export", ["--engine", "vllm", "--python", "/no/such/python"], "--python /no/such/python: not an"),
    ],
)
def test_bad_input_is_exit_2_with_the_fix_and_nothing_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setup: str, args: list[str], message: str
) -> None:
    export = tmp_path / "export"
    if setup == "empty":
        export.mkdir()
    elif setup == "export":
        fake_export(export)
    assert run(["serve-check", "--export", str(export), *args]) == 2
    err = capsys.readouterr().err
    assert message in " ".join(err.split()) and "hint:" in err


def test_the_default_python_is_the_engines_own_and_none_on_path_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    export = fake_export(tmp_path / "export")
    python = fake_python(tmp_path / "venv" / "bin", loaded(), 0)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    assert run(["serve-check", "--export", str(export), "--engine", "sglang"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "no SGLang found: no `sglang` command on PATH" in err and "--python" in err
    # A console script `sglang` on PATH: its shebang names the python that has SGLang.
    command = tmp_path / "venv" / "bin" / "sglang"
    command.write_text(f"#!{python}\n")
    command.chmod(0o755)
    monkeypatch.setenv("PATH", f"{command.parent}{os.pathsep}/usr/bin{os.pathsep}/bin")  # sh needs cat
    code, report = serve_check(capsys, "--export", str(export), "--engine", "sglang")
    assert code == 0 and report["context"]["python"] == str(python)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_real_scripts_in_a_python_without_the_engine_say_engine_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], engine: str
) -> None:
    """Our own python has neither engine: the real script exits 3, and serve-check says so, exit 2."""
    if importlib.util.find_spec(engine) is not None:
        pytest.skip(f"this python has {engine}: the engine-missing path needs one without it")
    from tests.trainer.drafter_fixtures import tiny_config, tiny_drafter
    from trainer.model.export import export_drafter

    export = export_drafter(tiny_drafter(tiny_config()), tmp_path / "export", target="t")
    args = ["serve-check", "--export", str(export), "--engine", engine, "--python", sys.executable]
    assert run(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "the export was not checked" in err and f"cannot import {engine}" in err, err


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_real_scripts_name_an_engine_whose_internals_moved(tmp_path: Path, engine: str) -> None:
    """An engine package without the modules the script reads (a stand-in on PYTHONPATH): exit 4."""
    from tests.trainer.drafter_fixtures import tiny_config, tiny_drafter
    from trainer.model.export import export_drafter

    export = export_drafter(tiny_drafter(tiny_config()), tmp_path / "export", target="t")
    package = tmp_path / "site" / engine
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "9.9"\n')
    if engine == "sglang":  # past the "has DFlash at all" test, to the internals
        for sub in ("srt", "srt/models"):
            (package / sub).mkdir()
            (package / sub / "__init__.py").write_text("")
        (package / "srt" / "models" / "dflash.py").write_text("")
    done = subprocess.run(
        [sys.executable, str(ENGINES[engine].script), str(export)],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
    )  # fmt: skip
    verdict = json.loads(done.stdout.splitlines()[-1])
    assert done.returncode == 4, done.stderr[-2000:]
    assert verdict["reason"] == "internals changed" and verdict["engine_version"] == "9.9"
    assert verdict["error"].startswith(f"{engine}.")


def test_the_loader_script_refuses_a_folder_that_is_no_export(tmp_path: Path) -> None:
    """Bad input is refused before the engine is imported, so our own python is enough here."""
    done = subprocess.run(
        [sys.executable, str(ENGINES["vllm"].script), str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert json.loads(done.stdout)["error"] == (
        f"{tmp_path.resolve()} has no config.json: pass a folder written by trainer.model.export.export_drafter"
    )
