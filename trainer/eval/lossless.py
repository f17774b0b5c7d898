"""Lossless, checked on every token: each emitted token against one target forward over the final sequence.

Speculative decoding must emit, at every position, the target's greedy choice after the emitted prefix. Comparing
its output with target-only greedy decoding's says only where the two first part (after that the contexts differ):
the first flip of a 64-token answer came at token 32, median, and nothing after it was looked at. Here every
output (the drafter's, prompt lookup's, target-only greedy's too) is run through the target once, whole (prompt
and answer), and each emitted token's logit is set beside the top logit at its position:

- `exact`: the token is the argmax;
- `near-tie`: it is not, but its logit is within `--tie-ulps` units in the last place of the top logit, in
  the compute dtype (bf16 keeps 8 significant bits: an ulp at a logit of 20 is 0.125; the default, 8 ulps, is
  trainer.eval.compare's). A verify forward of B
  tokens, a 1-token decode step and this whole-sequence forward sum in different orders, and their logits
  differ in the last bits; where the top two nearly tie, the argmax can differ. Target-only greedy's own
  tokens show how often that happens without any drafter;
- `off`: further than that: a token the target did not choose (a bug).

The same forward classifies where a speculative output first parts from target-only greedy's: at that position
both have the same prefix, so the two tokens' logits there say whether the parting is a near-tie.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from trainer.eval.compare import Comparison, Verdict, default_tie_ulps, ulp

ROWS_PER_FORWARD = 8  # sequences a checking forward holds (its logits are only the answer positions')


@dataclass
class TokenCheck:
    """One decoding's tokens, checked (see the module docstring)."""

    drafter: str
    checked: int = 0
    exact: int = 0
    near_ties: int = 0
    off: int = 0
    worst_ulps: float = 0.0  # the largest distance below the top logit of a token that was not the argmax
    tolerance_ulps: int = 0
    dtype: str = ""
    off_at: list[dict[str, int]] = field(
        default_factory=list
    )  # the first few: prompt, new-token index, token

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@torch.inference_mode()
def check_outputs(
    model: Any,
    prompts: list[list[int]],
    outputs: list[list[int]],
    drafter: str,
    tolerance_ulps: int | None = None,
    parting: dict[int, tuple[int, int, int]] | None = None,
) -> tuple[TokenCheck, dict[int, Comparison]]:
    """Every token of every output against the target's forward over prompt + output. `parting`: per prompt
    index, (new-token index, greedy's token a, this output's token b) where it first differs from target-only
    greedy; returns the comparison there (a tie when |logit(a) - logit(b)| is within the tolerance)."""
    weight = next(model.parameters())
    dtype, device = weight.dtype, weight.device
    ulps = default_tie_ulps(dtype) if tolerance_ulps is None else tolerance_ulps
    check = TokenCheck(drafter, tolerance_ulps=ulps, dtype=str(dtype).removeprefix("torch."))
    comparisons: dict[int, Comparison] = {}
    parting = parting or {}
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + len(outputs[i]))
    for start in range(0, len(order), ROWS_PER_FORWARD):
        batch = [i for i in order[start : start + ROWS_PER_FORWARD] if outputs[i]]
        if not batch:
            continue
        width = max(len(prompts[i]) + len(outputs[i]) for i in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        for row, i in enumerate(batch):  # right-padded: causal, so a pad never changes what comes before it
            sequence = prompts[i] + outputs[i]
            ids[row, : len(sequence)] = torch.tensor(sequence)
        hidden = model.model(input_ids=ids.to(device), use_cache=False).last_hidden_state
        for row, i in enumerate(batch):
            first = len(prompts[i]) - 1  # the position whose logits chose the first new token
            rows = hidden[row, first : first + len(outputs[i])]
            logits = model.lm_head(rows).float()  # (new tokens, vocab)
            _count(check, logits, outputs[i], i, ulps, dtype)
            if i in parting:
                comparisons[i] = _parting(logits, *parting[i], ulps, dtype)
    return check, comparisons


def _count(
    check: TokenCheck, logits: torch.Tensor, tokens: list[int], prompt: int, ulps: int, dtype: Any
) -> None:
    wanted = torch.tensor(tokens, device=logits.device)
    top, best = logits.max(-1)
    mine = logits.gather(1, wanted[:, None])[:, 0]
    gap = (top - mine).tolist()
    for index, (token, argmax, below, peak) in enumerate(
        zip(tokens, best.tolist(), gap, top.tolist(), strict=True)
    ):
        check.checked += 1
        if token == argmax:
            check.exact += 1
            continue
        distance = below / ulp(peak, dtype)
        check.worst_ulps = max(check.worst_ulps, round(distance, 2))
        if distance <= ulps:
            check.near_ties += 1
        else:
            check.off += 1
            if len(check.off_at) < 8:
                check.off_at.append({"prompt": prompt, "index": index, "token": token, "argmax": argmax})


def _parting(logits: torch.Tensor, index: int, a: int, b: int, ulps: int, dtype: Any) -> Comparison:
    """Where an output first parts from target-only greedy's: a (greedy's) and b (this one's) at `index`,
    rated by one forward over the shared prefix."""
    row = logits[index]
    logit_a, logit_b = float(row[a]), float(row[b])
    allowed = ulps * ulp(float(row.max()), dtype)
    margin = logit_a - logit_b
    verdict: Verdict = "tie" if abs(margin) <= allowed else "different"
    return Comparison(verdict, index, a, b, margin, -margin, allowed)
