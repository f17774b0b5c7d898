"""Code the benchmarks share; never run directly.

Owns: building each trainer role at a recipe's shapes and timing it (`roles`), the FLOP and MFU
conventions (`flops`), the tiny target as a Hugging Face folder (`target_folder`) and synthetic compile-cache
trees (`cache_trees`), which the tests use too, and the suites' guarded stages under one time budget
(`suite_lib.sh`, sourced).
May import: `trainer`, `dflash_doctor`, `dflash_base`, torch. Never a script of another `bench/` folder, never
`tests` (the tests import from here instead).
"""
