"""Held-out evaluation: the split, the target ranks' schedule, greedy tokens, and the acceptance rule."""

from __future__ import annotations

import pytest
import torch

from dflash_base.errors import ConfigError
from tests.trainer.drafter_fixtures import tiny_config, tiny_drafter
from trainer.data.order import make_padded_batch
from trainer.data.sources import split_data
from trainer.model.batch import CapturedBatch
from trainer.run.heldout import (
    HeldoutEvaluator,
    HeldoutSums,
    acceptance_hits,
    answer_walks,
    every_anchor,
    leading_run,
    score_batch,
)
from trainer.run.schedule import RunPlan, evaluates_after, target_work
from trainer.runspec.config import EvalSection, PrecisionSection, parse_config
from trainer.runspec.topology import Topology
from trainer.target_model.capture import CaptureTarget
from trainer.target_model.tiny import build_embedded_target


def _cfg(**data: object) -> object:
    return parse_config({"data": {"num_samples": 100, **data}, "optim": {"steps": 1, "batch_size": 4}})


def test_eval_fraction_holds_out_a_fixed_disjoint_share() -> None:
    split = split_data(_cfg(eval_fraction=0.1))
    assert len(split.eval_ids) == 10 and len(split.train_ids) == 90
    assert not set(split.eval_ids) & set(split.train_ids)
    assert split_data(_cfg(eval_fraction=0.1)).eval_ids == split.eval_ids  # a function of the seed
    assert split.eval_batches == 3 and split.eval_sequence_ids(2) == split.eval_ids[8:10]  # all scored (D8)
    assert split_data(_cfg()).eval_ids == []  # no held-out data: no evaluation
    small = split_data(_cfg(eval_fraction=0.02))  # fewer than one batch: one padded batch, not a refusal
    assert len(small.eval_ids) == 2 and small.eval_batches == 1


def test_eval_keys_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"data\.eval_fraction: must be a number >= 0.0 <= 0.5"):
        _cfg(eval_fraction=0.9)
    with pytest.raises(ConfigError, match=r"data\.eval_path: needs data.kind"):
        _cfg(eval_path="x.jsonl")
    with pytest.raises(ConfigError, match="not both"):
        parse_config(
            {
                "data": {"kind": "jsonl", "path": "a", "eval_path": "b", "eval_fraction": 0.1},
                "optim": {"steps": 1},
            }
        )


def test_evaluation_steps() -> None:
    assert [s for s in range(1, 11) if evaluates_after(s, 10, 4)] == [4, 8, 10]
    assert [s for s in range(1, 11) if evaluates_after(s, 10, 0)] == [10]


def test_the_evaluator_decides_from_its_own_section() -> None:
    """Built from `[eval]` and the few values it uses (no TrainConfig): every `eval.every` steps and after
    the last, never without held-out batches."""

    def evaluator(every: int, batches: int) -> HeldoutEvaluator:
        return HeldoutEvaluator(
            EvalSection(every=every),
            PrecisionSection(),
            anchors=8,
            batches=batches,
            total_steps=10,
            index=0,
            group=None,  # due() reads no group
            device=torch.device("cpu"),
        )

    assert [s for s in range(1, 11) if evaluator(4, batches=2).due(s)] == [4, 8, 10]
    assert [s for s in range(1, 11) if evaluator(0, batches=2).due(s)] == [10]
    assert not any(evaluator(4, batches=0).due(s) for s in range(1, 11))


def test_target_schedule_puts_each_steps_heldout_batches_after_its_training_batches() -> None:
    plan = RunPlan(batches_per_epoch=100, total_steps=4, drafters=2, accum=2)
    work = {t: list(target_work(Topology(2, 2), t, plan, 1, eval_every=2, eval_batches=3)) for t in range(2)}
    train = sorted(i for t in work for kind, i in work[t] if kind == "train")
    assert train == list(range(1 * 4, 4 * 4))  # from the resume step on, accum x drafters per step
    assert [j for kind, j in work[0] if kind == "eval"] == [0, 2, 0, 2]  # after steps 2 and 4
    assert [j for kind, j in work[1] if kind == "eval"] == [1, 1]
    first_eval = work[0].index(("eval", 0))
    assert all(i < 8 for kind, i in work[0][:first_eval]) and work[0][first_eval + 2] == ("train", 8)


