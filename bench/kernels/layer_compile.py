"""Compile the decoder layer, not the stack: cold compile time, graph count and step time, per mode, same run.

Every row is the REAL drafter (`trainer.run.warmup.build_drafter`) stepped by the REAL `trainer.run.train.train_step`
at a recipe's shapes, in a fresh process with an empty compile cache (a cold start, as on a fresh machine):

  layers            what the trainer does (issue 17): each decoder layer compiled, the first layer's input
                    marked as needing a gradient, so ONE layer graph (forward + backward) serves every layer
  layers, first apart  the trainer before issue 17: each layer compiled, the first one's input needing no
                    gradient, so a second layer graph (forward + backward) of its own
  stack             the whole decoder stack compiled as one graph (Dynamo unrolls the loop over the layers)

The block mask and the LM head + CE chunk are compiled alike in every mode; the differences are the layers'.
`first_step_s` is the first step from an empty cache (compile included); `graphs` is Dynamo's unique graphs,
`compiled` Inductor's FX graphs compiled (forward and backward count apart). `first_loss` must agree across
rows (bf16 tolerance): a mode that changes the numbers is wrong, not fast.

    python3 -m bench.kernels.layer_compile --config qwen3-8b-b16 --config seed-b32          # one H200
    .venv/bin/python -m bench.kernels.layer_compile --tiny                                  # CPU: SDPA, tiny shapes
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

MODES = ("layers", "layers, first apart", "stack")
COLUMNS = ("recipe", "mode", "graphs", "compiled", "first_step_s", "step_ms", "vs_layers", "first_loss")
ROOT = Path(__file__).resolve().parents[2]
RESULT_PREFIX = "LAYER_COMPILE_ROW "
TINY = ["data.seq_len=256", "optim.anchors=16", "drafter.layers=3"]


def plain_loop(model: Any, x: Any, context: Any, rope_q: Any, rope_ctx: Any, mask: Any) -> Any:
    """The decoder stack as it ran before issue 17: the first layer's input needing no gradient."""
    for layer in model.layers:
        x = layer(x, context, rope_q, rope_ctx, mask)
    return x


def measure(config: str, overrides: list[str], mode: str, device_name: str, repeats: int) -> dict[str, Any]:
    """One row, in this (fresh) process."""
    import torch
    from torch._dynamo.utils import counters

    from bench.lib.roles import DrafterRole, Recipe, median, random_batch, synchronize, time_repeats

    device = torch.device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    stack = mode == "stack"
    sets = [*overrides, *(["drafter.compile_layers=false"] if stack else [])]
    recipe = Recipe.load(config, sets, device)
    role = DrafterRole.build(recipe, device)
    model = role.model
    if not stack and not model.layers_compiled:  # on CPU build_drafter leaves the layers eager
        model.compile_layers()
    if mode == "layers, first apart":
        model.run_layers = types.MethodType(plain_loop, model)
    elif stack:
        model.run_layers = torch.compile(types.MethodType(plain_loop, model), dynamic=False)
    batch = random_batch(recipe, model, device, seed=11)
    counters.clear()
    began = time.perf_counter()
    first_loss = role.step(batch)
    synchronize(device)
    first_step_s = time.perf_counter() - began
    step_s = median(time_repeats(lambda: role.step(batch), device, 2, repeats))
    return {
        "recipe": recipe.name,
        "mode": mode,
        "graphs": int(counters["stats"]["unique_graphs"]),
        "compiled": int(counters["inductor"]["fxgraph_cache_miss"]),
        "first_step_s": round(first_step_s, 2),
        "step_ms": round(step_s * 1000, 2),
        "first_loss": round(first_loss, 5),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
    }


def run_cold(config: str, overrides: list[str], mode: str, device: str, repeats: int) -> dict[str, Any]:
    """A row in a child process with an empty compile cache of its own (removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix="layer-compile-") as cache:
        # TMPDIR too: on CPU Inductor's precompiled headers follow it, not TORCHINDUCTOR_CACHE_DIR.
        environ = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor", "TMPDIR": cache}
        environ.pop("TRITON_CACHE_DIR", None)  # Triton kernels inside the Inductor folder: cold too
        command = [
            sys.executable,
            "-m",
            "bench.kernels.layer_compile",
            "--child",
            "--mode",
            mode,
            "--device",
            device,
        ]
        command += ["--config", config, "--repeats", str(repeats)]
        command += [arg for item in overrides for arg in ("--set", item)]
        done = subprocess.run(command, env=environ, cwd=ROOT, capture_output=True, text=True, check=False)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return dict(json.loads(line[len(RESULT_PREFIX) :]))
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"recipe": Path(config).stem, "mode": mode, "error": f"exit {done.returncode}: {tail}"}


def add_ratios(rows: list[dict[str, Any]]) -> None:
    base = {r["recipe"]: r["step_ms"] for r in rows if r["mode"] == "layers" and "step_ms" in r}
    for row in rows:
        if row["recipe"] in base and "step_ms" in row:
            row["vs_layers"] = round(row["step_ms"] / base[row["recipe"]], 4)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", action="append", help="trainer config (repeatable); default both recipes")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="section.key=value")
    parser.add_argument("--mode", action="append", choices=MODES, help="only these modes (repeatable)")
    parser.add_argument("--device", default=None, help="cuda:N (default: cuda:0, or cpu with --tiny)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--tiny", action="store_true", help="CPU: tiny-cpu at small shapes, SDPA")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help="default bench/results/layer_compile.json")
    args = parser.parse_args()

    if args.child:
        row = measure(args.config[0], args.overrides, args.mode[0], args.device, args.repeats)
        print(RESULT_PREFIX + json.dumps(row), flush=True)
        return 0

    from bench.lib.roles import RESULTS, print_rows, write_result

    configs = ["tiny-cpu"] if args.tiny else (args.config or ["qwen3-8b-b16", "seed-b32"])
    overrides = [*TINY, *args.overrides] if args.tiny else args.overrides
    device = args.device or ("cpu" if args.tiny else "cuda:0")  # set_device needs an index
    began = time.perf_counter()
    rows: list[dict[str, Any]] = []
    out = args.out or RESULTS / ("layer_compile-cpu.json" if device == "cpu" else "layer_compile.json")
    for config in configs:
        for mode in args.mode or MODES:
            rows.append(run_cold(config, overrides, mode, device, args.repeats))
            add_ratios(rows)
            write_result(out, {"rows": rows, "overrides": overrides, "device": device})
    result = {
        "rows": rows,
        "overrides": overrides,
        "device": device,
        "wall_s": round(time.perf_counter() - began, 1),
    }
    write_result(out, result)
    print_rows(f"compile the layer, not the stack ({device}, cold cache per row)", COLUMNS, rows)
    for row in rows:
        if "error" in row:
            print(f"note: {row['recipe']}/{row['mode']}: {row['error']}")
    print(f"wrote {out}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
