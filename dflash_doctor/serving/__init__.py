"""Will a serving engine load this export? (`dflash-doctor serve-check`)

Owns: the loader scripts that load a DFlash export with the real engine, each run by path in the engine's
own python (`vllm_loader`, `sglang_loader`: they import nothing from dflash-doctor, only the engine and the
standard library), and `check`, which runs one and turns its JSON verdict into findings.

May import: the core (`findings`, `errors`, `processes`).
"""
