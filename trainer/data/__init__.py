"""Training sequences: where they come from, how they are split, ordered and rendered.

Owns: the sequence sources and the train/held-out split (`sources`), the seeded batch order (`order`), chat
rendering with its supervision mask (`chat`), the preview of what a run will train on (`preview`), and the
worker processes that make a rank's first-epoch sequences ahead of its batches (`prefetch`).
May import: `trainer.runspec`, `trainer.model`, `trainer.target_model`, `dflash_base`, torch, transformers.
"""
