"""The loader simulation: which file provides each shared library torch needs, as glibc would decide.

Owns: `ld.so.cache` and the default folders (`ldcache`), torch's own
`_preload_cuda_deps` (`preload`), soname classification (`sonames`), the pure resolution of one process
loading torch (`loader`), and `why PACKAGE` (`why`).

May import: `env` and the core. Never imports `cache`, `lock`, `launch`, `audit`, `commands` or `checks`.
"""
