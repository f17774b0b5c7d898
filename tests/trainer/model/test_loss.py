"""The loss: labels at anchor + k (no shift), slot 0 excluded, decay weights, chunking, statistics."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.trainer.drafter_fixtures import tiny_batch, tiny_config, tiny_drafter
from trainer.model.loss import (
    block_targets,
    chunked_weighted_ce,
    default_gamma,
    dflash_loss,
    even_chunk,
    expected_acceptance_length,
    slot_weights,
)


def ce_inputs(rows: int, width: int, vocab: int, seed: int) -> tuple[torch.Tensor, ...]:
    """hidden (rows, width) needing a gradient, a head (vocab, width), labels and weights, seeded."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, width, generator=gen, requires_grad=True)
    head = torch.randn(vocab, width, generator=gen)
    labels = torch.randint(0, vocab, (rows,), generator=gen)
    return hidden, head, labels, torch.rand(rows, generator=gen)


def test_even_chunk_splits_rows_into_equal_parts_no_larger_than_asked() -> None:
    assert even_chunk(3584, 2048) == 1792  # two equal chunks instead of 2048 + 1536
    assert even_chunk(7680, 2048) == 1920
    assert even_chunk(100, 1000) == 100 and even_chunk(1, 1) == 1
    for rows in range(1, 200):
        for chunk in (1, 7, 64, 500):
            step = even_chunk(rows, chunk)
            assert step <= chunk and step * -(-rows // step) >= rows


def test_compiled_chunk_equals_eager_in_value_and_gradient() -> None:
    hidden, head, labels, weights = ce_inputs(rows=36, width=16, vocab=50, seed=1)
    eager, eager_correct = chunked_weighted_ce(hidden, head, labels, weights, chunk=10)
    (eager_grad,) = torch.autograd.grad(eager, hidden)
    fast, fast_correct = chunked_weighted_ce(hidden, head, labels, weights, chunk=10, compiled=True)
    (fast_grad,) = torch.autograd.grad(fast, hidden)
    torch.testing.assert_close(fast, eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast_grad, eager_grad, rtol=1e-5, atol=1e-5)
    assert torch.equal(fast_correct, eager_correct)


def test_gamma_defaults_follow_the_recipe() -> None:
    assert default_gamma(16) == 7.0 and default_gamma(10) == 5.0 and default_gamma(8) == 4.0
    assert default_gamma(12) == pytest.approx(5 + 2 / 3)  # between 10 and 16
    assert default_gamma(9) == 4.5 and default_gamma(4) == 2.0  # B/2 below 10
    assert default_gamma(32) == pytest.approx(7 + 16 / 3)  # the 10..16 slope beyond 16
    assert default_gamma(2) == 1.0  # floor
    gammas = [default_gamma(size) for size in range(2, 65)]
    assert gammas == sorted(gammas)


def test_slot_weights() -> None:
    w = slot_weights(16, 7.0)
    assert w[0] == 0 and w[1] == 1
    for k in range(1, 16):
        assert w[k].item() == pytest.approx(math.exp(-(k - 1) / 7))


def test_labels_are_the_tokens_at_anchor_plus_k_not_shifted() -> None:
    input_ids = torch.arange(100, 120).view(1, 20)  # token at position p is 100 + p
    loss_mask = torch.ones(1, 20, dtype=torch.bool)
    anchors = torch.tensor([[3, 10]])
    labels, supervised = block_targets(input_ids, loss_mask, anchors, torch.tensor([[True, True]]), 4)
    assert labels.tolist() == [[[103, 104, 105, 106], [110, 111, 112, 113]]]
    assert supervised[..., 0].sum() == 0  # slot 0 (the anchor itself) is never supervised
    assert supervised[..., 1:].all()


def test_slots_past_the_end_off_the_mask_or_of_invalid_anchors_are_excluded() -> None:
    input_ids = torch.arange(10).view(1, 10)
    loss_mask = torch.ones(1, 10, dtype=torch.bool)
    loss_mask[0, 5] = False
    anchors = torch.tensor([[3, 8, 0]])
    valid = torch.tensor([[True, True, False]])
    labels, supervised = block_targets(input_ids, loss_mask, anchors, valid, 4)
    assert supervised.tolist() == [
        [[False, True, False, True], [False, True, False, False], [False, False, False, False]]
    ]
    assert labels[0, 1].tolist() == [8, 9, 0, 0]  # positions 10, 11 do not exist: label 0, unsupervised


def test_chunked_equals_unchunked_in_value_and_gradient() -> None:
    hidden, head, labels, weights = ce_inputs(rows=37, width=16, vocab=50, seed=0)

    whole, correct_whole = chunked_weighted_ce(hidden, head, labels, weights, chunk=10_000)
    (grad_whole,) = torch.autograd.grad(whole, hidden)
    parts, correct_parts = chunked_weighted_ce(hidden, head, labels, weights, chunk=5)
    (grad_parts,) = torch.autograd.grad(parts, hidden)

    plain = (F.cross_entropy(hidden @ head.T, labels, reduction="none") * weights).sum()
    (grad_plain,) = torch.autograd.grad(plain, hidden)
    torch.testing.assert_close(whole, plain)
    torch.testing.assert_close(grad_whole, grad_plain)  # the gradient computed in forward is autograd's
    torch.testing.assert_close(parts, whole)
    torch.testing.assert_close(grad_parts, grad_whole)
    assert torch.equal(correct_parts, correct_whole)


def test_gradient_kept_from_forward_is_scaled_by_the_upstream_gradient() -> None:
    hidden, head, labels, weights = ce_inputs(rows=12, width=8, vocab=30, seed=2)
    total, _ = chunked_weighted_ce(hidden, head, labels, weights, chunk=5)
    (grad_scaled,) = torch.autograd.grad(total * 3.0 / weights.sum(), hidden)
    plain = (F.cross_entropy(hidden @ head.T, labels, reduction="none") * weights).sum()
    (grad_plain,) = torch.autograd.grad(plain * 3.0 / weights.sum(), hidden)
    torch.testing.assert_close(grad_scaled, grad_plain)


def test_without_grad_the_loss_is_the_same_and_nothing_is_kept() -> None:
    hidden, head, labels, weights = ce_inputs(rows=12, width=8, vocab=30, seed=3)
    with torch.no_grad():
        total, correct = chunked_weighted_ce(hidden, head, labels, weights, chunk=5)
    assert total.grad_fn is None
    with_grad, correct_with_grad = chunked_weighted_ce(hidden, head, labels, weights, chunk=5)
    torch.testing.assert_close(total, with_grad.detach())
    assert torch.equal(correct, correct_with_grad)


def test_a_trainable_head_is_refused() -> None:
    head = torch.randn(30, 8, requires_grad=True)
    with pytest.raises(ValueError, match="frozen"):
        chunked_weighted_ce(torch.randn(4, 8), head, torch.zeros(4, dtype=torch.long), torch.ones(4), chunk=2)


def reference_loss(hidden, head, input_ids, loss_mask, anchors, valid, gamma):  # type: ignore[no-untyped-def]
    """The recipe, one anchor and one slot at a time."""
    total, weight_sum = 0.0, 0.0
    batch, num_anchors, block, _ = hidden.shape
    seq_len = input_ids.shape[1]
    correct, counted, accept = [0.0] * block, [0.0] * block, 0.0
    for b in range(batch):
        for n in range(num_anchors):
            if not valid[b, n]:
                continue
            a = int(anchors[b, n])
            run, broken = 0, False
            for k in range(1, block):
                pos = a + k
                if pos >= seq_len or not loss_mask[b, pos]:
                    broken = True
                    continue
                logits = hidden[b, n, k] @ head.T
                target = int(input_ids[b, pos])
                w = math.exp(-(k - 1) / gamma)
                total += w * F.cross_entropy(logits.unsqueeze(0), torch.tensor([target])).item()
                weight_sum += w
                hit = int(logits.argmax()) == target
                correct[k] += hit
                counted[k] += 1
                if hit and not broken:
                    run += 1
                else:
                    broken = True
            accept += 1 + run
    return total / weight_sum, correct, counted, accept


def test_model_loss_equals_the_slot_by_slot_reference() -> None:
    cfg = tiny_config(block_size=4)
    model = tiny_drafter(cfg, loss_chunk=7)
    # Two live tokens with opposite head rows: every prediction is 0 or 1, about half of them right,
    # so the accuracy and acceptance statistics are exercised, not just the loss.
    with torch.no_grad():
        model.lm_head_weight[2:] = 0
        model.lm_head_weight[1] = -model.lm_head_weight[0]
    batch = tiny_batch(cfg, num_anchors=6)
    batch["input_ids"] = batch["input_ids"] % 2
    out = model(**batch)
    with torch.no_grad():
        hidden = model.draft_hidden(
            batch["input_ids"], batch["hidden"], batch["anchors"], batch["anchor_valid"]
        )
    loss, correct, counted, accept = reference_loss(
        hidden,
        model.lm_head_weight,
        batch["input_ids"],
        batch["loss_mask"],
        batch["anchors"],
        batch["anchor_valid"],
        model.gamma,
    )
    assert out.loss.item() == pytest.approx(loss, rel=1e-5)
    assert out.correct.tolist() == correct and out.counted.tolist() == counted
    assert out.accept_len_sum.item() == accept
    assert sum(correct) > 0 and accept > out.anchors.item()  # the statistics were exercised

    # The same reference with labels shifted by one (a known bug elsewhere) gives another loss.
    shifted = torch.roll(batch["input_ids"], shifts=-1, dims=1)
    wrong, *_ = reference_loss(
        hidden,
        model.lm_head_weight,
        shifted,
        batch["loss_mask"],
        batch["anchors"],
        batch["anchor_valid"],
        model.gamma,
    )
    assert abs(wrong - loss) > 1e-3


def test_loss_weights_decay_with_the_slot() -> None:
    """A wrong prediction in slot 1 costs more than the same wrong prediction in slot 3."""
    block, width, vocab = 4, 8, 11
    head = torch.eye(vocab, width)
    labels = torch.full((1, 1, block), 2)
    supervised = torch.tensor([[[False, True, True, True]]])
    valid = torch.tensor([[True]])

    def hidden_with_miss_at(slot: int) -> torch.Tensor:
        hidden = torch.zeros(1, 1, block, width)
        hidden[..., 2] = 5.0  # right answer everywhere ...
        hidden[0, 0, slot, 2], hidden[0, 0, slot, 3] = 0.0, 5.0  # ... except at `slot`
        return hidden

    gamma = 2.0
    miss_1 = dflash_loss(hidden_with_miss_at(1), head, labels, supervised, valid, gamma, chunk=16)
    miss_3 = dflash_loss(hidden_with_miss_at(3), head, labels, supervised, valid, gamma, chunk=16)
    assert miss_1.loss > miss_3.loss
    assert miss_1.accept_len_sum == 1 and miss_3.accept_len_sum == 3
    assert miss_3.correct.tolist() == [0, 1, 1, 0] and miss_3.counted.tolist() == [0, 1, 1, 1]
    # Exact value: sum(w * CE) / sum(w) with w = exp(-(k-1)/gamma).
    w = slot_weights(block, gamma)[1:]
    ce_hit = F.cross_entropy(torch.tensor([[0.0, 0, 5, 0] + [0.0] * 7]), torch.tensor([2])).item()
    ce_miss = F.cross_entropy(torch.tensor([[0.0, 0, 0, 5] + [0.0] * 7]), torch.tensor([2])).item()
    expected = (w[0] * ce_hit + w[1] * ce_hit + w[2] * ce_miss) / w.sum()
    assert miss_3.loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_slot_0_never_counts() -> None:
    """Making slot 0's hidden state anything at all leaves loss and statistics unchanged."""
    cfg = tiny_config(block_size=4)
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 3, 4, 32, generator=gen)
    head = torch.randn(cfg.vocab_size, 32, generator=gen)
    labels = torch.randint(0, cfg.vocab_size, (2, 3, 4), generator=gen)
    supervised = torch.ones(2, 3, 4, dtype=torch.bool)
    supervised[..., 0] = False
    valid = torch.ones(2, 3, dtype=torch.bool)
    base = dflash_loss(hidden, head, labels, supervised, valid, 2.0, chunk=5)
    hidden[:, :, 0] = 100 * torch.randn(2, 3, 32, generator=gen)
    moved = dflash_loss(hidden, head, labels, supervised, valid, 2.0, chunk=5)
    assert torch.equal(base.loss, moved.loss) and torch.equal(base.correct, moved.correct)


def test_expected_acceptance_length_from_per_slot_accuracy() -> None:
    correct = torch.tensor([0.0, 8, 4, 2])
    counted = torch.tensor([0.0, 10, 10, 10])
    assert expected_acceptance_length(correct, counted) == pytest.approx(
        1 + 0.8 + 0.8 * 0.4 + 0.8 * 0.4 * 0.2
    )
    assert expected_acceptance_length(torch.zeros(4), torch.zeros(4)) == 1.0
