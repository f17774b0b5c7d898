"""`RegenerateRequest`: built by name from the command's parameters, its defaults the CLI's, checked
before torch loads (issue 35 section 1)."""

from __future__ import annotations

import inspect
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from dflash_base.errors import ConfigError
from trainer.runspec.regenerate_request import DEFAULTS, RegenerateRequest

ROOT = Path(__file__).resolve().parents[3]


def test_the_command_options_are_the_request_fields_with_its_defaults() -> None:
    """Adding an option is one field and its Typer parameter: every parameter reaches the request by name
    (`--set` as `overrides`), and the options' defaults are the request's."""
    from dflash_doctor.commands.data import regenerate_command

    parameters = inspect.signature(regenerate_command).parameters
    names = {"overrides" if p == "set_" else p for p in parameters}
    assert names == {f.name for f in fields(RegenerateRequest)}
    for name, parameter in parameters.items():
        if name in ("config", "prompts", "out", "set_"):
            continue
        default = parameter.default
        default = getattr(default, "default", default)  # `--json` is the shared JsonOption (a typer default)
        assert default == getattr(DEFAULTS, name), name


def test_the_command_passes_every_option_to_the_request_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each option reaches the request's field of its name (`--set` as `overrides`), and nothing else does."""
    from dflash_doctor.cli import run as cli_run

    seen: list[RegenerateRequest] = []

    def prepare(request: RegenerateRequest) -> None:
        seen.append(request)
        raise ConfigError("stop here")

    monkeypatch.setattr("trainer.api.prepare_regeneration", prepare)
    argv = ["data", "regenerate", "--config", "c.toml", "--prompts", "p", "--out", "o", "--set", "run.seed=3"]
    argv += ["--temperature", "0.7", "--top-p", "0.5", "--seed", "7", "--commit-every", "5", "--limit", "4"]
    argv += ["--json"]  # sampling options with a temperature: alone they are refused (issue 58, N8)
    assert cli_run(argv) == 2
    (request,) = seen
    assert request.overrides == ("run.seed=3",) and request.top_p == 0.5 and request.config == "c.toml"
    assert (request.prompts, request.out, request.seed, request.limit) == (Path("p"), Path("o"), 7, 4)
    assert request.commit_every == 5.0 and request.json_out is True
    assert request.max_new_tokens == DEFAULTS.max_new_tokens and request.engine == DEFAULTS.engine


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"engine": "tpu"}, "--engine: must be one of auto, torch, vllm"),
        ({"on_error": "ignore"}, "--on-error: must be stop or skip"),
        ({"max_new_tokens": 0}, "--max-new-tokens: must be >= 1"),
        ({"limit": 0}, "--limit: must be >= 1"),
        ({"batch_size": 0}, "--batch-size: must be >= 1"),
        ({"temperature": float("inf")}, "--temperature: inf"),
        ({"top_p": 0.0}, "--top-p: 0.0 is outside (0, 1]"),
        ({"commit_every": float("inf")}, "--commit-every: inf"),
        ({"commit_every": 0.5}, "--commit-every: 0.5"),
        ({"engine": "torch", "tensor_parallel": 2}, "--tensor-parallel 2"),
    ],
)
def test_validate_names_the_option(changes: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError) as info:
        RegenerateRequest(**changes).validate()  # type: ignore[arg-type]
    assert says in info.value.message and "\n" not in info.value.message


def test_the_request_imports_no_torch() -> None:
    """The CLI builds and checks it before torch is imported."""
    code = "import sys, trainer.runspec.regenerate_request; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