def test_greedy_capture_equals_the_full_models_argmax() -> None:
    model = build_embedded_target("tiny", seed=0)
    ids = torch.randint(0, 500, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids).logits.argmax(-1)
    target = CaptureTarget(build_embedded_target("tiny", seed=0), [1, 2], keep_head=True)
    batch = target.capture_with_greedy(ids, torch.ones_like(ids, dtype=torch.bool), 0, chunk=5)
    plain = target.capture(ids, torch.ones_like(ids, dtype=torch.bool), 0)
    assert torch.equal(batch.target_ids, expected)
    assert torch.equal(batch.hidden, plain.hidden) and plain.target_ids is None


def test_acceptance_counts_the_bonus_token_and_stops_where_the_data_leave_the_greedy_path() -> None:
    # sequence x, target greedy g (g[p] = the target's choice for position p + 1), one anchor at 0
    x = torch.tensor([[10, 11, 12, 13, 14, 15]])
    g = torch.tensor([[11, 12, 99, 14, 15, 16]])  # the data leave the greedy path at position 3
    anchors = torch.tensor([[0]])
    supervised = torch.ones(1, 1, 5, dtype=torch.bool)
    supervised[..., 0] = False
    draft = torch.tensor([[[11, 12, 99, 14]]])  # follows the target's greedy choices
    vs_target, vs_labels = acceptance_hits(draft, x, g, anchors, supervised)
    assert vs_target.tolist() == [[[True, True, True, False]]]  # slot 4: the target's context is unknown
    assert vs_labels.tolist() == [[[True, True, False, True]]]
    assert (1 + leading_run(vs_target)).item() == 4 and (1 + leading_run(vs_labels)).item() == 3


def decoding_walk(accept: dict[int, int], loss_mask: list[bool]) -> tuple[int, int]:
    """(tokens, forwards) of greedy speculative decoding over every answer of one sequence (`answer_walks`)."""
    walks = answer_walks(accept, loss_mask)
    return sum(t for t, _ in walks), sum(f for _, f in walks)


def test_the_held_out_figure_walks_each_answer_as_decoding_does() -> None:
    """Answer positions 2..9 (8 tokens; the first comes from the prefill). A(a) per anchor: an easy run at
    2..5 (A = 4, 3, 2, 1 would be accepted there), then one token at a time. Decoding verifies at 2 (emits 4:
    3..6), then at 6, 7, 8 (one each, the last cut at the answer's end 9): 7 tokens in 4 forwards = 1.75.
    The mean of A over every anchor, (4+3+2+1+1+1+1) / 7 = 1.86, counts the easy run's positions that decoding
    crosses in one forward."""
    mask = [False, False] + [True] * 8 + [False, False]
    accept = {2: 4, 3: 3, 4: 2, 5: 1, 6: 1, 7: 1, 8: 2}
    tokens, forwards = decoding_walk(accept, mask)
    assert (tokens, forwards) == (7, 4)
    two_answers = [*mask[:-2], False, True, True, True]  # a second answer at 11..13
    assert decoding_walk({**accept, 11: 5, 12: 1}, two_answers) == (7 + 2, 4 + 1)  # 5 is cut to the 2 left
    assert answer_walks({**accept, 11: 5, 12: 1}, two_answers) == [
        (7, 4),
        (2, 1),
    ]  # the last: what eval decodes
    assert answer_walks(accept, [False] * 6) == []


