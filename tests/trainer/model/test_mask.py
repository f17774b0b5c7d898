"""The DFlash mask against a brute-force reference; the Q_LEN padding guard; the uncompiled-flex guard; anchors."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from trainer.model.anchors import sample_anchors, valid_anchor_positions
from trainer.model.attention import (
    FlexNotCompiledError,
    context_ends,
    dense_mask,
    dflash_block_mask,
    dflash_flex_attention,
    dflash_mask_mod,
    require_compiled,
)


def brute_force_mask(
    anchors: list[list[int]], valid: list[list[bool]], context_len: int, block: int
) -> torch.Tensor:
    """The rule, written as plainly as possible: (B, 1, N*block, S + N*block)."""
    batch, num_anchors = len(anchors), len(anchors[0])
    q_len = num_anchors * block
    out = torch.zeros(batch, 1, q_len, context_len + q_len, dtype=torch.bool)
    for b in range(batch):
        for n in range(num_anchors):
            for slot in range(block):
                q = n * block + slot
                if valid[b][n]:
                    for j in range(context_len):
                        out[b, 0, q, j] = j < anchors[b][n]
                for other_slot in range(block):
                    out[b, 0, q, context_len + n * block + other_slot] = True
    return out


def random_case(seed: int, batch: int = 3, context_len: int = 21, num_anchors: int = 6) -> tuple[list, list]:
    gen = torch.Generator().manual_seed(seed)
    anchors, valid = [], []
    for b in range(batch):
        row = torch.randperm(context_len, generator=gen)[:num_anchors].tolist()
        if b == 0:
            row[0], row[1] = 0, context_len - 1  # edge anchors: first and last position
        flags = [bool(x) for x in (torch.rand(num_anchors, generator=gen) > 0.25).tolist()]
        if b == 1:
            flags[-2:] = [False, False]  # padding at the end, as sample_anchors makes it
            row[-2:] = [0, 0]
        anchors.append(row)
        valid.append(flags)
    return anchors, valid


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("block", [1, 3, 4])
def test_dense_mask_matches_brute_force(seed: int, block: int) -> None:
    anchors, valid = random_case(seed)
    expected = brute_force_mask(anchors, valid, 21, block)
    got = dense_mask(torch.tensor(anchors), torch.tensor(valid), 21, block)
    assert got.dtype == torch.bool and got.shape == expected.shape
    assert torch.equal(got, expected)


def test_context_is_strictly_before_the_anchor() -> None:
    mask = dense_mask(torch.tensor([[5]]), torch.tensor([[True]]), 10, 2)
    assert mask[0, 0, 0, 4] and not mask[0, 0, 0, 5]  # `<`, not `<=`
    assert mask[0, 0, 1, 4] and not mask[0, 0, 1, 5]


def test_every_row_sees_at_least_its_own_block() -> None:
    anchors, valid = random_case(7)
    mask = dense_mask(torch.tensor(anchors), torch.tensor(valid), 21, 4)
    assert mask.any(dim=-1).all()
    invalid_rows = ~torch.tensor(valid).repeat_interleave(4, dim=1)  # (B, Q)
    assert not mask[:, 0, :, :21][invalid_rows].any()  # invalid anchors see no context


def test_mask_mod_survives_q_and_kv_padding() -> None:
    """create_block_mask pads Q_LEN and KV_LEN to 128: indices past the end must not index the anchors."""
    anchors = torch.tensor([[0, 9, 20]])
    valid = torch.tensor([[True, True, False]])
    mask_mod = dflash_mask_mod(context_ends(anchors, valid), 21, 4)
    q_idx = torch.arange(128).view(1, 128, 1)  # real Q_LEN is 12
    kv_idx = torch.arange(256).view(1, 1, 256)  # real KV_LEN is 33
    padded = mask_mod(torch.zeros(1, 1, 1, dtype=torch.long), torch.tensor(0), q_idx, kv_idx)
    assert torch.equal(padded[:, :12, :33], dense_mask(anchors, valid, 21, 4)[:, 0])
    assert not padded[:, :12, 33:].any()  # real queries never see padded keys
    # The same closure through create_block_mask's own (vmap) evaluation, eagerly: no IndexError.
    block_mask = create_block_mask(mask_mod, 1, None, 12, 33, device="cpu")
    assert block_mask.shape[-2:] == (12, 33)


def test_flex_refuses_to_run_uncompiled() -> None:
    q = torch.zeros(1, 2, 8, 4)
    with pytest.raises(FlexNotCompiledError, match=r"outside torch\.compile"):
        dflash_flex_attention(q, q, q, block_mask=None)  # type: ignore[arg-type]


def tiles(num: torch.Tensor, indices: torch.Tensor, kv_tiles: int) -> torch.Tensor:
    """A block mask's (num, indices) pair as a dense (B, H, QT, KT) bool of listed tiles; checks the order."""
    dense = torch.zeros(*num.shape, kv_tiles, dtype=torch.bool)
    for row in range(num.numel()):
        listed = indices.reshape(-1, indices.shape[-1])[row, : int(num.reshape(-1)[row])].tolist()
        assert listed == sorted(listed)  # ascending, as flex walks them
        dense.reshape(-1, kv_tiles)[row, listed] = True
    return dense


