"""Analyses several checks share, computed once per `check` run through `CheckContext.shared`.

Owns: the package-level analyses (`packages`: requirement graph, torch's closure, the RECORD audit,
the pins a remedy installs) and the compile-cache walk (`cache`: the folders and the snapshot store, shared
by the `cache.*` checks and `cache status`). They join the lower layers' models, so they sit above them.

May import: `libs`, `cache`, `env` and the core. Checks import from here; nothing here imports a check.
"""
