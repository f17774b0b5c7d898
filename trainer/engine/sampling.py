"""Choosing the next token, greedy or sampled, so that a sampled answer is a function of its own key.

A sampled answer must be reproducible from (seed, prompt id, sample index) whatever batch it was decoded in,
whichever slot it sat in and however often the job was killed and resumed: so no generator is shared across
rows. Each row carries a 64-bit key (`row_key`); the token at step t is drawn by inverse-CDF sampling from
the row's (temperature-scaled, top-p-trimmed) distribution with one uniform number that is a pure function
of (key, t) (`uniforms`: a SplitMix64 hash, the same integer arithmetic on every device). Greedy ignores keys.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_MASK64 = (1 << 64) - 1


def row_key(seed: int, prompt_id: str, sample: int, turn: int = 0) -> int:
    """The key of one answer: which job (seed), which prompt, which of its samples, which assistant turn.
    A signed 63-bit integer (it travels in an int64 tensor)."""
    text = f"{seed}\x1f{prompt_id}\x1f{sample}\x1f{turn}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


def _splitmix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser on int64 tensors: multiplications wrap mod 2^64 as on the real algorithm;
    the logical right shifts are arithmetic shifts masked to the bits a logical one keeps."""

    def shr(v: torch.Tensor, bits: int) -> torch.Tensor:
        return (v >> bits) & ((1 << (64 - bits)) - 1)

    x = x + _signed(0x9E3779B97F4A7C15)
    x = (x ^ shr(x, 30)) * _signed(0xBF58476D1CE4E5B9)
    x = (x ^ shr(x, 27)) * _signed(0x94D049BB133111EB)
    return x ^ shr(x, 31)


def _signed(value: int) -> int:
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def uniforms(keys: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """One number in [0, 1) per row, a pure function of (key, step): float64, 53 random bits."""
    import torch

    mixed = _splitmix64(_splitmix64(keys.to(torch.int64)) ^ steps.to(torch.int64))
    return (shr53(mixed)).to(torch.float64) / float(1 << 53)


def shr53(x: torch.Tensor) -> torch.Tensor:
    """The top 53 bits of a 64-bit word, as a non-negative int64."""
    return (x >> 11) & ((1 << 53) - 1)


def choose_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    keys: torch.Tensor | None = None,
    steps: torch.Tensor | None = None,
) -> torch.Tensor:
    """The next token of each row of `logits` (rows, vocab): the argmax when `temperature` is 0, else a draw
    from softmax(logits / temperature) cut to its top-p nucleus, with `uniforms(keys, steps)`."""
    import torch

    if temperature <= 0:
        return logits.argmax(dim=-1)
    if keys is None or steps is None:
        raise ValueError("sampling needs a key and a step for every row")
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    cumulative = sorted_probs.cumsum(dim=-1)
    # The nucleus: the fewest most likely tokens whose mass reaches top_p (the first always kept).
    keep = (cumulative - sorted_probs) < top_p
    kept = sorted_probs * keep
    mass = kept.sum(dim=-1, keepdim=True)
    u = uniforms(keys, steps).to(probs.device).unsqueeze(-1) * mass.double()
    below = (kept.cumsum(dim=-1).double() <= u).sum(dim=-1, keepdim=True)
    index = below.clamp(max=keep.sum(dim=-1, keepdim=True) - 1)
    return order.gather(-1, index).squeeze(-1)
