"""Benchmarks: each script measures one thing, prints a table and writes JSON under `bench/results/`.

Grouped by what is measured; shared code and device suites apart:

    lib/       shared code only, never run: role builders and timing (`roles`), FLOP conventions (`flops`),
               the suites' stage runner (`suite_lib.sh`)
    doctor/    speed and correctness of the audit (`check`, ownership hashing, remedies, visible devices)
    cache/     the compile-cache store and warm start (snapshot, restore, kill loops, cold compile)
    kernels/   one role on one device: step time, FLOPs, MFU, kernel options, role rates
    e2e/       through `dflash-doctor train`: time to first step, throughput, stopping, import times
    decode/    inference: speculative-decoding eval, held-out estimate, regeneration
    suites/    shell only: the sequence of scripts one device call runs (`bash bench/suites/<name>.sh`)
    results/   what the scripts wrote (H200 results under `results/h200/`)

One rule for running: a script is run by its path from the repository root (`python3
bench/kernels/drafter_step.py`, as the suites do); its first lines put the repository root
(`Path(__file__).resolve().parents[2]`) on `sys.path`, so `bench.lib` and `trainer` import without an
install. `python3 -m bench.kernels.drafter_step` from the root works too. Nothing shipped (`dflash_base`,
`dflash_doctor`, `trainer`, `checks`) imports `bench` (`tests/test_layers.py`).
"""
