"""Code the benchmarks share; never run directly.

Owns: building each trainer role at a recipe's shapes and timing it (`roles`), the FLOP and MFU
conventions (`flops`), and the suites' guarded stages under one time budget (`suite_lib.sh`, sourced).
May import: `trainer`, `dflash_doctor`, `dflash_base`, torch. Never a script of another `bench/` folder.
"""
