"""`drafter.compile_layers`: compiled decoder layers compute what eager ones do, with one graph for any depth.

CPU with SDPA here (CPU flex has no backward); the GPU flex + compiled-layers case is in
test_flex_vs_sdpa.py.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from tests.trainer.drafter_fixtures import tiny_batch, tiny_config, tiny_drafter


def test_compiled_layers_match_eager_in_loss_and_gradients_and_share_graphs() -> None:
    cfg = tiny_config(block_size=4, num_layers=3)
    eager = tiny_drafter(cfg)
    compiled = tiny_drafter(cfg)
    compiled.load_state_dict(eager.state_dict())
    assert not compiled.layers_compiled
    compiled.compile_layers()
    assert compiled.layers_compiled
    assert set(compiled.state_dict()) == set(eager.state_dict())  # checkpoints and exports unchanged

    torch._dynamo.reset()
    counters.clear()
    for step, seed in enumerate((0, 1)):  # new anchors, same shapes: the second step must not recompile
        batch = tiny_batch(cfg, batch=2, seq_len=24, num_anchors=5, seed=seed)
        with torch._dynamo.config.patch(error_on_recompile=step > 0):
            got = compiled(**batch)
        expected = eager(**batch)
        torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=1e-6)
        got.loss.backward()
        expected.loss.backward()
        for (name, p_eager), p_compiled in zip(eager.named_parameters(), compiled.parameters(), strict=True):
            torch.testing.assert_close(p_compiled.grad, p_eager.grad, rtol=1e-4, atol=1e-6, msg=name)
            p_compiled.grad, p_eager.grad = None, None
    # Three layers, two steps: one graph shared by every layer (the first layer's input is marked as
    # needing a gradient, like the others'); nothing recompiled for the second step's new anchors.
    assert counters["stats"]["unique_graphs"] == 1
    inductor = counters["inductor"]
    assert inductor["fxgraph_cache_miss"] + inductor["fxgraph_cache_hit"] == 2  # its forward and backward


def test_the_first_layer_input_gradient_is_what_the_memory_plan_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With compiled layers, backward computes the first layer's input gradient: (B, Q, H) in the
    parameters' dtype, as many bytes as `memory_plan.first_layer_input_grad` (eager layers here, marked
    compiled: the gradient is autograd's, not Inductor's). Without compiled layers there is none."""
    from dflash_doctor.launch.memory_plan import ModelShape, PlanInputs, first_layer_input_grad
    from trainer.model.drafter import DFlashDrafter

    cfg = tiny_config(block_size=4, num_layers=2)
    batch = tiny_batch(cfg, batch=2, seq_len=24, num_anchors=5)
    seen: list[torch.Tensor] = []

    def record_input_gradient(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        if args[0].requires_grad:
            args[0].register_hook(lambda grad: seen.append(grad))

    shape = ModelShape(cfg.hidden_size, cfg.intermediate_size, 4, 4, 2, 8, cfg.vocab_size)
    planned = PlanInputs(shape, [1, 2], 2, cfg.intermediate_size, 4, 5, 24, 2, 1, 2048)
    for compiled in (False, True):
        monkeypatch.setattr(DFlashDrafter, "layers_compiled", property(lambda self, c=compiled: c))
        drafter = tiny_drafter(cfg)
        drafter.layers[0].register_forward_pre_hook(record_input_gradient)
        seen.clear()
        drafter(**batch).loss.backward()
        if not compiled:
            assert seen == []
            continue
        (grad,) = seen
        assert grad.shape == (2, 5 * 4, cfg.hidden_size) and grad.dtype == drafter.fc.weight.dtype
        assert grad.numel() * grad.element_size() == first_layer_input_grad(planned)
