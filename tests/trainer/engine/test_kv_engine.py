"""The KV engine writes the tokens transformers' `generate` writes (fp32, CPU), whatever the slots, refills
and prefill groups; sampled answers follow their keys, not their batch; unsupported targets are named."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from trainer.engine.decoder import KVDecoder
from trainer.engine.sampling import row_key
from trainer.engine.scheduler import Scheduler
from trainer.engine.support import kv_engine_reason, unsupported_reason
from trainer.engine.target import prompt_ids
from trainer.regenerate.generate_engine import TorchEngine, generate_token_batch
from trainer.regenerate.kv_engine import KVEngine
from trainer.regenerate.settings import GenerationSettings


@pytest.fixture(scope="module")
def target_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from bench.lib.target_folder import make_target_folder

    return make_target_folder(tmp_path_factory.mktemp("target"))


def chats(n: int) -> list[list[dict[str, str]]]:
    """Prompts of varied lengths (1 to 40 words)."""
    return [
        [{"role": "user", "content": " ".join(f"w{(7 * i + j) % 500}" for j in range(1 + (i * 13) % 40))}]
        for i in range(n)
    ]


@pytest.mark.parametrize(("slots", "max_new"), [(3, 24), (16, 7)])
def test_greedy_answers_equal_generates_token_for_token(
    target_folder: Path, slots: int, max_new: int
) -> None:
    settings = GenerationSettings(target=str(target_folder), max_new_tokens=max_new)
    batch = chats(11)
    expected = TorchEngine(settings, "cpu", batch_size=4).generate(batch)
    engine = KVEngine(settings, "cpu", slots=slots)
    got = engine.generate(batch)
    assert got == expected
    report = engine.report()
    assert report["slots"] == slots and report["generated_tokens"] == sum(c.tokens for c in got)
    if slots < len(batch):
        assert report["decode_steps"] > max_new  # rows were refilled: more steps than one batch's answers


def test_prefill_groups_and_refills_change_no_token(target_folder: Path) -> None:
    engine = KVEngine(GenerationSettings(target=str(target_folder), max_new_tokens=12), "cpu")
    prompts = [prompt_ids(engine.tokenizer, c, {}) for c in chats(9)]
    stop = engine.stop_ids
    reference = generate_token_batch(engine.model, prompts, engine.settings, 0, stop, seed=0)
    reference = [r[: next((i + 1 for i, t in enumerate(r) if t in stop), len(r))] for r in reference]
    for slots, prefill_tokens in [(2, 10), (9, 10_000), (4, 64)]:
        decoder = KVDecoder(engine.model, slots, max(len(p) for p in prompts) + 12)
        rows, _ = Scheduler(decoder, prompts, 12, stop, prefill_tokens=prefill_tokens).run()
        assert rows == reference, (slots, prefill_tokens)


def test_sampled_answers_follow_their_keys_not_their_batch(target_folder: Path) -> None:
    settings = GenerationSettings(target=str(target_folder), max_new_tokens=10, temperature=1.0, top_p=0.9)
    batch = chats(6)
    keys = [row_key(0, f"p{i}", 0) for i in range(6)]
    together = KVEngine(settings, "cpu", slots=6).generate(batch, keys)
    apart = [
        KVEngine(settings, "cpu", slots=2).generate([c], [k])[0] for c, k in zip(batch, keys, strict=True)
    ]
    assert together == apart
    other = KVEngine(settings, "cpu", slots=6).generate(batch, [row_key(0, f"p{i}", 1) for i in range(6)])
    assert other != together  # another sample index draws other answers
    greedy = KVEngine(GenerationSettings(target=str(target_folder), max_new_tokens=10), "cpu").generate(batch)
    assert greedy != together


def test_targets_the_decoder_does_not_know_are_named(target_folder: Path) -> None:
    assert kv_engine_reason(str(target_folder)) is None
    assert "gemma" in (unsupported_reason(SimpleNamespace(model_type="gemma")) or "")
    sliding = SimpleNamespace(model_type="qwen2", use_sliding_window=True, sliding_window=4096)
    assert "sliding" in (unsupported_reason(sliding) or "")
    dynamic = SimpleNamespace(model_type="llama", rope_scaling={"rope_type": "dynamic"})
    assert "dynamic" in (unsupported_reason(dynamic) or "")
    penalty = SimpleNamespace(repetition_penalty=1.2)
    assert "repetition_penalty" in (unsupported_reason(SimpleNamespace(model_type="llama"), penalty) or "")
    assert (
        unsupported_reason(SimpleNamespace(model_type="llama"), SimpleNamespace(repetition_penalty=1.0))
        is None
    )


def test_a_prompt_that_cannot_fit_the_cache_is_refused(target_folder: Path) -> None:
    engine = KVEngine(GenerationSettings(target=str(target_folder), max_new_tokens=4), "cpu")
    decoder = KVDecoder(engine.model, 2, 16)
    with pytest.raises(ValueError, match="max_len"):
        Scheduler(decoder, [list(range(1, 200))], 4, engine.stop_ids).run()
    assert torch.equal(decoder.tokens, torch.zeros(2, dtype=torch.long))
