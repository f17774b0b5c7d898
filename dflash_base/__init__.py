"""The few pieces the doctor and the trainer share: errors a person can act on, atomic writes, stop signals.

Owns: `errors` (DoctorError and its kinds: exit code 2), `atomic` (write beside, then rename), `stopping`
(SIGINT/SIGTERM/SIGHUP as one exception, exit 128+N), `disk` (a full disk as one error naming the file and the bytes), `timeline` (the launch timeline's marks,
appended by the launcher's workers to a file the launcher names).
May import: the standard library only. Both `dflash_doctor` and `trainer` import this package; it imports
neither, so neither side reaches into the other's insides through it.
"""
