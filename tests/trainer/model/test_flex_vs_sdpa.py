"""The compiled flex path equals the exact SDPA path, for the whole drafter, and never recompiles for new anchors.

On CPU flex has no backward, so the CPU test is forward only (one compile, small shapes: ~15-25 s cold,
a few seconds with a warm Inductor cache). The GPU test also checks gradients against SDPA, since
compiled flex has had wrong gradients on offset block masks (pytorch#158212).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch._dynamo

from tests.trainer.drafter_fixtures import tiny_batch, tiny_config, tiny_drafter


def test_compiled_flex_forward_equals_sdpa_and_new_anchors_do_not_recompile() -> None:
    cfg = tiny_config(block_size=4)
    sdpa = tiny_drafter(cfg).eval()
    flex = tiny_drafter(cfg, attention="flex").eval()
    flex.load_state_dict(sdpa.state_dict())

    first = tiny_batch(cfg, batch=2, seq_len=24, num_anchors=5, seed=0)
    first["anchors"][0, 0], first["anchors"][0, 1] = 0, 22  # edge anchors: 0 and S-2 (next token exists)
    first["anchors"][0] = first["anchors"][0].sort().values
    first["anchor_valid"][1, -2:] = False  # padding
    second = tiny_batch(cfg, batch=2, seq_len=24, num_anchors=5, seed=1)

    with torch.no_grad():
        for step, batch in enumerate((first, second)):
            args = (batch["input_ids"], batch["hidden"], batch["anchors"], batch["anchor_valid"])
            # The second step has new anchor values, same shapes: it must reuse the compiled code.
            with torch._dynamo.config.patch(error_on_recompile=step > 0):
                got = flex.draft_hidden(*args)
            expected = sdpa.draft_hidden(*args)
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(flex(**batch).loss, sdpa(**batch).loss, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("compiled_layers", [False, True], ids=["eager-layers", "compiled-layers"])
def test_compiled_flex_matches_sdpa_forward_and_backward_on_cuda(compiled_layers: bool) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    cfg = replace(tiny_config(block_size=16), head_dim=32)  # GPU flex needs head_dim >= 16
    sdpa = tiny_drafter(cfg).cuda()
    flex = tiny_drafter(cfg, attention="flex", compile_loss=True).cuda()
    flex.load_state_dict(sdpa.state_dict())
    if compiled_layers:
        flex.compile_layers()  # flex traced inline in the layer graph, as training runs it on CUDA
    # seq_len 250: the flex path pads the context to 256 (flex_context_len), the SDPA path does not
    batch = {k: v.cuda() for k, v in tiny_batch(cfg, batch=2, seq_len=250, num_anchors=12).items()}

    losses = []
    for model in (sdpa, flex):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(**batch)
        out.loss.backward()
        losses.append(out.loss.detach())
    torch.testing.assert_close(losses[1], losses[0], rtol=2e-2, atol=2e-2)
    for (name, p_sdpa), p_flex in zip(sdpa.named_parameters(), flex.parameters(), strict=True):
        assert torch.isfinite(p_flex.grad).all(), name
        cosine = torch.nn.functional.cosine_similarity(p_flex.grad.flatten(), p_sdpa.grad.flatten(), dim=0)
        assert cosine > 0.99, f"{name}: flex gradient diverges from SDPA (cosine {cosine:.4f})"
