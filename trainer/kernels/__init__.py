"""The trainer's own GPU kernels, in one place: each a Triton kernel with its torch reference beside it, run
under Triton's CPU interpreter by the tests.

Owns: attention over a KV cache whose rows sit at their own lengths, for a decode step, a verified block or
a drafted block (`cached_attention`).
May import: torch, triton (lazily: a CPU build of torch has no triton), `dflash_base`.
"""
