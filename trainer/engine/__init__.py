"""The inference engine over the target: what `data regenerate` and `eval` both decode with.

Owns: the targets it serves (`support`), the target as it serves it, with its prompts and stop ids
(`target`), the decoder over a preallocated KV cache whose rows sit at their own lengths, with its captured
CUDA graphs (`decoder`), the scheduler that keeps every slot busy (`scheduler`: continuous batching, named
steps), the choice of the next token (`sampling`), and what a decode could have done at the GPU's peaks
(`roofline`).
May import: `trainer.runspec`, `trainer.kernels`, `trainer.model`, `trainer.target_model`, `dflash_base`.
Never `trainer.run`, `trainer.regenerate` or `trainer.eval` (they call it).
"""
