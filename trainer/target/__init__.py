"""The frozen target model: loaded once, one way, and its hidden states captured for the drafter.

Owns: loading the target and its dtype policy (`load`), the forward hooks that keep the chosen layers'
outputs and the captured batch they make (`capture`), and the embedded tiny presets (`tiny`).
May import: `trainer.spec`, `trainer.model`, `dflash_base`, torch, transformers.
"""
