"""Analyses several checks share, computed once per `check` run through `CheckContext.shared`.

Owns: the package-level analyses (`packages`: requirement graph, torch's closure, the RECORD audit,
the pins a remedy installs). They join the environment model with the loader simulation, so they sit
above both.

May import: `libs`, `env` and the core. Checks import from here; nothing here imports a check.
"""
