"""Defects found running the SmolLM2-135M-Instruct pipeline (issue 27): each test failed on the code before its
fix (they were committed as strict xfails while the trainer was being restructured)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.lib.target_folder import make_tokenizer
from trainer.engine.target import prompt_ids
from trainer.eval.prompts import prompts_from_file


def test_eval_reads_a_prompt_record_as_the_user_turn_data_regenerate_answers(tmp_path: Path) -> None:
    tokenizer = make_tokenizer()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "prompt": "w1 w2 w3"}\n')
    expected = prompt_ids(tokenizer, [{"role": "user", "content": "w1 w2 w3"}], {})
    assert prompts_from_file(str(prompts), tokenizer, {}) == [expected]


def test_set_steps_on_a_config_that_trains_for_epochs_runs_steps() -> None:
    from trainer.runspec.config import load_config

    cfg = load_config("tiny-cpu", ["optim.epochs=2"])  # tiny-cpu's file sets optim.steps = 300
    assert (cfg.optim.steps, cfg.optim.epochs) == (None, 2.0)


def test_heldout_acceptance_is_the_tokens_per_verify_step_decoding_gets() -> None:
    """33 tokens on the target's greedy path, position 0 the prompt. The drafter is right on every slot from
    anchors 1..16 (acceptance 4 with block 4) and wrong from 17 on (acceptance 1). Decoding anchors at 1, 5,
    9, 13 (16 tokens in 4 steps) then at every position 17..31 (15 tokens in 15 steps): 31 / 19. The mean
    over all 31 anchors would be (16 x 4 + 15 x 1) / 31 = 2.55."""
    from types import SimpleNamespace

    import torch

    from trainer.model.batch import CapturedBatch
    from trainer.run import heldout

    seq_len, block = 33, 4
    ids = torch.arange(seq_len).unsqueeze(0)
    batch = CapturedBatch(
        input_ids=ids,
        loss_mask=(torch.arange(seq_len) >= 1).unsqueeze(0),
        hidden=torch.zeros(1, seq_len, 2),
        target_ids=ids + 1,  # the target's greedy next token is the data's next token: greedy data
    )

    def designed_drafts(
        input_ids: torch.Tensor, hidden: torch.Tensor, anchors: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        slots = torch.arange(1, block)
        right = anchors.unsqueeze(-1) + slots  # the data token at a + k
        return torch.where((anchors <= 16).unsqueeze(-1), right, torch.full_like(right, -1))

    model = SimpleNamespace(cfg=SimpleNamespace(block_size=block), draft_tokens=designed_drafts)
    sums = heldout.score_batch(model, batch, anchors_per_seq=8)  # type: ignore[arg-type]  # four chunks
    assert sums.accept_len_target == pytest.approx(31 / 19)
