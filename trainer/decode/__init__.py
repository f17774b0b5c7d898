"""Inference with the target: real speculative decoding (`eval`), and the data the target writes itself.

Owns: greedy and speculative decoding (`speculative`), the eval that runs them over prompts (`eval`) and its
text report (`report`), the tie classification of two decodes (`compare`), batched generation engines (`generation`), `data regenerate` (`regenerate`) and its prompt and
conversation records (`conversations`).
May import: `trainer.spec`, `trainer.model`, `trainer.target_model`, `trainer.data`, `dflash_base`. Never
`trainer.run` (a sibling on the same floor).
"""
