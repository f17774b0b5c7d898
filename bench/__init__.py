"""Benchmarks: each script measures one thing, prints a table and writes JSON under `bench/results/`.

Grouped by what is measured; shared code and device suites apart:

    lib/       shared code only, never run: role builders and timing (`roles`), FLOP conventions (`flops`),
               the tiny target's folder (`target_folder`) and cache trees (`cache_trees`) the tests use too,
               the suites' stage runner (`suite_lib.sh`)
    doctor/    speed and correctness of the audit (`check`, ownership hashing, remedies, visible devices)
    check/     where `check`'s seconds go (cold and warm runs, the RECORD survey, what forking costs)
    launch/    time to first step of `train`, split into the launcher's phases
    cache/     the compile-cache store and warm start (snapshot, restore, kill loops, cold compile)
    kernels/   one role on one device: step time, FLOPs, MFU, kernel options, role rates
    e2e/       through `dflash-doctor train`: time to first step, throughput, stopping, import times
    decode/    inference: speculative-decoding eval, held-out estimate, regeneration
    suites/    shell only: the sequence of scripts one device call runs (`bash bench/suites/<name>.sh`)
    results/   what the scripts wrote (H200 results under `results/h200/`)

One rule for running: a script runs as a module from the repository root (`python3 -m
bench.kernels.drafter_step`, as the suites do), where `-m` finds `bench`, `trainer` and `dflash_doctor` whether
the project is installed or not. No script changes the import path or imports `tests` (what a script shares
with the tests lives in `bench/lib/`): tests/bench/test_bench_package.py. Nothing shipped (`dflash_base`,
`dflash_doctor`, `trainer`, `checks`) imports `bench` (`tests/test_layers.py`).
"""
