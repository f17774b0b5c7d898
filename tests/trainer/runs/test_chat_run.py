"""A CPU run on chat data whose template takes earlier answers out of their context (issue 38, Q1): the
trainer's start says so in one line, with the count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.trainer.chat_fixtures import QWEN3_LIKE, byte_tokenizer
from tests.trainer.trainer_runs import torchrun

TWO_TURNS = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
    {"role": "assistant", "content": "See you."},
]


@pytest.mark.slow  # a torchrun of two workers: ~60-100 s on a busy 2-core box
def test_train_warns_when_chat_answers_are_left_unsupervised(tmp_path: Path) -> None:
    import torch

    from trainer.target_model.tiny import build_embedded_target

    target = tmp_path / "target"
    build_embedded_target("tiny", 0, torch.device("cpu")).save_pretrained(target)
    byte_tokenizer(QWEN3_LIKE, target)
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": TWO_TURNS}) + "\n" for _ in range(16)))
    overrides = {
        "target.path": json.dumps(str(target)), "data.kind": '"chat"', "data.path": json.dumps(str(data)),
        "data.chat_template_kwargs": "{enable_thinking = false}", "data.eval_fraction": "0",
        "optim.steps": "2", "checkpoint.every": "0",
    }  # fmt: skip
    run = torchrun("configs/tiny-cpu.toml", tmp_path / "out", nproc=2, overrides=overrides)
    assert run.returncode == 0, run.stderr[-3000:]
    said = [line for line in run.stdout.splitlines() if "are not supervised" in line]
    assert said == [
        "dflash trainer: warning: 16 of 32 answers in 16 chat records are not supervised: the chat template "
        "renders them in the later history differently from the context the target wrote them in "
        "(`data preview --json` counts them all: answers_out_of_context)"
    ]


@pytest.mark.slow  # three torchruns: 30-60 s on a 2-core box
def test_data_workers_change_who_makes_the_sequences_and_nothing_else(tmp_path: Path) -> None:
    """`data.workers = 1` (trainer/data/prefetch.py) against none, colocated and split (the split's target rank
    asks for every batch, the colocated rank for its own): the same losses, and no worker warning (a batch
    asked for out of the order the workers were given would say so)."""
    import torch

    from trainer.target_model.tiny import build_embedded_target

    target = tmp_path / "target"
    build_embedded_target("tiny", 0, torch.device("cpu")).save_pretrained(target)
    byte_tokenizer(QWEN3_LIKE, target)
    data = tmp_path / "chat.jsonl"
    chats = [
        [{"role": "user", "content": f"Q{i}"}, {"role": "assistant", "content": "word " * (2 + 3 * (i % 9))}]
        for i in range(36)
    ]
    data.write_text("".join(json.dumps({"messages": chat}) + "\n" for chat in chats))
    overrides = {
        "target.path": json.dumps(str(target)), "data.kind": '"chat"', "data.path": json.dumps(str(data)),
        "data.eval_fraction": "0.1", "eval.every": "4", "optim.steps": "8", "optim.grad_accum": "2",
        "checkpoint.every": "0",
    }  # fmt: skip  # 32 training chats, 8 batches of 4 an epoch: two epochs
    layouts = [
        ("colocated-0", 1, "0", "colocated"),
        ("colocated-1", 1, "1", "colocated"),
        ("split-1", 2, "1", "split"),
    ]
    runs = {}
    for name, nproc, workers, mode in layouts:
        sets = {**overrides, "data.workers": workers, "topology.mode": json.dumps(mode)}
        runs[name] = torchrun("configs/tiny-cpu.toml", tmp_path / name, nproc=nproc, overrides=sets)
    for name, run in runs.items():
        assert run.returncode == 0, (name, run.stderr[-3000:])
        assert "data workers" not in run.stderr, (name, run.stderr[-3000:])
    losses = {name: [m["loss"] for m in run.metrics] for name, run in runs.items()}
    assert len(losses["colocated-0"]) == 8
    assert losses["colocated-1"] == losses["colocated-0"]  # bit for bit: the same batches
    assert losses["split-1"] == pytest.approx(losses["colocated-0"], rel=1e-5)
