"""Decoding's context cache: each position projected once, the drafts those of the whole-context path."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.drafter_fixtures import tiny_config, tiny_drafter
from trainer.eval.proposers import DFlashProposer, WholeContextProposer
from trainer.model.drafter import ContextCache, DFlashDrafter


def hidden_both_ways(
    drafter: DFlashDrafter, ids: list[int], features: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The block at the last token, its final-norm hidden states: whole context, and cached in pieces."""
    context = torch.cat([features, features.new_zeros(1, 1, features.shape[-1])], dim=1)
    whole = drafter.draft_hidden(
        torch.tensor([ids]), context, torch.tensor([[len(ids) - 1]]), torch.ones(1, 1, dtype=torch.bool)
    )[0, 0]
    cache = ContextCache()
    cut = features.shape[1] // 3  # three uneven extensions, as accepted tokens arrive
    for piece in (features[:, :cut], features[:, cut : 2 * cut + 1], features[:, 2 * cut + 1 :]):
        drafter.extend_context(cache, piece)
    assert cache.length == features.shape[1]
    return whole, drafter.hidden_after(cache, ids[-1])


def drafter_and_sequence(length: int, seed: int) -> tuple[DFlashDrafter, list[int], torch.Tensor]:
    """A 2-layer tiny drafter, `length` random tokens and a captured feature row for each."""
    drafter = tiny_drafter(tiny_config(block_size=4, num_layers=2)).eval()
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 90, (length,), generator=gen).tolist()
    width = drafter.cfg.num_context_features * drafter.cfg.hidden_size
    return drafter, ids, torch.randn(1, length, width, generator=gen)


@torch.no_grad()
def test_cached_block_equals_the_whole_context_path() -> None:
    drafter, ids, features = drafter_and_sequence(19, seed=3)
    whole, cached = hidden_both_ways(drafter, ids, features[:, :-1])  # no feature for the anchor yet
    torch.testing.assert_close(cached, whole, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_proposer_drafts_what_the_whole_context_drafts_block_after_block() -> None:
    drafter, ids, features = drafter_and_sequence(30, seed=5)
    proposer, reference = DFlashProposer(drafter), WholeContextProposer(drafter)
    # two sequences, start() between them; each one's first end is its prompt
    for ends in ((6, 9, 10, 14, 22), (4, 12)):
        proposer.start()
        for end in ends:  # the sequence so far is ids[:end]; features exist for all but its last token
            seen = features[:, : end - 1]
            assert proposer.propose(ids[:end], seen) == reference.propose(ids[:end], seen)
        assert proposer.cache.length == ends[-1] - 1  # each position projected once


def test_an_empty_cache_is_refused() -> None:
    drafter = tiny_drafter(tiny_config(block_size=4, num_layers=1)).eval()
    with pytest.raises(ValueError, match="empty"):
        drafter.hidden_after(ContextCache(), 3)


def test_proposer_refuses_features_that_do_not_follow_its_cache() -> None:
    drafter = tiny_drafter(tiny_config(block_size=4, num_layers=1)).eval()
    features = torch.randn(1, 12, drafter.cfg.num_context_features * drafter.cfg.hidden_size)
    proposer = DFlashProposer(drafter)
    proposer.propose(list(range(11)), features[:, :10])
    with pytest.raises(ValueError, match="call start"):  # a new, shorter sequence without start()
        proposer.propose(list(range(5)), features[:, :4])
    with pytest.raises(ValueError, match="captured positions"):  # features not ending before the anchor
        proposer.propose(list(range(12)), features[:, :12])
    proposer.start()
    assert len(proposer.propose(list(range(5)), features[:, :4])) == 3
