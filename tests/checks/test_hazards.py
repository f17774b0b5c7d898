"""hazards.*: each compile-silencing setting fires; a clean environment stays quiet."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from checks.hazards import compile_settings, config_hazards, env_hazards
from dflash_doctor.context import CheckContext, CheckOptions
from dflash_doctor.findings import Severity
from dflash_doctor.registry import run_checks
from tests.conftest import env_for
from tests.fakeenv import FakeSite

HAZARD_VARS = [
    "TORCHDYNAMO_SUPPRESS_ERRORS",
    "TORCH_COMPILE_DISABLE",
    "TORCHDYNAMO_DISABLE",
    "TORCHINDUCTOR_FORCE_DISABLE_CACHES",
    "TORCH_COMPILE_FORCE_DISABLE_CACHES",
    "TORCHINDUCTOR_FX_GRAPH_CACHE",
    "TORCHINDUCTOR_AUTOGRAD_CACHE",
    "TORCH_COMPILE_CACHE_KEY_TAG",
    "TORCH_COMPILE_OVERRIDE_DYNAMO_CONFIGS",
]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in HAZARD_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def ids(env: dict[str, str]) -> dict[str, Severity]:
    return {f.id: f.severity for f in env_hazards(env)}


def test_clean_environment_is_quiet(clean_env: pytest.MonkeyPatch, site: FakeSite) -> None:
    runs = run_checks(CheckContext(env_for(site)), ["hazards"])
    got = [f for r in runs for f in r.findings]
    assert [(f.id, f.severity) for f in got] == [("hazards.compile", Severity.OK)]


def test_suppress_errors_fails_even_when_zero() -> None:
    assert ids({"TORCHDYNAMO_SUPPRESS_ERRORS": "0"}) == {"hazards.suppress_errors": Severity.FAIL}
    assert ids({"TORCHDYNAMO_SUPPRESS_ERRORS": ""}) == {}


@pytest.mark.parametrize("name", ["TORCH_COMPILE_DISABLE", "TORCHDYNAMO_DISABLE"])
def test_compile_disabled_fails(name: str) -> None:
    assert ids({name: "1"}) == {"hazards.compile_disabled": Severity.FAIL}
    assert ids({name: "0"}) == {}


@pytest.mark.parametrize("name", ["TORCHINDUCTOR_FORCE_DISABLE_CACHES", "TORCH_COMPILE_FORCE_DISABLE_CACHES"])
def test_forced_off_caches_warn(name: str) -> None:
    assert ids({name: "1"}) == {"hazards.caches_disabled": Severity.WARN}
    assert ids({name: "true"}) == {
        "hazards.caches_disabled": Severity.WARN
    }  # torch: any other string is truthy
    assert ids({name: "0"}) == {}


def test_fx_graph_cache_off_and_key_tag_warn() -> None:
    assert ids({"TORCHINDUCTOR_FX_GRAPH_CACHE": "0"}) == {"hazards.caches_disabled": Severity.WARN}
    assert ids({"TORCH_COMPILE_CACHE_KEY_TAG": "v2"}) == {"hazards.cache_key_tag": Severity.WARN}
    assert ids({"TORCH_COMPILE_OVERRIDE_DYNAMO_CONFIGS": "0-5:suppress_errors=True"}) == {
        "hazards.config_override": Severity.WARN
    }


def test_env_hazard_runs_through_the_check(clean_env: pytest.MonkeyPatch, site: FakeSite) -> None:
    clean_env.setenv("TORCHDYNAMO_SUPPRESS_ERRORS", "1")
    runs = run_checks(CheckContext(env_for(site)), ["hazards"])
    got = {f.id: f for r in runs for f in r.findings}
    assert got["hazards.suppress_errors"].severity is Severity.FAIL
    assert "292 GB" in got["hazards.suppress_errors"].summary
    assert "hazards.compile" not in got


def test_config_hooks_nested_fx_and_recompile_limit(clean_env: pytest.MonkeyPatch, site: FakeSite) -> None:
    config = SimpleNamespace(compile=SimpleNamespace(error_on_nested_fx_trace=False, recompile_limit=64))
    runs = run_checks(CheckContext(env_for(site), CheckOptions(config=config)), ["hazards"])
    got = {f.id: f.severity for r in runs for f in r.findings}
    assert got == {"hazards.nested_fx_trace": Severity.FAIL, "hazards.recompile_limit": Severity.WARN}


def test_raised_limit_with_fail_on_hit_is_fine() -> None:
    settings = compile_settings({"compile": {"recompile_limit": 64, "fail_on_recompile_limit_hit": True}})
    assert list(config_hazards(settings)) == []
    assert list(config_hazards(compile_settings({}))) == []
