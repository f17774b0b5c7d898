"""The known-good environment, recorded (`lockfile`), and what changed since (`drift`).

Owns: building, writing and reading `dflash.lock` (packages with WHEEL tags and RECORD digests, torch
commit, hashes of every library torch resolves to, driver, GPUs, relevant variables), and the pure
comparison of two locks that `diff`, `check --lock` and run records share.

May import: `libs`, `env` and the core.
"""
