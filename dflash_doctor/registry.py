"""One registry of checks. Adding a check = one decorated function in `checks/<area>.py` + two tests.

The runner knows nothing about any check's inside: it imports every module of the `checks`
package, runs the checks whose requirements this run meets, and turns a crash into a finding.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dflash_doctor.context import CheckContext
from dflash_doctor.findings import Finding, Severity

CheckFn = Callable[[CheckContext], Iterable[Finding]]
# Starts slow, independent work a check will wait for (in forked children, `ctx.start`), before any check runs.
Starter = Callable[[CheckContext], None]

# A check may need something a plain `check` run does not do: "deep" (a child process importing
# torch), "config" (a training config), "lock" (a lock file to compare against).
REQUIREMENTS = frozenset({"deep", "config", "lock"})


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    fn: CheckFn
    requires: frozenset[str] = frozenset()
    starts: Starter | None = None

    @property
    def area(self) -> str:
        return self.id.split(".", 1)[0]


_CHECKS: dict[str, Check] = {}


def check(
    id: str, title: str, requires: Iterable[str] = (), starts: Starter | None = None
) -> Callable[[CheckFn], CheckFn]:
    """Register a check function under a stable dotted id (its findings' ids start with its area).

    `starts`: work this check will wait for that depends on no other check (a walk of the disk), started before
    any check runs; the check itself then runs after the checks that start nothing, so the work overlaps them.
    """
    needs = frozenset(requires)
    unknown = needs - REQUIREMENTS
    if unknown:
        raise ValueError(f"check {id}: unknown requirement(s) {sorted(unknown)}")

    def register(fn: CheckFn) -> CheckFn:
        if id in _CHECKS and _CHECKS[id].fn is not fn:
            raise ValueError(f"check id {id!r} registered twice")
        _CHECKS[id] = Check(id, title, fn, needs, starts)
        return fn

    return register


def all_checks() -> list[Check]:
    """Every registered check, after importing each module of the `checks` package."""
    import checks

    for module in pkgutil.iter_modules(checks.__path__):
        importlib.import_module(f"checks.{module.name}")
    return sorted(_CHECKS.values(), key=lambda c: c.id)


def matches(check_id: str, selectors: Iterable[str]) -> bool:
    """`--only libs` selects `libs.*`; `--only libs.resolution` selects that check alone."""
    chosen = list(selectors)
    if not chosen:
        return True
    return any(check_id == s or check_id.startswith(s + ".") or s.startswith(check_id + ".") for s in chosen)


def available(ctx: CheckContext) -> set[str]:
    have = set()
    if ctx.options.deep:
        have.add("deep")
    if ctx.options.config is not None:
        have.add("config")
    if ctx.options.lock_path is not None:
        have.add("lock")
    return have


@dataclass(frozen=True)
class CheckRun:
    check: Check
    findings: list[Finding]
    seconds: float


def run_checks(
    ctx: CheckContext,
    only: Iterable[str] = (),
    defer: Iterable[str] = (),
    between: Callable[[list[CheckRun]], None] | None = None,
    first: Iterable[str] = (),
    after_first: Callable[[list[CheckRun]], None] | None = None,
) -> list[CheckRun]:
    """Every selected check, reported in registry order. `first` (selectors): run those before the other
    static checks, then `after_first(their runs)`: the launch's warm-up starts once the checks it depends on
    have passed, beside the rest. `defer` (selectors): run those last, after `between(runs so far)`: the gate
    runs the static checks while the deep probe's child runs beside them, and only then the checks that judge
    its report. The chosen checks' `starts` run first of all; the checks that wait for them run after the other
    static checks (the report keeps registry order)."""
    selectors = [s.strip() for s in only if s.strip()]
    later = [s.strip() for s in defer if s.strip()]
    early = [s.strip() for s in first if s.strip()]
    have = available(ctx)
    chosen = [c for c in all_checks() if matches(c.id, selectors) and c.requires <= have]
    deferred = [c for c in chosen if later and matches(c.id, later)]
    static = [c for c in chosen if c not in deferred]
    leading = [c for c in static if early and matches(c.id, early)]
    rest = [c for c in static if c not in leading]
    order = leading + [c for c in rest if c.starts is None] + [c for c in rest if c.starts is not None]
    done: dict[str, CheckRun] = {}
    try:
        _start_all(ctx, chosen)
        for chk in leading:
            done[chk.id] = _run_one(ctx, chk)
        if after_first is not None:
            after_first([done[c.id] for c in leading])
        for chk in order[len(leading) :]:
            done[chk.id] = _run_one(ctx, chk)
        if between is not None:
            between([done[c.id] for c in order])
        for chk in deferred:
            done[chk.id] = _run_one(ctx, chk)
    finally:
        ctx.close()  # work started for a check that never asked for it: its children ended and reaped
    return one_command_per_remedy([done[c.id] for c in chosen])


def _start_all(ctx: CheckContext, chosen: list[Check]) -> None:
    """Each chosen check's starter, once; one that fails leaves its check to do the work itself."""
    seen: set[Starter] = set()
    for chk in chosen:
        if chk.starts is not None and chk.starts not in seen:
            seen.add(chk.starts)
            try:
                chk.starts(ctx)
            except Exception:  # the check does the same work when it runs, and reports what goes wrong then
                continue


def _run_one(ctx: CheckContext, chk: Check) -> CheckRun:
    start = time.perf_counter()
    try:
        findings = list(chk.fn(ctx))
    except Exception as exc:  # a crashing check is a bug, reported, never a silent pass
        findings = [
            Finding(
                f"{chk.id}.crashed",
                Severity.FAIL,
                f"check {chk.id} crashed: {type(exc).__name__}: {exc}",
                {"traceback": traceback.format_exc().splitlines()[-6:]},
                "please report this with `dflash-doctor check --json` attached",
            )
        ]
    return CheckRun(chk, findings, time.perf_counter() - start)


def one_command_per_remedy(runs: list[CheckRun]) -> list[CheckRun]:
    """A command two findings give (a deleted cuDNN is both `libs.missing` and
    `ownership.missing_files`) is printed once, on the first; the later one names it instead."""
    first: dict[str, str] = {}
    for run in runs:
        for index, finding in enumerate(run.findings):
            if finding.remedy is None:
                continue
            if finding.remedy not in first:
                first[finding.remedy] = finding.id
                continue
            evidence = {**finding.evidence, "remedy": f"the same command as {first[finding.remedy]}"}
            run.findings[index] = dataclasses.replace(finding, remedy=None, evidence=evidence)
    return runs


def unknown_selectors(only: Iterable[str]) -> list[str]:
    ids = [c.id for c in all_checks()]
    return [s for s in only if s and not any(matches(i, [s]) for i in ids)]
