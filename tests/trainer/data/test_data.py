"""Data: fixed length, padding never supervised, order fixed by (seed, epoch), resumable by batch index."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dflash_base.errors import ConfigError
from tests.trainer.chat_fixtures import chat_tokens_and_mask
from trainer.data.order import BatchOrder
from trainer.data.sources import (
    JsonlSource,
    SyntheticSource,
    TokenizedSource,
    fit_to_length,
    sample_sequences,
)
from trainer.run.schedule import RunPlan, plan_run, target_work
from trainer.runspec.config import DataSection, parse_config
from trainer.runspec.topology import Topology
from trainer.target_model.tiny import build_embedded_target


def test_pad_and_truncate_keep_padding_out_of_the_loss() -> None:
    ids, mask = fit_to_length([5, 6, 7], [False, True, True], 6)
    assert ids.tolist() == [5, 6, 7, 0, 0, 0]
    assert mask.tolist() == [False, True, True, False, False, False]
    ids, mask = fit_to_length(list(range(1, 10)), [True] * 9, 4)
    assert ids.tolist() == [1, 2, 3, 4] and mask.all()


def test_order_is_a_function_of_seed_and_epoch() -> None:
    a, b = BatchOrder(10, 3, seed=1), BatchOrder(10, 3, seed=1)
    epoch0 = [a.sequence_ids(i) for i in range(3)]
    assert epoch0 == [b.sequence_ids(i) for i in range(3)]
    assert len({j for batch in epoch0 for j in batch}) == 9  # no repeats inside an epoch
    assert [a.sequence_ids(i) for i in range(3, 6)] != epoch0  # a new permutation next epoch
    # asking out of order (a resumed target) gives the same batches
    assert BatchOrder(10, 3, seed=1).sequence_ids(4) == a.sequence_ids(4)
    assert BatchOrder(10, 3, seed=2).sequence_ids(0) != epoch0[0]


def test_targets_cover_every_batch_once_from_the_resume_point() -> None:
    plan, n = RunPlan(batches_per_epoch=100, total_steps=8, drafters=3), 3
    for resume in (0, 2, 5):
        work = {
            t: [i for _, i in target_work(Topology(n, 3), t, plan, resume, eval_every=0, eval_batches=0)]
            for t in range(n)
        }
        assert sorted(i for t in range(n) for i in work[t]) == list(range(resume * 3, 24))
        for t in range(n):
            assert all(i % n == t for i in work[t]) and work[t] == sorted(work[t])


def _cfg(**optim: object) -> object:
    return parse_config({"optim": {"batch_size": 4, **optim}})


def total_batches(plan: RunPlan) -> int:
    """Every drafter's batches over the run."""
    return plan.total_micro_steps * plan.drafters


def test_plan_from_steps_or_epochs() -> None:
    assert total_batches(plan_run(_cfg(steps=5), 100, drafters=3)) == 15
    plan = plan_run(_cfg(epochs=2.0), 100, drafters=3)  # 25 batches an epoch, 50 batches, 16 steps of 3
    assert (plan.batches_per_epoch, plan.total_steps, total_batches(plan)) == (25, 16, 48)
    with pytest.raises(ConfigError, match=r"optim\.batch_size"):
        plan_run(_cfg(steps=1), 3, drafters=1)
    accumulated = plan_run(_cfg(epochs=2.0, grad_accum=2), 100, drafters=3)  # 50 batches, 6 per step: 8 steps
    assert (accumulated.total_steps, accumulated.total_micro_steps, total_batches(accumulated)) == (8, 16, 48)


def test_jsonl_source(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}) + "\n\n")
    src = JsonlSource(str(path), 5, vocab_size=10)
    ids, mask = src.get(0)
    assert (
        len(src) == 1
        and ids.tolist() == [1, 2, 3, 0, 0]
        and mask.tolist() == [False, True, True, False, False]
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "line 1: not JSON"),
        (
            json.dumps({"input_ids": [1, 99], "loss_mask": [1, 1]}),
            "input_ids must be a non-empty list of token ids < 10",
        ),
        (
            json.dumps({"input_ids": [1, 2], "loss_mask": [1]}),
            "loss_mask must be a list of 0/1 as long as input_ids",
        ),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ConfigError, match=message):
        JsonlSource(str(path), 5, vocab_size=10)


