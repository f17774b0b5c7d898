"""The frozen target model: loaded once, one way, and its hidden states captured for the drafter.

Owns: loading the target, its frozen embedding and head, and the transformers cache-argument shim (`load`;
the dtype comes from `trainer.model.device`), the forward hooks that keep the chosen layers' outputs and the
captured batch they make (`capture`, `LayerOutputs`), and the embedded tiny presets (`tiny`).
May import: `trainer.runspec`, `trainer.model`, `dflash_base`, torch, transformers.
"""
