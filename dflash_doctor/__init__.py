"""dflash-doctor: audit multi-GPU PyTorch environments and train DFlash drafters."""

__version__ = "0.1.0"
