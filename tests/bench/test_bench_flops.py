"""The benchmarks' FLOP conventions: the target matches REFERENCE.md's numbers; mask pairs are exact."""

from __future__ import annotations

import torch

from bench.lib.flops import attended_pairs, linear_params_per_layer, target_flops
from trainer.model.anchors import sample_anchors
from trainer.model.attention import dense_mask
from trainer.runspec.target_shapes import qwen3_8b_config


def test_target_flops_match_the_reference_planning_numbers() -> None:
    cfg = qwen3_8b_config()
    assert 6.5e9 < 34 * linear_params_per_layer(cfg) < 6.7e9  # "~6.6B body params" up to layer 33
    assert 42e12 < target_flops(cfg, 3072, 34, lm_head=False) < 47e12  # "~43 TFLOP at S=3072"
    assert 950e12 < target_flops(cfg, 40000, 34, lm_head=False) < 1000e12  # "~970 TFLOP at S=40000"
    head = target_flops(cfg, 3072, 34, lm_head=True) - target_flops(cfg, 3072, 34, lm_head=False)
    assert head == 2 * 151936 * 4096 * 3072


def test_attended_pairs_equal_the_dense_mask() -> None:
    gen = torch.Generator().manual_seed(0)
    loss_mask = torch.ones(2, 200, dtype=torch.bool)
    loss_mask[1, 150:] = False  # short second row: padding anchors
    anchors, valid = sample_anchors(loss_mask, 160, 8, gen)
    assert not valid.all()
    assert attended_pairs(anchors, valid, 8) == float(dense_mask(anchors, valid, 200, 8).sum())
