"""Our reading of CUDA_VISIBLE_DEVICES against the real CUDA driver's, on this machine's GPUs.

For each value (unset, empty, reordered, an invalid entry mid-list, a repeat, UUID prefixes, mixed), a fresh
torch process started with it reports the GPUs CUDA enumerates (`torch.cuda.device_count()` and each device's
UUID, in order); `dflash_doctor.env.gpus.probe_gpus(environ)` says which host GPUs it expects, in which order.
A row matches when the UUID lists are equal. Needs a GPU, torch with CUDA and nvidia-ml-py. Prints a table,
writes bench/results/visible_devices.json.

    .venv/bin/python -m bench.doctor.visible_devices [--python PY]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from dflash_base.atomic import write_json_atomic
from dflash_doctor.env.gpus import GpuInventory, probe_gpus

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "results" / "visible_devices.json"

# A child prints the UUIDs CUDA enumerates, in cuda:i order (torch says the bare UUID, NVML `GPU-<uuid>`).
CHILD = (
    "import json, torch\n"
    "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
    "print(json.dumps([str(torch.cuda.get_device_properties(i).uuid) for i in range(n)]))\n"
)


def cases(host: GpuInventory) -> list[str | None]:
    """Values worth comparing on this host (more with 2+ GPUs)."""
    uuids = [d.uuid or "" for d in host.host]
    count = len(uuids)
    values: list[str | None] = [
        None,
        "",
        "0",
        "0,0",
        f"{count}",
        "-1,0",
        "0gpu",
        " 0 ",
        "GPU-",
        uuids[0],
        uuids[0][:10],
    ]
    if count >= 2:
        values += [
            "1,0",
            f"0,{count},1",  # out of range mid-list: 0 only
            "0,-1,1",
            "1,1",
            f"{uuids[1][:10]},0",  # a UUID prefix, then an index
            f"0,{uuids[0]}",  # the same GPU twice, by index and by UUID
            "GPU-ffffffff,0",  # an unknown UUID first: none
        ]
    return values


def cuda_sees(python: str, value: str | None) -> list[str] | str:
    environ = dict(os.environ)
    environ.pop("CUDA_VISIBLE_DEVICES", None)
    if value is not None:
        environ["CUDA_VISIBLE_DEVICES"] = value
    done = subprocess.run([python, "-c", CHILD], env=environ, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return f"error: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
    return [u.lower().removeprefix("gpu-") for u in json.loads(done.stdout.strip().splitlines()[-1])]


def we_expect(value: str | None) -> tuple[list[str], str | None]:
    environ = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    inv = probe_gpus(environ)
    assert isinstance(inv, GpuInventory)
    return [(d.uuid or "").lower().removeprefix("gpu-") for d in inv.devices], inv.visibility_problem


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose torch is asked")
    args = parser.parse_args()
    host = probe_gpus({})
    if not isinstance(host, GpuInventory) or not host.host:
        print(f"no GPU to compare on: {host}")
        return 1
    index_of = {(d.uuid or "").lower().removeprefix("gpu-"): d.index for d in host.host}
    rows = []
    for value in cases(host):
        expected, problem = we_expect(value)
        actual = cuda_sees(args.python, value)
        rows.append(
            {
                "value": value,
                "cuda": actual if isinstance(actual, str) else [index_of.get(u, u) for u in actual],
                "ours": [index_of.get(u, u) for u in expected],
                "match": actual == expected,
                "problem": problem,
            }
        )
    table = Table(
        title=f"CUDA_VISIBLE_DEVICES on {len(host.host)} x {host.host[0].name}, driver {host.driver_version}"
    )
    for column in ("value", "CUDA enumerates (NVML index)", "we expect", "match", "our note"):
        table.add_column(column)
    for row in rows:
        shown = "unset" if row["value"] is None else repr(row["value"])
        table.add_row(
            shown, str(row["cuda"]), str(row["ours"]), "yes" if row["match"] else "NO", row["problem"] or ""
        )
    Console().print(table)
    write_json_atomic(
        OUT,
        {
            "host": platform.node(),
            "driver": host.driver_version,
            "gpus": [f"{d.index}: {d.name} {d.uuid}" for d in host.host],
            "python": args.python,
            "rows": rows,
            "all_match": all(r["match"] for r in rows),
        },
    )
    print(f"wrote {OUT}")
    return 0 if all(r["match"] for r in rows) else 2


if __name__ == "__main__":
    raise SystemExit(main())
