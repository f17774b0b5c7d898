"""hazards.*: settings that silence or disable compilation, so flex_attention quietly runs dense.

The seed's story: suppressing "Detected that you are using FX to symbolically trace a
dynamo-optimized function" made flex_attention fall back to its dense path (a 292 GB score matrix,
OOM); the same dense path is taken silently when Dynamo hits its recompile limit. The variables and
how torch reads them were checked in torch 2.13's `_dynamo/config.py`, `compiler/config.py` and
`_dynamo/eval_frame.py`.

Environment: the variables of *this* process. With `--python` the audited interpreter runs as our
child and inherits exactly this environment, so it is the right one for both. A training config's
`compile` section (`ctx.options.config.compile`, a mapping or an object with attributes) is read too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from dflash_doctor.context import CheckContext
from dflash_doctor.findings import Finding, fail, ok, warn
from dflash_doctor.registry import check

DENSE_FALLBACK = (
    "flex_attention then runs its dense path, materialising the full score matrix "
    "(the seed's 292 GB OOM; REFERENCE.md section 4)"
)

# Config keys a training config may set under `compile` (mirroring torch._dynamo.config names).
COMPILE_KEYS = (
    "suppress_errors",
    "error_on_nested_fx_trace",
    "recompile_limit",
    "fail_on_recompile_limit_hit",
)
DEFAULT_RECOMPILE_LIMIT = 8


def _is_on_force_env(value: str | None) -> bool:
    """torch's `_read_env_variable`: "1" on, "0" off, any other non-empty string is truthy."""
    return value is not None and value not in ("", "0")


def env_hazards(env: Mapping[str, str]) -> Iterator[Finding]:
    """Pure: findings for compile-silencing variables in this environment."""
    where = {"environment": "this process (a --python child inherits it)"}
    suppress = env.get("TORCHDYNAMO_SUPPRESS_ERRORS")
    if suppress:  # torch reads bool(os.environ.get(...)): even "0" turns it on
        yield fail(
            "hazards.suppress_errors",
            "TORCHDYNAMO_SUPPRESS_ERRORS is set: compile errors are swallowed and the function runs "
            f"uncompiled; {DENSE_FALLBACK}" + (" (note: torch treats any non-empty value, even '0', as on)"),
            remedy="unset TORCHDYNAMO_SUPPRESS_ERRORS",
            value=suppress,
            **where,
        )
    for name in ("TORCH_COMPILE_DISABLE", "TORCHDYNAMO_DISABLE"):
        if env.get(name) == "1":
            yield fail(
                "hazards.compile_disabled",
                f"{name}=1 turns torch.compile into a no-op: {DENSE_FALLBACK}",
                remedy=f"unset {name}",
                variable=name,
                **where,
            )
    for name in ("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "TORCH_COMPILE_FORCE_DISABLE_CACHES"):
        if _is_on_force_env(env.get(name)):
            yield warn(
                "hazards.caches_disabled",
                f"{name} turns every compile cache off: each launch compiles flex_attention cold "
                "(minutes per process, and the concurrent cold compiles that raced in the seed)",
                remedy=f"unset {name}",
                variable=name,
                value=env.get(name),
                **where,
            )
    for name in ("TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE"):
        if env.get(name) == "0":
            yield warn(
                "hazards.caches_disabled",
                f"{name}=0 turns that compile cache off: launches recompile instead of loading",
                remedy=f"unset {name}",
                variable=name,
                **where,
            )
    tag = env.get("TORCH_COMPILE_CACHE_KEY_TAG")
    if tag:
        yield warn(
            "hazards.cache_key_tag",
            f"TORCH_COMPILE_CACHE_KEY_TAG={tag!r} salts every compile-cache key: a snapshot warmed "
            "without the same tag never hits, so the 'warm' cache compiles cold",
            remedy="unset TORCH_COMPILE_CACHE_KEY_TAG  # or warm and launch with the same value",
            value=tag,
            **where,
        )
    override = env.get("TORCH_COMPILE_OVERRIDE_DYNAMO_CONFIGS", "")
    for key in ("suppress_errors", "error_on_nested_fx_trace", "recompile_limit"):
        if key in override:
            yield warn(
                "hazards.config_override",
                f"TORCH_COMPILE_OVERRIDE_DYNAMO_CONFIGS changes {key} for some graphs: {override!r}",
                remedy="unset TORCH_COMPILE_OVERRIDE_DYNAMO_CONFIGS",
                key=key,
                **where,
            )


def compile_settings(config: Any) -> dict[str, Any]:
    """The `compile` section of a training config (the hook for `train --config`), as a plain dict."""
    section = config.get("compile") if isinstance(config, Mapping) else getattr(config, "compile", None)
    if section is None:
        return {}
    if isinstance(section, Mapping):
        return {k: section[k] for k in COMPILE_KEYS if k in section}
    return {k: getattr(section, k) for k in COMPILE_KEYS if hasattr(section, k)}


def config_hazards(settings: Mapping[str, Any]) -> Iterator[Finding]:
    """Pure: findings for Dynamo settings a training config asks for."""
    where = {"source": "training config [compile]"}
    if settings.get("suppress_errors"):
        yield fail(
            "hazards.suppress_errors",
            f"the config sets suppress_errors: compile errors are swallowed; {DENSE_FALLBACK}",
            remedy="remove suppress_errors from the config's [compile] section",
            **where,
        )
    if settings.get("error_on_nested_fx_trace") is False:
        yield fail(
            "hazards.nested_fx_trace",
            "the config turns error_on_nested_fx_trace off: a compiled flex_attention entered under FX "
            f"tracing calls the uncompiled function instead of raising; {DENSE_FALLBACK}",
            remedy="remove error_on_nested_fx_trace = false; warm compiled functions in the main thread instead",
            **where,
        )
    limit = settings.get("recompile_limit")
    if (
        isinstance(limit, int)
        and limit > DEFAULT_RECOMPILE_LIMIT
        and not settings.get("fail_on_recompile_limit_hit")
    ):
        yield warn(
            "hazards.recompile_limit",
            f"recompile_limit raised to {limit} without fail_on_recompile_limit_hit: when it is hit, "
            f"Dynamo silently stops compiling; {DENSE_FALLBACK}",
            remedy="set fail_on_recompile_limit_hit = true in the config's [compile] section",
            recompile_limit=limit,
            **where,
        )


@check("hazards.compile", "compile hazards")
def compile_hazards(ctx: CheckContext) -> Iterator[Finding]:
    found = list(env_hazards(os.environ))
    if ctx.options.config is not None:
        found += list(config_hazards(compile_settings(ctx.options.config)))
    if found:
        yield from found
        return
    yield ok(
        "hazards.compile",
        "nothing silences or disables torch.compile",
        checked="TORCHDYNAMO_SUPPRESS_ERRORS, TORCH_COMPILE_DISABLE, TORCHDYNAMO_DISABLE, *_FORCE_DISABLE_CACHES, "
        "TORCHINDUCTOR_FX_GRAPH_CACHE, TORCHINDUCTOR_AUTOGRAD_CACHE, TORCH_COMPILE_CACHE_KEY_TAG, "
        "TORCH_COMPILE_OVERRIDE_DYNAMO_CONFIGS"
        + (", config [compile]" if ctx.options.config is not None else ""),
        environment="this process (a --python child inherits it)",
    )
