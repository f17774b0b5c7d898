"""The audit, one module per area. Each module registers its checks with `@check(...)`.

Every check takes the shared, read-only CheckContext and returns findings; see
dflash_doctor/registry.py. Every check has a test where it fires and one where it stays quiet.
"""
