"""`eval`: what a trained drafter is worth, by real speculative decoding against target-only greedy decoding.

Owns: the reference decoding loop, one prompt at a time (`speculative`), what proposes a block (`proposers`:
the drafter, prompt lookup), the tie classification of two decodes (`compare`), the prompts it decodes
(`prompts`), the evaluation and its figures (`evaluate`) and the text report (`report`).
May import: `trainer.runspec`, `trainer.model`, `trainer.target_model`, `trainer.data`, `trainer.engine`,
`dflash_base`. Never `trainer.run` or `trainer.regenerate`.
"""
