"""Capture: only the configured layers run, and each captured tensor equals HF's hidden_states[i + 1]."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.runspec.target_shapes import embedded_config
from trainer.target_model.capture import CaptureTarget, load_capture_target
from trainer.target_model.load import load_frozen_embeddings
from trainer.target_model.tiny import build_embedded_target


def test_captured_layers_equal_hf_hidden_states() -> None:
    ids = torch.randint(0, 511, (2, 24), generator=torch.Generator().manual_seed(0))
    full = build_embedded_target("tiny", seed=3)
    with torch.no_grad():
        reference = full(input_ids=ids, output_hidden_states=True).hidden_states  # 5 entries for 4 layers
    layer_ids = [0, 2]
    target = CaptureTarget(build_embedded_target("tiny", seed=3), layer_ids)
    batch = target.capture(ids, torch.ones_like(ids, dtype=torch.bool), index=7)
    h = embedded_config("tiny").hidden_size
    assert batch.hidden.shape == (2, 24, 2 * h)
    assert batch.index == 7
    for k, i in enumerate(layer_ids):
        torch.testing.assert_close(batch.hidden[..., k * h : (k + 1) * h], reference[i + 1])


def test_compiled_layers_capture_the_same_states() -> None:
    import torch._dynamo
    from torch._dynamo.utils import counters

    ids = torch.randint(0, 511, (2, 64), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids, dtype=torch.bool)
    expected = CaptureTarget(build_embedded_target("tiny", seed=5), [1, 3]).capture(ids, mask, 0).hidden
    torch._dynamo.reset()
    counters.clear()
    compiled = CaptureTarget(build_embedded_target("tiny", seed=5), [1, 3], compile_layers=True)
    for _ in range(2):
        torch.testing.assert_close(compiled.capture(ids, mask, 0).hidden, expected, rtol=1e-4, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1  # one graph for all four layers, no recompiles


def test_target_warm_up_first_rank_compiles_alone_the_others_wait_then_go_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from filelock import FileLock, Timeout

    from trainer.run.warmup import compile_lock_path, warm_up_target
    from trainer.runspec.config import load_config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    assert compile_lock_path().parent == tmp_path  # beside the cache, not inside it (snapshots skip it)
    cfg = load_config("tiny-cpu", ["data.seq_len=48", "optim.batch_size=2"])
    target = CaptureTarget(build_embedded_target("tiny", seed=0), [1, 3])
    held_during_capture = []

    def capture(ids: torch.Tensor, mask: torch.Tensor, index: int) -> None:
        assert tuple(ids.shape) == (2, 48)  # the run's shapes: what training will compile
        try:
            FileLock(str(compile_lock_path())).acquire(timeout=0).lock.release()
            held_during_capture.append(False)
        except Timeout:
            held_during_capture.append(True)

    monkeypatch.setattr(target, "capture", capture)
    # Alone: this rank is first and compiles holding the lock.
    stats = warm_up_target(target, cfg, torch.device("cpu"))
    assert stats["first"] and held_during_capture == [True]
    # Another rank holds the lock (compiling): this one waits, then captures without holding it.
    other = FileLock(str(compile_lock_path()))
    other.acquire()
    result: dict[str, object] = {}
    follower = threading.Thread(
        target=lambda: result.update(warm_up_target(target, cfg, torch.device("cpu")))
    )
    follower.start()
    follower.join(timeout=0.5)
    assert follower.is_alive() and held_during_capture == [True]  # still waiting for the first rank
    other.release()
    follower.join(timeout=10)
    assert result["first"] is False and held_during_capture == [True, False]


def test_later_layers_and_lm_head_never_run() -> None:
    target = CaptureTarget(build_embedded_target("tiny", seed=0), [1])
    assert len(target.body.layers) == 2  # layers 2 and 3 are gone
    assert not hasattr(target.body, "lm_head")


def test_the_last_hidden_state_is_post_norm_so_we_do_not_use_it() -> None:
    """HF's final hidden_states entry has the final norm applied: capturing the last layer must differ."""
    ids = torch.randint(0, 511, (1, 16), generator=torch.Generator().manual_seed(1))
    full = build_embedded_target("tiny", seed=0)
    with torch.no_grad():
        last = full(input_ids=ids, output_hidden_states=True).hidden_states[-1]
    batch = CaptureTarget(build_embedded_target("tiny", seed=0), [3]).capture(ids, ids > 0, 0)
    assert not torch.allclose(batch.hidden, last)
    torch.testing.assert_close(full.model.norm(batch.hidden), last)


def test_tiny_target_is_a_function_of_the_seed() -> None:
    a, b, c = (build_embedded_target("tiny", s) for s in (5, 5, 6))
    assert torch.equal(a.model.layers[0].mlp.up_proj.weight, b.model.layers[0].mlp.up_proj.weight)
    assert not torch.equal(a.model.layers[0].mlp.up_proj.weight, c.model.layers[0].mlp.up_proj.weight)


def test_drafter_ranks_get_the_targets_own_embedding_and_head() -> None:
    embed, lm_head, hf_config = load_frozen_embeddings("tiny", seed=4)
    model = build_embedded_target("tiny", seed=4)
    assert torch.equal(embed, model.model.embed_tokens.weight)
    assert torch.equal(lm_head, model.lm_head.weight)
    assert hf_config.vocab_size == embed.shape[0]


def test_a_local_folder_loads_only_the_layers_it_needs(tmp_path: Path) -> None:
    model = build_embedded_target("tiny", seed=2)
    model.save_pretrained(tmp_path)
    ids = torch.randint(0, 511, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        reference = model(input_ids=ids, output_hidden_states=True).hidden_states
    target = load_capture_target(str(tmp_path), [1], seed=0, device=torch.device("cpu"), dtype=torch.float32)
    assert len(target.body.layers) == 2
    torch.testing.assert_close(target.capture(ids, ids > 0, 0).hidden, reference[2])
    embed, lm_head, _ = load_frozen_embeddings(str(tmp_path), seed=0)
    assert torch.equal(embed, model.model.embed_tokens.weight)
    assert torch.equal(lm_head, model.lm_head.weight)


@pytest.mark.parametrize("path", ["tiny", "random:qwen3-8b"])
def test_embedded_configs_have_the_promised_shapes(path: str) -> None:
    cfg = embedded_config(path)
    if path == "tiny":
        assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (
            128,
            4,
            4,
            2,
        )
        assert (cfg.head_dim, cfg.intermediate_size, cfg.vocab_size) == (32, 384, 512)
    else:
        assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size) == (4096, 36, 151936)