# Block sizes below, at and above the 128 tile; contexts on and off the tile; Q on and off the tile.
@pytest.mark.parametrize("block", [2, 4, 16, 32, 128, 256])
@pytest.mark.parametrize(("context_len", "num_anchors"), [(100, 3), (128, 8), (300, 40), (512, 64), (300, 8)])
def test_block_mask_equals_create_block_mask_tile_for_tile(
    block: int, context_len: int, num_anchors: int
) -> None:
    """The structural block mask lists exactly the tiles create_block_mask finds by evaluating the predicate
    at every pair: the same partial and full tiles, in the same order, on the key and the query side."""
    gen = torch.Generator().manual_seed(block * 1000 + context_len + num_anchors)
    batch = 2
    anchors = torch.stack(
        [torch.randperm(context_len, generator=gen)[:num_anchors].sort().values for _ in range(batch)]
    )
    valid = torch.rand(batch, num_anchors, generator=gen) > 0.2
    valid[1, -2:] = False  # padding anchors at the end, as sample_anchors makes them
    ends = context_ends(anchors, valid)
    q_len, kv_len = num_anchors * block, context_len + num_anchors * block
    expected = create_block_mask(
        dflash_mask_mod(ends, context_len, block), batch, None, q_len, kv_len, device="cpu"
    )
    got = dflash_block_mask(ends, context_len, block)
    assert got.seq_lengths == expected.seq_lengths == (q_len, kv_len)
    assert got.BLOCK_SIZE == expected.BLOCK_SIZE
    kv_tiles = expected.kv_indices.shape[-1]
    for num, indices in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices")):
        assert torch.equal(getattr(got, num), getattr(expected, num)), num
        assert torch.equal(
            tiles(getattr(got, num), getattr(got, indices), kv_tiles),
            tiles(getattr(expected, num), getattr(expected, indices), kv_tiles),
        ), indices
    q_tiles = expected.q_indices.shape[-1]
    for num, indices in (("q_num_blocks", "q_indices"), ("full_q_num_blocks", "full_q_indices")):
        assert torch.equal(
            tiles(getattr(got, num), getattr(got, indices), q_tiles),
            tiles(getattr(expected, num), getattr(expected, indices), q_tiles),
        ), indices


def test_block_mask_keeps_full_tiles_full_and_skips_unreachable_ones() -> None:
    """One sequence, context 512 (4 tiles), 16 anchors of block 16 (two query tiles of 8 anchors each).
    Query tile 0's anchors all sit past 300: context tiles 0-1 are full for it, tile 2 partial, tile 3 skipped."""
    ends = torch.tensor([[301, 310, 320, 330, 340, 350, 360, 370] + [500] * 8])
    mask = dflash_block_mask(ends, 512, 16)
    kv_tiles = mask.kv_indices.shape[-1]  # 4 context + 2 block tiles
    full = tiles(mask.full_kv_num_blocks, mask.full_kv_indices, kv_tiles)[0, 0]
    partial = tiles(mask.kv_num_blocks, mask.kv_indices, kv_tiles)[0, 0]
    assert full[0].tolist() == [True, True, False, False, False, False]
    assert partial[0].tolist() == [
        False,
        False,
        True,
        False,
        True,
        False,
    ]  # context tile 2; own blocks' tile 4
    assert full[1].tolist() == [True, True, True, False, False, False]
    assert partial[1].tolist() == [False, False, False, True, False, True]


# --- anchors --------------------------------------------------------------------------------------------


def test_valid_positions_need_anchor_and_next_token_supervised() -> None:
    loss_mask = torch.tensor([[0, 1, 1, 0, 1, 1, 1]], dtype=torch.bool)
    assert valid_anchor_positions(loss_mask).int().tolist() == [[0, 1, 0, 0, 1, 1, 0]]


def test_sampled_anchors_are_valid_distinct_sorted_and_static() -> None:
    gen = torch.Generator().manual_seed(0)
    loss_mask = torch.zeros(4, 40, dtype=torch.bool)
    loss_mask[0, 5:] = True  # 34 valid positions
    loss_mask[1, 10:14] = True  # 3 valid positions: padding needed
    loss_mask[3, :] = True
    anchors, valid = sample_anchors(loss_mask, 8, 4, gen)
    assert anchors.shape == valid.shape == (4, 8) and anchors.dtype == torch.int64
    positions = valid_anchor_positions(loss_mask)
    for b in range(4):
        chosen = anchors[b][valid[b]].tolist()
        assert len(set(chosen)) == len(chosen) == min(8, int(positions[b].sum()))
        assert chosen == sorted(chosen)
        assert all(positions[b, p] for p in chosen)
        assert valid[b].tolist() == sorted(valid[b].tolist(), reverse=True)  # valid first, then padding
        assert (anchors[b][~valid[b]] == 0).all()
    assert valid[1].sum() == 3 and not valid[2].any()


