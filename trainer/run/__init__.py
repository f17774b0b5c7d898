"""One distributed training run, under torchrun: the loop and everything it drives.

Owns: the loop and the roles (`train`), the run's schedule (`schedule`), target-to-drafter streaming
(`transport`, `pipeline`), the step numbers a drafter reports one step late (`step_numbers`), checkpoints
(`checkpoint`), metrics and their sinks (`metrics`, `metric_sinks`), the optimizer (`optim`), held-out
scoring (`heldout`), the warm-up that compiles before the loop (`warmup`), and the process plumbing
(`startup`, `parent_watch`, `faults`, `profiling`).
May import: `trainer.runspec`, `trainer.kernels`, `trainer.model`, `trainer.target_model`, `trainer.data`,
`dflash_base`. Never `trainer.engine` (a sibling on the same floor), `trainer.regenerate` or `trainer.eval`.
"""
