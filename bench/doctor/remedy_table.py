"""Issue 19's table: each real environment, its ground truth, the verdict, each remedy and the state after it.

For every environment `scripts/build_real_envs.py` built: the ground truth is a real `import torch` in it;
the verdict is `dflash-doctor check`'s exit code and its failing/warning findings; each finding's remedy is
applied, as printed and with no terminal, to a hard-linked copy, and the copy's `import torch` and
re-check are recorded; then all remedies in one round on one copy. Prints a table and writes
bench/results/real_env_remedies.json. `tests/real_wheels/test_real_wheels_remedies.py` asserts on the same helpers.

    .venv/bin/python scripts/build_real_envs.py && .venv/bin/python -m bench.doctor.remedy_table [NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from scripts import build_real_envs

ROOT = Path(__file__).resolve().parents[2]

# cache.* judges the compile-cache location of whoever runs the check, not the environment: the
# checks here get a private one, so they are quiet and none of their remedies is applied.
NOT_ABOUT_THE_ENVIRONMENT = ("cache.",)


def import_torch(venv: Path) -> str | None:
    """None when `import torch` works in `venv`; else the last line of its error."""
    done = subprocess.run(
        [str(venv / "bin/python"), "-c", "import torch"], capture_output=True, text=True, check=False, cwd="/"
    )
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[-1]


def check(venv: Path, home: Path) -> tuple[int, list[dict]]:
    """`dflash-doctor check --json` of `venv` as a fresh process, in a home and compile cache of its own."""
    env = dict(os.environ, DFLASH_DOCTOR_HOME=str(home), TORCHINDUCTOR_CACHE_DIR=str(home / "inductor"))
    env.pop("DFLASH_DOCTOR_CACHE_DIR", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dflash_doctor",
            "check",
            "--python",
            str(venv / "bin/python"),
            "--no-lock",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        cwd=ROOT,
    )
    return done.returncode, json.loads(done.stdout)["findings"]


def actionable(findings: list[dict]) -> list[dict]:
    """Warnings and failures about the environment that carry a remedy."""
    return [
        f
        for f in findings
        if f["remedy"]
        and f["severity"] in ("warn", "fail")
        and not f["id"].startswith(NOT_ABOUT_THE_ENVIRONMENT)
    ]


def problems(findings: list[dict]) -> list[str]:
    return [f"{f['severity']} {f['id']}" for f in findings if f["severity"] in ("warn", "fail")]


def apply(remedy: str) -> subprocess.CompletedProcess[str]:
    """As a person pastes it, but with no terminal: stdin is empty, so a prompt would fail it."""
    return subprocess.run(
        ["bash", "-c", remedy], stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False, cwd="/"
    )


def copy(source: Path, scratch: Path, label: str) -> Path:
    """A hard-linked copy (pip unlinks before it writes, so the source never changes)."""
    target = scratch / label
    subprocess.run(["cp", "-al", str(source), str(target)], check=True)
    (target / build_real_envs.DONE).unlink(missing_ok=True)
    return target


@dataclass
class RemedyOutcome:
    finding: str
    remedy: str
    exit_code: int
    import_torch: str  # "ok" or the error
    check_exit: int
    still_there: bool  # the same remedy is printed again
    left: list[str] = field(default_factory=list)
    stderr_tail: str = ""


@dataclass
class EnvironmentRow:
    name: str
    ground_truth: str
    check_exit: int
    findings: list[str]
    remedies: list[RemedyOutcome] = field(default_factory=list)
    one_round_import: str = ""
    one_round_exit: int | None = None
    one_round_left: list[str] = field(default_factory=list)


def state(error: str | None) -> str:
    return "ok" if error is None else error


def audit_environment(name: str, scratch: Path) -> EnvironmentRow:
    source = build_real_envs.ROOT / name
    code, findings = check(source, scratch / "home-source")
    row = EnvironmentRow(
        name, state(import_torch(source)).replace(str(source), "<env>"), code, problems(findings)
    )
    for index, finding in enumerate(actionable(findings)):
        env = copy(source, scratch, f"{name}-{index}")
        home = scratch / f"home-{name}-{index}"
        _, mine = check(env, home)  # the remedy names this copy's python
        twin = actionable(mine)[index]  # the same environment: the same findings in the same order
        assert twin["id"] == finding["id"], (twin["id"], finding["id"])
        remedy = twin["remedy"]
        ran = apply(remedy)
        after_code, after = check(env, home)
        row.remedies.append(
            RemedyOutcome(
                finding["id"],
                remedy.replace(str(env), "<env>"),
                ran.returncode,
                state(import_torch(env)),
                after_code,
                remedy in {f["remedy"] for f in after},
                problems(after),
                ran.stderr[-400:] if ran.returncode else "",
            )
        )
        shutil.rmtree(env)
    env = copy(source, scratch, f"{name}-round")
    home = scratch / f"home-{name}-round"
    for finding in actionable(check(env, home)[1]):
        apply(finding["remedy"])
    row.one_round_import = state(import_torch(env))
    row.one_round_exit, after = check(env, home)
    row.one_round_left = problems(after)
    shutil.rmtree(env)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="environments (default: every one that is built)")
    args = parser.parse_args()
    names = args.names or [
        n for n in build_real_envs.RECIPES if (build_real_envs.ROOT / n / build_real_envs.DONE).is_file()
    ]
    scratch = Path(tempfile.mkdtemp(prefix=".scratch-", dir=build_real_envs.ROOT))
    try:
        rows = [audit_environment(name, scratch) for name in names]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(
        "| environment | ground truth (`import torch`) | check | findings | remedy | after it: import / check / left |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        first = True
        for outcome in row.remedies or [None]:
            cells = (
                [row.name, row.ground_truth, str(row.check_exit), ", ".join(row.findings) or "none"]
                if first
                else [""] * 4
            )
            if outcome is None:
                cells += ["none", ""]
            else:
                cells += [
                    f"`{outcome.remedy}` (exit {outcome.exit_code})",
                    f"{outcome.import_torch} / {outcome.check_exit} / {', '.join(outcome.left) or 'none'}",
                ]
            print("| " + " | ".join(cells) + " |")
            first = False
        if row.remedies:
            print(
                f"| | | | | all in one round | {row.one_round_import} / {row.one_round_exit} / "
                f"{', '.join(row.one_round_left) or 'none'} |"
            )
    out = ROOT / "bench" / "results" / "real_env_remedies.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    kept = []  # rows of environments not run this time stay (one run per environment is enough)
    if out.is_file():
        ran = {r.name for r in rows}
        kept = [r for r in json.loads(out.read_text()).get("rows", []) if r.get("name") not in ran]
    merged = kept + [asdict(r) for r in rows]
    tmp.write_text(json.dumps({"benchmark": "real_env_remedies", "rows": merged}, indent=2) + "\n")
    os.replace(tmp, out)
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
