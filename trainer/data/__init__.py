"""Training sequences: where they come from, how they are split, ordered and rendered.

Owns: the sequence sources and the train/held-out split (`sources`), the seeded batch order (`order`), chat
rendering with its supervision mask (`chat`), and the preview of what a run will train on (`preview`).
May import: `trainer.spec`, `trainer.model`, `trainer.target_model`, `dflash_base`, torch, transformers.
"""
