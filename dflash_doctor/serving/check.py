"""`serve-check`: run an engine's loader script in the engine's own python and turn its verdict into findings.

vLLM and SGLang pin their own torch, so they live in venvs of their own and cannot import dflash-doctor;
the loader scripts beside this module import nothing of ours and are run by path in that python, in a
scratch HOME and cache folder (the engines write to `~/.cache`), with a timeout, through `run_child` (it
stops every process the engine starts). The scripts exit 0 loaded right, 1 mis-loaded, 2 not an export,
3 no engine in that python, 4 an engine whose internals moved since the version we verified against.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_base.errors import DoctorError
from dflash_doctor import findings
from dflash_doctor.env.interpreter import probe_interpreter
from dflash_doctor.findings import Finding
from dflash_doctor.processes import ChildTimedOut, run_child

HERE = Path(__file__).resolve().parent
EXIT_OK, EXIT_MISLOADED, EXIT_BAD_INPUT, EXIT_ENGINE_MISSING, EXIT_INTERNALS_CHANGED = 0, 1, 2, 3, 4
DEFAULT_TIMEOUT_S = 900.0  # vLLM's import and engine config alone take ~40 s on 2 CPU cores
EXPORT_FILES = ("config.json", "model.safetensors", "README.md")  # what trainer.model.export writes
REMEDY_MISLOADED = (
    "dflash-doctor train --config RUN.toml  # writes a fresh export; one our trainer wrote that still fails "
    "is a bug: report it with `dflash-doctor serve-check ... --json` attached"
)


@dataclass(frozen=True)
class Engine:
    """A serving engine we can check against: its loader script and the version the script was verified on."""

    key: str
    title: str
    script: Path
    verified: str
    executable: str  # the engine's command on PATH: its python is ours to run the script with


ENGINES = {
    "vllm": Engine("vllm", "vLLM", HERE / "vllm_loader.py", "0.33.0", "vllm"),
    "sglang": Engine("sglang", "SGLang", HERE / "sglang_loader.py", "0.5.23", "sglang"),
}


@dataclass
class ServeCheck:
    """One run of a loader script: what ran, and the findings its verdict gives."""

    engine: Engine
    python: str
    export: Path
    command: list[str]
    exit_code: int | None = None
    seconds: float = 0.0
    verdict: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)


def engine_named(name: str) -> Engine:
    if name not in ENGINES:
        raise DoctorError(
            f"--engine {name!r} is not an engine serve-check knows", hint="use --engine vllm or sglang"
        )
    return ENGINES[name]


def export_folder(path: str) -> Path:
    """The export folder, refused (exit 2) when it is not what `trainer.model.export.export_drafter` writes."""
    folder = Path(path).expanduser().resolve()
    hint = "pass the export folder a training run wrote (<output.dir>/export: config.json, model.safetensors)"
    if not folder.is_dir():
        raise DoctorError(f"--export {path}: no such folder", hint=hint)
    absent = [name for name in EXPORT_FILES if not (folder / name).is_file()]
    if absent:
        raise DoctorError(
            f"--export {folder} is not a DFlash export: it lacks {', '.join(absent)}", hint=hint
        )
    try:
        config = json.loads((folder / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DoctorError(f"--export {folder}/config.json is not JSON ({err})", hint=hint) from err
    if not isinstance(config, dict) or "dflash_config" not in config:
        raise DoctorError(
            f"--export {folder}/config.json has no dflash_config: not a DFlash export", hint=hint
        )
    return folder


def engine_python(engine: Engine, python: str | None) -> str:
    """`--python`, or the interpreter of the engine's own command on PATH (its shebang, else the python next
    to it); exit 2 naming `--python` when there is none."""
    if python is not None:
        found = shutil.which(python)
        if found is None:
            raise DoctorError(
                f"--python {python}: not an executable file",
                hint=f"pass the python of the venv {engine.title} is in",
            )
        probe_interpreter(found)  # `--python /bin/ls`: "not a python", exit 2, before the loader runs
        return found
    command = shutil.which(engine.executable)
    if command is not None:
        for candidate in (_shebang_python(Path(command)), Path(command).parent / "python"):
            if candidate is not None and os.access(candidate, os.X_OK) and candidate.is_file():
                return str(candidate)
    raise DoctorError(
        f"no {engine.title} found: no `{engine.executable}` command on PATH",
        hint=f"pass the python that has {engine.title}: --python /path/to/venv/bin/python",
    )


def _shebang_python(command: Path) -> Path | None:
    """The interpreter a console script names on its first line (`#!/venv/bin/python`), if any."""
    try:
        with command.open("rb") as handle:
            first = handle.readline(4096).decode("utf-8", errors="replace")
    except OSError:
        return None
    words = shlex.split(first[2:]) if first.startswith("#!") else []
    return Path(words[0]) if words and "python" in Path(words[0]).name else None


def serve_dtype(export: Path) -> str:
    """The `--dtype` of the SGLang command the export's README.md prints (SGLang reads fp32 as fp16 without it)."""
    for line in (export / "README.md").read_text(errors="replace").splitlines():
        if "sglang.launch_server" in line:
            words = shlex.split(line)
            if "--dtype" in words[:-1]:
                return words[words.index("--dtype") + 1]
    return "auto"


def loader_command(engine: Engine, python: str, export: Path) -> list[str]:
    if engine.key == "sglang":
        return [python, str(engine.script), "--dtype", serve_dtype(export), str(export)]
    return [python, str(engine.script), str(export)]


