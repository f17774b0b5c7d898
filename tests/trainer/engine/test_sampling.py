"""Keyed token choice: greedy is the argmax, a sampled token is a function of (key, step) alone, and the
draws follow the temperature-scaled, top-p-trimmed distribution."""

from __future__ import annotations

import pytest
import torch

from trainer.engine.sampling import choose_tokens, row_key, uniforms


def test_row_key_is_stable_and_tells_prompts_samples_and_turns_apart() -> None:
    key = row_key(0, "humaneval/0", 0)
    assert key == row_key(0, "humaneval/0", 0)
    assert 0 <= key < 1 << 63
    others = {row_key(1, "humaneval/0", 0), row_key(0, "humaneval/1", 0), row_key(0, "humaneval/0", 1)}
    others.add(row_key(0, "humaneval/0", 0, turn=1))
    assert key not in others and len(others) == 4


def test_uniforms_are_a_function_of_key_and_step_not_of_the_batch() -> None:
    keys = torch.tensor([row_key(0, f"p{i}", 0) for i in range(64)])
    steps = torch.arange(64)
    together = uniforms(keys, steps)
    alone = torch.cat([uniforms(keys[i : i + 1], steps[i : i + 1]) for i in range(64)])
    assert torch.equal(together, alone)
    assert bool(((together >= 0) & (together < 1)).all())
    assert len(set(together.tolist())) == 64  # no two rows share a draw
    assert 0.3 < together.mean().item() < 0.7


def test_greedy_is_the_argmax_and_needs_no_key() -> None:
    logits = torch.randn(5, 11, generator=torch.Generator().manual_seed(0))
    assert torch.equal(choose_tokens(logits, 0.0, 1.0), logits.argmax(-1))


def test_a_row_draws_the_same_token_whatever_rows_sit_beside_it() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 50, generator=gen)
    keys = torch.tensor([row_key(3, f"p{i}", i % 2) for i in range(8)])
    steps = torch.full((8,), 7)
    batch = choose_tokens(logits, 0.8, 0.9, keys, steps)
    one_by_one = torch.cat(
        [choose_tokens(logits[i : i + 1], 0.8, 0.9, keys[i : i + 1], steps[i : i + 1]) for i in range(8)]
    )
    assert torch.equal(batch, one_by_one)


def test_draws_follow_the_distribution_and_stay_in_the_nucleus() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    n = 4000
    keys = torch.tensor([row_key(0, f"p{i}", 0) for i in range(n)])
    steps = torch.zeros(n, dtype=torch.long)
    drawn = choose_tokens(logits.expand(n, 4), 1.0, 1.0, keys, steps)
    share = torch.bincount(drawn, minlength=4).float() / n
    assert torch.allclose(share, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.03)
    nucleus = choose_tokens(logits.expand(n, 4), 1.0, 0.7, keys, steps)  # 0.5 + 0.3 reach 0.7
    assert set(nucleus.tolist()) == {0, 1}
    share = torch.bincount(nucleus, minlength=2).float() / n
    assert abs(share[0].item() - 0.5 / 0.8) < 0.03


def test_sampling_without_keys_is_refused() -> None:
    with pytest.raises(ValueError, match="key"):
        choose_tokens(torch.zeros(2, 3), 1.0, 1.0)
