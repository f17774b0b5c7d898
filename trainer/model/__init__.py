"""The drafter and its math: what a DFlash drafter computes and how it is built, exported and loaded.

Owns: the drafter stack (`drafter`), the DFlash attention mask and kernels (`attention`), the decayed
block loss (`loss`), anchor sampling (`anchors`), the captured batch a drafter trains on and its padding
(`batch`), the device and precision policy (`device`), building a drafter from a run config (`build`), and
the engines' export format (`export`). A drafted block's inputs are built in one place
(`DFlashDrafter.block_inputs`): held-out scoring drafts a batch over the whole context (`draft_tokens`),
decoding one block over a context cache (`draft_after`), through the same layers.
May import: `trainer.runspec`, `trainer.kernels`, `dflash_base`, torch, safetensors.
"""
