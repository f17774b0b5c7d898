"""The compile-cache store and warm start: snapshot and verified restore against tar, SIGKILL loops on the
store, listing old archives, a compiled kernel's first call cold / warm / restored, and where a cold
warm-up's seconds go."""
