"""The drafter and its math: what a DFlash drafter computes and how it is built, exported and loaded.

Owns: the drafter stack (`drafter`), the DFlash attention mask and kernels (`attention`), the decayed
block loss (`loss`), anchor sampling (`anchors`), the captured batch a drafter trains on (`batch`), the
device and precision policy (`device`), building a drafter from a run config (`build`), one drafted block
(`drafting`, shared by held-out scoring and real decoding), and the engines' export format (`export`).
May import: `trainer.spec`, `dflash_base`, torch, safetensors.
"""
