"""`dflash-doctor probe`: run the deep probe and print its raw JSON report (to save, attach, compare).

`check --deep` judges this report; `probe` hands it over whole: loaded libraries, their real versions,
CUDA context overhead per device, the flex_attention proof. The child is stdlib + torch only, so the
same report comes from `python dflash_doctor/deep/probe_child.py` run with any interpreter.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from dflash_base.atomic import refuse_special, write_json_atomic
from dflash_base.errors import DoctorError
from dflash_doctor.commands.options import FLAG, JsonOption, PythonOption
from dflash_doctor.deep.run import probe_timeout, run_probe
from dflash_doctor.env.interpreter import interpreter_for
from dflash_doctor.report import dumps

ProbeOutOption = typer.Option(None, "--out", "-o", help="Also write the report to this file (atomically).")
NoFlexOption = typer.Option(False, "--no-flex", metavar=FLAG, help="Skip the compiled flex_attention proof.")
CacheOption = typer.Option(
    None,
    "--inductor-cache",
    help="Compile into this folder ('inherit': the environment's); default: a temp folder.",
)


PROBE_SCHEMA = "dflash-doctor/probe-report/v1"


def probe_command(
    python: str | None = PythonOption,
    out: Path | None = ProbeOutOption,
    no_flex: bool = NoFlexOption,
    inductor_cache: str | None = CacheOption,
    json_out: bool = JsonOption,
) -> None:
    """Import torch in a child of the audited interpreter, init CUDA, and print what really loaded.

    The report is JSON either way (`--json` is accepted like on every other command). Exit 1 when the
    probe could not run or `import torch` failed in it.
    """
    if out is not None and out.is_dir():  # before a probe of a minute or more, not after
        raise DoctorError(
            f"probe --out {out}: a folder, not a file", hint="give a file path: --out probe.json"
        )
    if out is not None:  # a device, a FIFO, a link: never replaced (N3), said before the probe runs
        try:
            refuse_special(out)
        except OSError as exc:
            raise DoctorError(
                f"probe --out {out}: {exc.strerror}", hint="give a file path: --out probe.json"
            ) from None
    interpreter = interpreter_for(python)
    timeout = probe_timeout()
    steps = "import torch, init CUDA" + ("" if no_flex else ", compile the flex_attention proof")
    print(  # on stderr, so stdout stays one JSON document; the probe can take a minute and a half on CPU
        f"probing {interpreter.executable}: {steps} (up to {timeout:.0f} s)...", file=sys.stderr, flush=True
    )
    report = run_probe(interpreter.executable, timeout, flex=not no_flex, inductor_cache=inductor_cache)
    data = {"schema": PROBE_SCHEMA, **report.to_json()}
    if out is not None:
        try:
            write_json_atomic(out, data)
        except OSError as exc:
            raise DoctorError(f"probe --out {out}: {exc.strerror}", hint="give a file you may write") from exc
    typer.echo(dumps(data))
    raise typer.Exit(0 if report.ran and report.import_ok else 1)


def register(app: typer.Typer) -> None:
    app.command("probe")(probe_command)
