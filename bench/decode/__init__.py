"""Inference with the target: real speculative decoding against target-only greedy, the held-out
acceptance estimate against real decoding and what it costs, and `data regenerate`'s throughput."""