def test_sampling_is_deterministic_per_generator_and_varies_between_steps() -> None:
    loss_mask = torch.ones(2, 64, dtype=torch.bool)
    first = sample_anchors(loss_mask, 6, 4, torch.Generator().manual_seed(5))
    again = sample_anchors(loss_mask, 6, 4, torch.Generator().manual_seed(5))
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    gen = torch.Generator().manual_seed(5)
    draws = {tuple(sample_anchors(loss_mask, 6, 4, gen)[0][0].tolist()) for _ in range(5)}
    assert len(draws) > 1


def test_sampling_covers_valid_positions_uniformly() -> None:
    loss_mask = torch.zeros(1, 12, dtype=torch.bool)
    loss_mask[0, 2:10] = True  # valid anchors 2..8
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(12)
    for _ in range(700):
        anchors, valid = sample_anchors(loss_mask, 2, 4, gen)
        counts.index_add_(0, anchors[valid], torch.ones(int(valid.sum())))
    assert counts[[0, 1, 9, 10, 11]].sum() == 0
    share = counts[2:9] / counts.sum()
    assert ((share - 1 / 7).abs() < 0.04).all()


def test_fewer_positions_than_anchors_pads_to_n() -> None:
    anchors, valid = sample_anchors(
        torch.ones(1, 5, dtype=torch.bool), 8, 4, torch.Generator().manual_seed(0)
    )
    assert anchors.shape == (1, 8)
    assert anchors[0, :4].tolist() == [0, 1, 2, 3] and valid[0].tolist() == [True] * 4 + [False] * 4


def test_sampling_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="num_anchors"):
        sample_anchors(torch.ones(1, 5, dtype=torch.bool), 0, 4, torch.Generator())
    with pytest.raises(ValueError, match="block_size"):
        sample_anchors(torch.ones(1, 5, dtype=torch.bool), 2, 1, torch.Generator())


def test_the_guard_fires_when_dynamo_falls_back_to_eager_at_the_recompile_limit() -> None:
    """The silent dense fall-back of REFERENCE.md section 4: recompile limit hit without fail_on_recompile_limit_hit."""

    def guarded(x: torch.Tensor) -> torch.Tensor:
        require_compiled("guarded")
        return x + 1

    compiled = torch.compile(guarded, backend="eager", dynamic=False)
    with torch._dynamo.config.patch(recompile_limit=1, fail_on_recompile_limit_hit=False):
        assert torch.equal(compiled(torch.zeros(2)), torch.ones(2))  # compiled: the guard is traced away
        with pytest.raises(FlexNotCompiledError, match="guarded ran outside"):
            compiled(torch.zeros(3))  # a new shape past the limit: Dynamo runs the Python body eagerly


def test_flex_context_is_padded_to_the_tile_and_the_zero_keys_sit_between_context_and_blocks() -> None:
    from trainer.model.attention import FLEX_TILE, flex_context_len, keys_layout

    assert [flex_context_len(s) for s in (1, 127, 128, 129, 3072, 40000)] == [128, 128, 128, 256, 3072, 40064]
    context = torch.arange(1, 1 + 2 * 3 * 4, dtype=torch.float32).view(1, 2, 3, 4).expand(2, 2, 3, 4)
    blocks = -torch.ones(2, 2, 8, 4)
    dense = torch.ones(2, 1, 8, 3 + 8, dtype=torch.bool)
    assert torch.equal(keys_layout(context, blocks, dense), torch.cat([context, blocks], dim=2))

    ends = torch.tensor([[2, 1], [0, 3]])  # two blocks of 4 per sequence
    block_mask = create_block_mask(
        dflash_mask_mod(ends, FLEX_TILE, 4), 2, None, 8, FLEX_TILE + 8, device="cpu", _compile=False
    )
    laid_out = keys_layout(context, blocks, block_mask)
    assert laid_out.shape == (2, 2, FLEX_TILE + 8, 4)
    assert torch.equal(laid_out[:, :, :3], context)
    assert not laid_out[:, :, 3:FLEX_TILE].any()  # the padding: zeros, that no query may see
    assert torch.equal(laid_out[:, :, FLEX_TILE:], blocks)
    visible = dense_mask(ends, torch.ones_like(ends, dtype=torch.bool), FLEX_TILE, 4)
    assert not visible[..., 3:FLEX_TILE].any()
