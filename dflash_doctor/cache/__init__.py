"""The compile-cache store: where the Inductor/Triton caches live, what build they are for, and
fingerprinted, verified, crash-safe snapshots of them (`dflash-doctor cache ...`).

Module map: locations (where), inspection (what is there), fingerprint (what build), manifest (what an
archive promises), archive (write and verify archives), store (the snapshot folder and its lock),
restore (verify into staging, then swap with renames), warm (compile, then snapshot), warm_record
(which warm-ups already ran). `warm_child` is a script run by path in the audited interpreter: its
optional import of `trainer.run.warmup` happens in that other process, not here.

May import: `env` and the core.
"""
