"""`eval`'s acceptance length beside vLLM's logged one (issue 38, Q5): tau counts every verify forward, one
that proposed nothing too (it emits one token); vLLM's "Mean acceptance length" is 1 + accepted / drafts,
counting only drafts that proposed a token (vllm/v1/spec_decode/metrics.py)."""

from __future__ import annotations

import json

import torch
from torch import Tensor

from trainer.eval.evaluate import evaluate
from trainer.eval.report import format_report
from trainer.eval.speculative import SpecTarget, greedy_decode
from trainer.model.drafter import DFlashDrafter, DrafterConfig
from trainer.runspec.target_shapes import tiny_qwen3_config
from trainer.target_model.tiny import build_embedded_target

PROMPT = [5, 17, 300, 42, 9, 77]


class EveryOtherOracle:
    """The target's own greedy continuation (accepted whole) on odd calls, nothing on even ones."""

    name, needs_features = "oracle", False

    def __init__(self, continuation: list[int], prompt_len: int, block: int) -> None:
        self.max_draft, self.sequence, self.prompt_len, self.calls = block - 1, continuation, prompt_len, 0

    def start(self) -> None:
        self.calls = 0

    def propose(self, ids: list[int], features: Tensor | None) -> list[int]:
        self.calls += 1
        if self.calls % 2 == 0:
            return []
        start = len(ids) - self.prompt_len
        return [self.sequence[min(start + k, len(self.sequence) - 1)] for k in range(self.max_draft)]


def test_the_figure_vllm_logs_leaves_out_forwards_that_proposed_nothing() -> None:
    """21 new tokens: the prefill's, then forwards emitting 4, 1, 4, 1, ... (20 in 8). tau = 20 / 8 = 2.5;
    vLLM's figure over the 4 forwards that proposed = 4.0."""
    target = SpecTarget(build_embedded_target("tiny", seed=0), [])
    greedy = greedy_decode(target, PROMPT, 30, None).tokens
    report = evaluate(target, EveryOtherOracle(greedy, len(PROMPT), 4), [PROMPT], max_new=21)
    assert report.identical and report.mean_accept_len == 2.5
    assert (report.mean_accept_len_proposed, report.forwards_without_proposal) == (4.0, 4)
    shown = json.loads(json.dumps(report.to_json()))
    assert shown["mean_accept_len_proposed"] == 4.0 and shown["forwards_without_proposal"] == 4
    assert "4.000 over the forwards that proposed something, as vLLM logs it (4 proposed nothing)" in (
        format_report(report)
    )


def test_for_the_drafter_which_always_proposes_the_two_figures_agree() -> None:
    model = build_embedded_target("tiny", seed=0)
    cfg = DrafterConfig.from_target(tiny_qwen3_config(), 1, 4, 511, [2])
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg, model.model.embed_tokens.weight, model.lm_head.weight)
    report = evaluate(SpecTarget(build_embedded_target("tiny", seed=0), [2]), drafter, [PROMPT], max_new=12)
    assert report.forwards_without_proposal == 0 and report.mean_accept_len_proposed == report.mean_accept_len
    assert "as vLLM logs it" not in format_report(report)
