"""The DFlash drafter trainer: N target ranks + M drafter ranks under torchrun."""