def scratch_environment(scratch: Path) -> dict[str, str]:
    """Everything the engine caches goes under `scratch`; CPU only, offline, none of our packages visible."""
    return {
        **os.environ,
        "HOME": str(scratch / "home"),  # SGLang's kernel packages keep state in ~/.humming and ~/.cache
        "XDG_CACHE_HOME": str(scratch / "cache"),
        "HF_HOME": str(scratch / "hf"),
        "HF_HUB_OFFLINE": "1",
        "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"),
        "TRITON_CACHE_DIR": str(scratch / "triton"),
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": "",
    }


def run_serve_check(engine_name: str, export: str, python: str | None, timeout: float) -> ServeCheck:
    """Validate the input (exit 2 before anything runs), run the loader, read its verdict into findings."""
    engine = engine_named(engine_name)
    folder = export_folder(export)
    interpreter = engine_python(engine, python)
    result = ServeCheck(engine, interpreter, folder, loader_command(engine, interpreter, folder))
    with tempfile.TemporaryDirectory(prefix="dflash-serve-check-") as scratch:
        try:
            child = run_child(
                result.command,
                timeout,
                f"{engine.title}'s load of {folder}",
                scratch_environment(Path(scratch)),
                cwd=scratch,
            )
        except ChildTimedOut as err:
            result.findings = [timed_out(engine, err.message, err.stderr)]
            return result
    result.exit_code, result.seconds = child.returncode, child.seconds
    result.verdict = last_json_line(child.stdout)
    if (
        child.returncode == EXIT_ENGINE_MISSING
    ):  # nothing was checked: not a pass (it read as exit 0, "No issues")
        raise DoctorError(
            f"{interpreter} has no {engine.title}: the export was not checked "
            f"({result.verdict.get('error') or 'the engine does not import'})",
            hint=f"install {engine.title} {engine.verified} there, or pass the python that has it with --python",
        )
    if child.returncode == EXIT_BAD_INPUT:
        raise DoctorError(
            f"{engine.title}'s loader refused {folder}: {result.verdict.get('error', child.stderr[-400:])}",
            hint="pass a folder written by dflash-doctor's trainer (trainer.model.export.export_drafter)",
        )
    result.findings = verdict_findings(engine, child.returncode, result.verdict, child.stderr)
    return result


def last_json_line(stdout: str) -> dict[str, Any]:
    """The scripts print their verdict as the last line (an engine may print other lines before it)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                return {}
            return data if isinstance(data, dict) else {}
    return {}


def verdict_findings(engine: Engine, code: int, verdict: dict[str, Any], stderr: str) -> list[Finding]:
    """The script's exit code and verdict as `serve.<engine>.load` (and `.config`) findings."""
    load_id, version = f"serve.{engine.key}.load", verdict.get("engine_version")
    if code == EXIT_INTERNALS_CHANGED:
        return [
            findings.skip(
                load_id,
                f"not checked: {engine.title} {version} differs from {engine.title} "
                f"{engine.verified}, the version this check was verified against",
                error=verdict.get("error"),
                verified_against=engine.verified,
            )
        ]
    if code not in (EXIT_OK, EXIT_MISLOADED) or "ok" not in verdict:
        return [
            findings.fail(
                load_id,
                f"{engine.title}'s loader ended without a verdict (exit {code}): a bug in dflash-doctor or "
                "in the engine; please report it with this output attached",
                None,
                stderr=stderr.strip().splitlines()[-12:],
            )
        ]
    if verdict.get("error"):
        return [
            findings.fail(
                load_id,
                f"{engine.title} {version} refuses the export: {verdict['error']}",
                REMEDY_MISLOADED,
                engine_version=version,
                stderr=stderr.strip().splitlines()[-12:],
            )
        ]
    return [load_finding(engine, verdict), config_finding(engine, verdict)]


def load_finding(engine: Engine, verdict: dict[str, Any]) -> Finding:
    load_id, version, params = f"serve.{engine.key}.load", verdict["engine_version"], verdict["parameters"]
    problems = {kind: params.get(kind, []) for kind in ("missing", "different", "unused")}
    shared = params.get("shared_with_target") or {}
    if not any(problems.values()):
        return findings.ok(
            load_id,
            f"{engine.title} {version} loads all {params['equal']} parameters, equal to the export's",
            engine_version=version,
            equal=params["equal"],
            **({"shared_with_target": list(shared)} if shared else {}),
        )
    tally = ", ".join(f"{len(names)} {kind}" for kind, names in problems.items() if names)
    return findings.fail(
        load_id,
        f"{engine.title} {version} mis-loads the export ({tally}) without a word: "
        "a weight it did not fill would be served as whatever memory held",
        REMEDY_MISLOADED,
        engine_version=version,
        equal=params["equal"],
        **{kind: names for kind, names in problems.items() if names},
    )


def config_finding(engine: Engine, verdict: dict[str, Any]) -> Finding:
    config_id, config = f"serve.{engine.key}.config", verdict["config"]
    wrong = {
        name: f"{engine.key} {v['engine']!r}, ours {v['ours']!r}" for name, v in config.items() if not v["ok"]
    }
    if not wrong:
        return findings.ok(
            config_id, f"{engine.title} reads all {len(config)} config fields as written", fields=list(config)
        )
    return findings.fail(
        config_id,
        f"{engine.title} reads {len(wrong)} of {len(config)} config fields otherwise "
        "than the export wrote them",
        REMEDY_MISLOADED,
        **wrong,
    )


def timed_out(engine: Engine, message: str, stderr: str) -> Finding:
    return findings.fail(
        f"serve.{engine.key}.load",
        message,
        "dflash-doctor serve-check ... --timeout 1800",
        stderr=stderr.strip().splitlines()[-12:],
    )