@pytest.fixture
def one_thread() -> object:
    """Token-by-token sampling is latency-bound: on a busy 2-core box extra threads only spin."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_synthetic_data_is_deterministic_and_not_chunking_dependent(one_thread: None) -> None:
    model = build_embedded_target("tiny", seed=0)
    data = DataSection(seq_len=24, num_samples=6, prompt_len=4)
    a = SyntheticSource(model, data, seed=0, mask_token_id=511, chunk=3)
    b = SyntheticSource(model, data, seed=0, mask_token_id=511, chunk=3)
    assert torch.equal(a.ids, b.ids)
    assert a.ids.shape == (6, 24) and not (a.ids == 511).any()
    _ids, mask = a.get(0)
    assert not mask[:4].any() and mask[4:].all()  # the random prompt is not supervised
    lazy = SyntheticSource(model, data, seed=0, mask_token_id=511, chunk=3, eager=False)
    assert torch.equal(lazy.get(4)[0], a.ids[4]) and list(lazy._chunks) == [1]  # only sequence 4's chunk made
    # the tiny target is confident at a low temperature: most sampled tokens are its greedy choice
    gen = torch.Generator().manual_seed(0)
    seqs = sample_sequences(model, 8, 48, 4, 0.5, 511, gen)
    with torch.no_grad():
        greedy = model(seqs).logits[:, 3:-1].argmax(-1)
    assert (greedy == seqs[:, 4:]).float().mean() > 0.3  # chance would be 1/511


def _tiny_tokenizer(folder: Path) -> object:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [
        "<pad>",
        "<|user|>",
        "<|assistant|>",
        "<|end|>",
        "hi",
        "there",
        "how",
        "are",
        "you",
        "fine",
        "ok",
    ]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>")
    fast.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|> {% endif %}"
    )
    fast.save_pretrained(folder)
    return fast


def test_chat_loss_mask_covers_assistant_turns_only(tmp_path: Path) -> None:
    tokenizer = _tiny_tokenizer(tmp_path)
    messages = [
        {"role": "user", "content": "hi there"},
        {"role": "assistant", "content": "how are you"},
        {"role": "user", "content": "fine"},
        {"role": "assistant", "content": "ok"},
    ]
    ids, mask = chat_tokens_and_mask(tokenizer, messages)
    vocab = tokenizer.get_vocab()
    inv = {i: w for w, i in vocab.items()}
    supervised = [inv[i] for i, m in zip(ids, mask, strict=True) if m]
    assert supervised == ["how", "are", "you", "<|end|>", "ok", "<|end|>"]
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"messages": messages}) + "\n")
    src = TokenizedSource(str(data), "chat", tokenizer, 32)
    got_ids, got_mask = src.get(0)
    assert got_ids[: len(ids)].tolist() == ids and got_mask.sum() == len(supervised)


def test_the_split_scores_every_held_out_sequence() -> None:
    """tiny-cpu holds out 51 sequences in batches of 8: all 51 scored, the seventh batch holding the last 3
    (issue 38, D8: the 3 were neither trained on nor scored); the trainer's first line says so."""
    from trainer.data.sources import DataSplit

    split = DataSplit(list(range(461)), list(range(51)), 8)
    assert split.eval_batches == 7 and split.eval_sequence_ids(6) == [48, 49, 50]
    assert split.describe_heldout() == "held-out: 51 sequences, all scored in 7 batches of 8, the last of 3"
    assert DataSplit([0], list(range(16)), 8).describe_heldout() == (
        "held-out: 16 sequences, all scored in 2 batches of 8"
    )
    assert DataSplit([0], [], 8).describe_heldout() == "no held-out data"
