"""The drafter: config, parameter names, gradients, mask semantics at model level, precision."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import Qwen3Config

from tests.trainer.drafter_fixtures import tiny_batch, tiny_config, tiny_drafter
from trainer.model.anchors import sample_anchors
from trainer.model.drafter import DFlashDrafter, DrafterConfig
from trainer.model.loss import LossOutput
from trainer.runspec.target_shapes import default_target_layer_ids


def test_default_target_layer_ids_match_published_spacing() -> None:
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(28, 1) == [14]
    ids = default_target_layer_ids(64, 4)
    assert ids[0] == 1 and ids[-1] == 61 and ids == sorted(ids)


def test_from_target_sizes_the_drafter_like_its_target() -> None:
    target = Qwen3Config(
        hidden_size=128,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=384,
        vocab_size=512,
        rope_theta=5000.0,
    )
    cfg = DrafterConfig.from_target(target, num_hidden_layers=2, block_size=8, mask_token_id=511)
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (
        128,
        4,
        2,
        32,
    )
    assert cfg.intermediate_size == 384 and cfg.vocab_size == 512 and cfg.num_target_layers == 8
    assert cfg.rope_theta == 5000.0
    assert cfg.target_layer_ids == default_target_layer_ids(8, 2) == [1, 5]
    custom = DrafterConfig.from_target(target, 3, 16, 511, target_layer_ids=[0, 3], intermediate_size=64)
    assert custom.target_layer_ids == [0, 3] and custom.intermediate_size == 64


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("mask_token_id", 97, "mask_token_id"),
        ("block_size", 1, "block_size"),
        ("target_layer_ids", [1, 9], "target_layer_ids"),
        ("num_key_value_heads", 3, "num_key_value_heads"),
    ],
)
def test_config_errors_name_the_field(field: str, value: object, needle: str) -> None:
    args = tiny_config().__dict__ | {field: value}
    with pytest.raises(ValueError, match=needle):
        DrafterConfig(**args)


def test_parameter_names_are_the_serving_names_and_frozen_weights_stay_out() -> None:
    model = tiny_drafter()
    names = set(model.state_dict())
    assert {"fc.weight", "hidden_norm.weight", "norm.weight"} <= names
    for i in range(2):
        for leaf in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "self_attn.q_norm",
            "self_attn.k_norm",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
            "input_layernorm",
            "post_attention_layernorm",
        ):
            assert f"layers.{i}.{leaf}.weight" in names
    assert not any("embed" in n or "lm_head" in n or "inv_freq" in n for n in names)
    assert names == {n for n, _ in model.named_parameters()}
    assert model.fc.weight.shape == (32, 2 * 32)


def test_frozen_weights_shape_is_checked() -> None:
    cfg = tiny_config()
    with pytest.raises(ValueError, match="lm_head_weight"):
        DFlashDrafter(cfg, torch.zeros(cfg.vocab_size, cfg.hidden_size), torch.zeros(3, cfg.hidden_size))


def test_forward_returns_loss_and_statistics() -> None:
    cfg = tiny_config()
    model = tiny_drafter(cfg)
    batch = tiny_batch(cfg)
    out = model(**batch)
    assert isinstance(out, LossOutput)
    assert out.loss.ndim == 0 and torch.isfinite(out.loss)
    assert out.correct.shape == out.counted.shape == (cfg.block_size,)
    assert out.correct[0] == 0 and out.counted[0] == 0
    assert out.anchors == batch["anchor_valid"].sum()
    assert out.anchors <= out.accept_len_sum <= out.anchors * cfg.block_size
    # Near chance at init: CE about log(vocab).
    assert abs(out.loss.item() - math.log(cfg.vocab_size)) < 2.0


def test_gradients_reach_every_trainable_weight_and_not_the_frozen_ones() -> None:
    cfg = tiny_config()
    model = tiny_drafter(cfg)
    model(**tiny_batch(cfg)).loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
    for name in ("embed_weight", "lm_head_weight"):
        buffer = getattr(model, name)
        assert not buffer.requires_grad and buffer.grad is None
    assert set(model._ddp_params_and_buffers_to_ignore) >= {"embed_weight", "lm_head_weight"}


def test_frozen_weights_move_with_to() -> None:
    model = tiny_drafter().to(torch.float64)
    assert model.embed_weight.dtype == model.lm_head_weight.dtype == torch.float64


def test_a_block_sees_context_strictly_before_its_anchor_only() -> None:
    """Model-level mask check: context at or after the anchor must not reach the block; before it must."""
    cfg = tiny_config()
    model = tiny_drafter(cfg).eval()
    batch = tiny_batch(cfg, batch=1, num_anchors=3)
    anchors = torch.tensor([[6, 11, 17]])
    valid = torch.ones_like(anchors, dtype=torch.bool)
    args = (batch["input_ids"], batch["hidden"], anchors, valid)
    with torch.no_grad():
        base = model.draft_hidden(*args)
        later = batch["hidden"].clone()
        later[:, 11:] += 5.0  # context at and after anchor 11
        moved = model.draft_hidden(batch["input_ids"], later, anchors, valid)
        assert torch.equal(moved[:, 0], base[:, 0])  # anchor 6: unaffected
        assert torch.equal(moved[:, 1], base[:, 1])  # anchor 11: position 11 is not context for it
        assert not torch.allclose(moved[:, 2], base[:, 2])  # anchor 17 sees 11..16
        before = batch["hidden"].clone()
        before[:, 10] += 5.0
        moved = model.draft_hidden(batch["input_ids"], before, anchors, valid)
        assert torch.equal(moved[:, 0], base[:, 0])
        assert not torch.allclose(moved[:, 1], base[:, 1])


def test_blocks_do_not_see_each_other() -> None:
    cfg = tiny_config()
    model = tiny_drafter(cfg).eval()
    batch = tiny_batch(cfg, batch=1, num_anchors=3)
    anchors = torch.tensor([[6, 11, 17]])
    valid = torch.ones_like(anchors, dtype=torch.bool)
    ids = batch["input_ids"].clone()
    with torch.no_grad():
        base = model.draft_hidden(ids, batch["hidden"], anchors, valid)
        ids[0, 17] = (ids[0, 17] + 1) % (cfg.vocab_size - 1)  # the anchor token of block 2 only
        moved = model.draft_hidden(ids, batch["hidden"], anchors, valid)
    assert torch.equal(moved[:, :2], base[:, :2])
    assert not torch.allclose(moved[:, 2], base[:, 2])


def test_invalid_anchors_change_nothing_and_make_no_nan() -> None:
    cfg = tiny_config()
    model = tiny_drafter(cfg)
    batch = tiny_batch(cfg, batch=1, num_anchors=4)
    anchors = torch.tensor([[5, 9, 0, 0]])
    valid = torch.tensor([[True, True, False, False]])
    out = model(batch["input_ids"], batch["loss_mask"], batch["hidden"], anchors, valid)
    other = model(
        batch["input_ids"], batch["loss_mask"], batch["hidden"], torch.tensor([[5, 9, 13, 20]]), valid
    )
    assert torch.isfinite(out.loss)
    torch.testing.assert_close(out.loss, other.loss)
    assert out.anchors == 2 and out.counted.sum() == other.counted.sum()
    with torch.no_grad():
        hidden = model.draft_hidden(batch["input_ids"], batch["hidden"], anchors, valid)
    assert torch.isfinite(hidden).all()


def test_no_valid_anchor_gives_zero_loss_not_nan() -> None:
    cfg = tiny_config()
    model = tiny_drafter(cfg)
    batch = tiny_batch(cfg, batch=1, num_anchors=2)
    out = model(batch["input_ids"], batch["loss_mask"], batch["hidden"], torch.zeros(1, 2, dtype=torch.long),
                torch.zeros(1, 2, dtype=torch.bool))  # fmt: skip
    assert out.loss.item() == 0.0 and out.anchors == 0
    out.loss.backward()


def test_bf16_autocast_stays_close_to_fp32() -> None:
    cfg = tiny_config()
    model = tiny_drafter(cfg)
    batch = tiny_batch(cfg)
    reference = model(**batch).loss
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(**batch)
    assert out.loss.dtype == torch.float32
    assert abs(out.loss.item() - reference.item()) < 0.05 * reference.item()
    out.loss.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())


def test_bf16_frozen_weights_work_without_autocast() -> None:
    cfg = tiny_config()
    model = tiny_drafter(cfg)
    model.embed_weight = model.embed_weight.bfloat16()
    model.lm_head_weight = model.lm_head_weight.bfloat16()
    batch = tiny_batch(cfg)
    batch["hidden"] = batch["hidden"].bfloat16()
    assert torch.isfinite(model(**batch).loss)


def test_flex_refuses_cpu_training() -> None:
    cfg = tiny_config()
    model = tiny_drafter(cfg, attention="flex")
    with pytest.raises(RuntimeError, match="no backward on CPU"):
        model(**tiny_batch(cfg))


def test_the_drafter_learns_a_deterministic_continuation() -> None:
    """Next token = (3 * token + 1) mod 16: slot k must learn f^k(anchor token). Loss falls, slot 1 is learnt."""
    cfg = tiny_config(block_size=4)
    model = tiny_drafter(cfg, loss_chunk=64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-2)
    gen = torch.Generator().manual_seed(0)
    batch_size, seq_len = 8, 24

    def sequences() -> torch.Tensor:
        tokens = [torch.randint(0, 16, (batch_size,), generator=gen)]
        for _ in range(seq_len - 1):
            tokens.append((3 * tokens[-1] + 1) % 16)
        return torch.stack(tokens, dim=1)

    losses, slot1_hits, slot1_counted = [], 0.0, 0.0
    for step in range(40):
        ids = sequences()
        loss_mask = torch.ones(batch_size, seq_len, dtype=torch.bool)
        hidden = model.embed_weight[ids].repeat(1, 1, cfg.num_context_features)
        anchors, valid = sample_anchors(loss_mask, 6, cfg.block_size, gen)
        out = model(ids, loss_mask, hidden, anchors, valid)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(out.loss.item())
        if step >= 35:
            slot1_hits += out.correct[1].item()
            slot1_counted += out.counted[1].item()
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
    assert slot1_hits / slot1_counted > 0.6  # chance is 1/97
