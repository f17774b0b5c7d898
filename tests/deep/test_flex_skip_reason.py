"""When the gate's deep probe skips compiled flex, the report names the real reason, not a `--no-flex` flag
nobody gave (issue 18)."""

from __future__ import annotations

from dflash_doctor.context import CheckContext, CheckOptions
from dflash_doctor.deep import run as deep_run
from dflash_doctor.deep.run import ProbeReport
from tests.conftest import env_for


def test_the_gates_flex_skip_names_its_reason_not_a_flag_nobody_gave(site, monkeypatch) -> None:
    skipped = ProbeReport(raw={"flex": {"status": "skipped", "reason": "skipped (--no-flex)"}})
    monkeypatch.setattr(deep_run, "run_probe", lambda *a, **k: skipped)
    ctx = CheckContext(env_for(site), CheckOptions(deep=True, extra={"deep_flex": False}))
    assert "--no-flex" not in deep_run.deep_report(ctx).flex["reason"]
    assert "SDPA" in deep_run.deep_report(ctx).flex["reason"]
