"""Two engines' greedy answers that differ: a bf16 near-tie flip, or a real difference?

The KV engine and transformers' `generate` run the same greedy decode with different kernels (a Triton decode
attention against SDPA, a preallocated cache against a growing one, different batch shapes), so in bf16 their
logits differ in the last bits and where the target's top two are nearly tied the argmax can flip; after the
first differing token the two answers go their own ways. Only that first position says which it was.

Each pair's ids (the engines' own, else the answer text tokenised again) go through the target once: the
prompt and the shared prefix. At the next position the two engines' tokens a and b are a **tie** when both sit
at the top within the tolerance `eval` uses for the dtype (`trainer.eval.compare.default_tie_ulps`: 16 ulps
of the top logit in bf16, 64 in fp32), and **different** otherwise, with the margin (how far from the top each token is, in
logits) kept for the record. One forward is a third opinion beside the two engines' own: it decides which
flips were rounding. An answer that ended its turn ends in END, whose logit is the best of the target's stop
ids (an engine stops on any of them). Engines that keep no ids (a test's stand-in) are compared by their text
tokenised again, which can split a word differently from what the engine wrote.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from trainer.engine.target import Chat, prompt_ids
from trainer.eval.compare import default_tie_ulps, ulp
from trainer.regenerate.settings import Completion

END = -1  # an answer that ended its turn: the engines stop on any stop id, so the best of them is its logit


@dataclass(frozen=True)
class Flip:
    """The first position where two answers differ, judged by one forward over their shared prefix."""

    verdict: str  # "tie" | "different"
    at: int  # index among the answer's tokens
    token_a: int  # the first engine's token there (END where its answer ended its turn)
    token_b: int
    margin_a: float  # top logit - logit(a): 0 when a is the argmax
    margin_b: float
    allowed: float  # tie ulps x ulp(top logit), in logits


def answer_ids(tokenizer: Any, completion: Completion) -> list[int]:
    """The answer's tokens, ending in END when the target ended its turn: the ids the engine wrote where it
    kept them (`Completion.token_ids`), else its text tokenised again."""
    if completion.token_ids:
        ids = list(completion.token_ids)
        return [*ids[:-1], END] if completion.finish_reason == "stop" else ids
    ids = list(tokenizer(completion.text, add_special_tokens=False)["input_ids"])
    return [*ids, END] if completion.finish_reason == "stop" else ids


def classify_flip(
    model: Any,
    prompt: list[int],
    a: list[int],
    b: list[int],
    tie_ulps: int,
    stop_ids: Sequence[int] = (),
) -> Flip | None:
    """None when the token lists agree (one may be a prefix of the other: then the shorter one was cut
    at the cap and there is no pair of tokens to compare)."""
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if at is None:
        return None
    device = next(model.parameters()).device
    ids = torch.tensor([prompt + a[:at]], device=device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1].float()
    top = float(logits.max())

    def logit(token: int) -> float:
        return max(float(logits[i]) for i in stop_ids) if token == END else float(logits[token])

    margin_a, margin_b = top - logit(a[at]), top - logit(b[at])
    allowed = tie_ulps * ulp(top, next(model.parameters()).dtype)
    verdict = "tie" if margin_a <= allowed and margin_b <= allowed else "different"
    return Flip(verdict, at, a[at], b[at], margin_a, margin_b, allowed)


def classify_answers(
    model: Any,
    tokenizer: Any,
    stop_ids: Sequence[int],
    chats: Sequence[Chat],
    first: Sequence[Completion],
    second: Sequence[Completion],
    template_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Counts of identical, tie and different answers over the pairs, and the differing ones' details."""
    dtype = next(model.parameters()).dtype
    tie_ulps = default_tie_ulps(dtype)
    counts = {"identical": 0, "tie": 0, "different": 0, "cut_prefix": 0}
    flips: list[dict[str, Any]] = []
    for index, (chat, x, y) in enumerate(zip(chats, first, second, strict=False)):
        if x.text == y.text and x.finish_reason == y.finish_reason:
            counts["identical"] += 1
            continue
        a, b = answer_ids(tokenizer, x), answer_ids(tokenizer, y)
        prompt = prompt_ids(tokenizer, chat, template_kwargs or {})
        flip = classify_flip(model, prompt, a, b, tie_ulps, stop_ids)
        if flip is None:  # same tokens, one cut shorter (or texts that tokenise alike)
            counts["cut_prefix"] += 1
            continue
        counts[flip.verdict] += 1
        flips.append({"answer": index, **asdict(flip)})
    worst_tie = max((f["margin_a"] + f["margin_b"] for f in flips if f["verdict"] == "tie"), default=None)
    return {
        **counts,
        "tie_ulps": tie_ulps,
        "dtype": str(dtype).removeprefix("torch."),
        "worst_tie_margin": worst_tie,
        "different_examples": [f for f in flips if f["verdict"] == "different"][:8],
    }