def test_the_last_answer_walk_is_kept_beside_the_headline() -> None:
    """Two sequences of two answers each: the headline walks all four, `accept_len_last_answer` the second
    of each; both survive the all-reduce's packing."""
    cfg = tiny_config(block_size=4)
    model = tiny_drafter(cfg).eval()
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, cfg.vocab_size - 1, (2, 32), generator=gen)
    mask = torch.zeros(2, 32, dtype=torch.bool)
    mask[:, 4:12] = True  # an earlier answer
    mask[:, 18:30] = True  # the last answer
    hidden = torch.randn(2, 32, cfg.num_context_features * cfg.hidden_size, generator=gen)
    greedy = torch.roll(ids, -1, dims=1)
    batch = CapturedBatch(ids, mask, hidden, target_ids=greedy)
    last_only = mask.clone()
    last_only[:, :12] = False
    with torch.no_grad():
        both = score_batch(model, batch, 8)
        last = score_batch(model, CapturedBatch(ids, last_only, hidden, target_ids=greedy), 8)
    assert (both.last_tokens, both.last_forwards) == (last.walk_tokens, last.walk_forwards)
    assert both.walk_forwards > both.last_forwards > 0
    assert both.accept_len_last_answer == pytest.approx(last.accept_len_target)
    packed = HeldoutSums.from_tensor(both.as_tensor(torch.device("cpu")))
    assert packed == both


def test_every_anchor_is_scored_in_chunks_of_the_training_count() -> None:
    mask = torch.tensor([[0, 1, 1, 1, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 1, 0]], dtype=torch.bool)
    anchors, valid = every_anchor(mask, chunk=3)
    assert anchors.shape == (2, 6)  # 4 valid anchors in row 0: two chunks of 3
    assert anchors[0][valid[0]].tolist() == [1, 2, 3, 4] and anchors[1][valid[1]].tolist() == [3, 4, 5]


class _Rows:
    """A sequence source of fixed rows (what `make_padded_batch` reads)."""

    def __init__(self, ids: torch.Tensor, mask: torch.Tensor) -> None:
        self.ids, self.mask = ids, mask

    def get(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ids[j], self.mask[j]


def test_the_last_partial_held_out_batch_is_scored_at_the_compiled_shape() -> None:
    """Issue 38, D8: 3 held-out sequences past the last whole batch of 8 were neither trained on nor scored.
    Padded to 8 rows with unsupervised copies, they score exactly as the 3 alone, and the padding adds no
    sequence, anchor or forward."""
    cfg = tiny_config(block_size=4)
    model = tiny_drafter(cfg).eval()
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, cfg.vocab_size - 1, (3, 24), generator=gen)
    mask = torch.ones(3, 24, dtype=torch.bool)
    mask[:, :5] = False
    input_ids, loss_mask = make_padded_batch(_Rows(ids, mask), [0, 1, 2], rows=8)
    assert input_ids.shape == (8, 24) and not loss_mask[3:].any() and torch.equal(input_ids[:3], ids)
    width = cfg.num_context_features * cfg.hidden_size
    hidden = torch.randn(3, 24, width, generator=gen)
    greedy = torch.roll(ids, -1, dims=1)  # the data follow the target's greedy path
    alone = CapturedBatch(ids, mask, hidden, target_ids=greedy)
    padded = CapturedBatch(
        input_ids,
        loss_mask,
        torch.cat([hidden, hidden[:1].expand(5, -1, -1)]),
        target_ids=torch.cat([greedy, greedy[:1].expand(5, -1)]),
    )
    with torch.no_grad():
        a, b = score_batch(model, alone, 8), score_batch(model, padded, 8)
    assert b.sequences == a.sequences == 3
    assert (b.walk_tokens, b.walk_forwards, b.anchors) == (a.walk_tokens, a.walk_forwards, a.anchors)
    assert a.walk_forwards > 0 and b.accept_labels == pytest.approx(a.accept_labels)
