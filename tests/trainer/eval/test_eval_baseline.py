"""`eval`'s training-free baseline (prompt lookup, vLLM's `ngram`) through the same verify loop, what a user
picks a block size with (acceptance per slot, the histogram of emitted lengths), and the count of what is
emitted (tokens accepted past the budget are not counted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_doctor.cli import run
from tests.trainer.eval.test_eval import PROMPTS, OracleDrafter, _tiny_target, _untrained_drafter
from trainer.eval.evaluate import evaluate
from trainer.eval.figures import acceptance_shape, walk_of_lengths
from trainer.eval.proposers import PromptLookup, lookup
from trainer.eval.speculative import greedy_decode, speculative_decode
from trainer.model.export import export_drafter


def test_prompt_lookup_takes_the_longest_matching_suffix_and_its_earliest_occurrence() -> None:
    # vLLM's own example: [4,2,3] never occurred before; [2,3] did, followed by [4,2,3]
    assert lookup([1, 2, 3, 4, 2, 3], k=4, n_min=2, n_max=3) == [4, 2, 3]
    assert lookup([7, 8, 9, 7, 8, 5, 7, 8], k=2, n_min=1, n_max=3) == [9, 7]  # the earliest [7, 8]
    assert lookup([1, 2, 3], k=3, n_min=1, n_max=2) == []  # no n-gram seen before
    assert lookup([5, 5], k=3, n_min=1, n_max=4) == [5]  # what follows, up to the context's end
    with pytest.raises(ValueError):
        PromptLookup(0)


def test_prompt_lookup_emits_target_only_greedy_and_accepts_a_repeated_phrase() -> None:
    target = _tiny_target()
    prompt = [300, 301, 302, 303, 304, 305, 306, 307] * 3  # a repeated phrase the target may continue
    base = greedy_decode(target, prompt, 24, None)
    spec = speculative_decode(target, PromptLookup(k=7), prompt, 24, None)
    assert spec.tokens == base.tokens  # whatever is proposed, the target's greedy tokens come out
    assert sum(spec.accepted) == len(spec.tokens) - 1  # every verify forward's emitted tokens, prefill apart
    assert spec.target_forwards <= base.target_forwards


def test_acceptance_counts_only_what_is_emitted() -> None:
    """22 new tokens at block 4 with an oracle: the prefill's token, 5 whole blocks, then one forward that
    accepts 4 of which 1 is kept. Counting the 3 dropped ones read 4.0 instead of 21 / 6 = 3.5."""
    target, block, max_new = _tiny_target(), 4, 22
    prompt = PROMPTS[0]
    greedy = greedy_decode(target, prompt, max_new + 2 * block, None).tokens
    report = evaluate(target, OracleDrafter(greedy, len(prompt), block), [prompt], max_new=max_new)
    assert report.new_tokens == 22 and report.target_forwards == 7
    assert report.mean_accept_len == pytest.approx(21 / 6)
    assert report.accept_length_histogram == [1, 0, 0, 5]
    assert report.accept_by_position == pytest.approx([5 / 6] * 3, abs=1e-4)  # the cut forward emits 1


def test_acceptance_shape_is_per_slot_shares_and_a_length_histogram() -> None:
    walk = walk_of_lengths([0] * 11, [1, 3, 4, 2], [3, 3, 3, 0], 4, None)
    assert walk.emitted == [1, 1, 1, 1] and (walk.forwards, walk.drafted, walk.emitted_tokens) == (4, 3, 10)
    assert acceptance_shape(walk.emitted) == [
        0.75,
        0.5,
        0.25,
    ]  # slot 1 accepted in 3 of 4 forwards, slot 3 in 1


def test_the_cli_reports_the_drafter_and_prompt_lookup_side_by_side(tmp_path: Path, capsys) -> None:
    export = export_drafter(_untrained_drafter(), tmp_path / "export")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input_ids": p}) + "\n" for p in PROMPTS))
    args = ["eval", "--target", "tiny", "--prompts", str(prompts), "--max-new-tokens", "12"]
    assert run([*args, "--export", str(export), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["drafter"] == "dflash" and report["baseline"]["drafter"] == "ngram"
    assert report["baseline"]["block_size"] == report["block_size"] == 4  # lookup proposes B-1 as well
    assert len(report["accept_by_position"]) == 3 and sum(report["accept_length_histogram"]) > 0
    assert report["baseline"]["identical"]
    assert run([*args, "--export", str(export)]) == 0
    text = capsys.readouterr().out
    assert "the drafter (dflash, block 4)" in text and "prompt lookup (ngram, block 4)" in text
    assert "slot accepted (share of forwards)" in text
    assert run([*args, "--drafter", "ngram", "--json"]) == 0  # no export needed
    alone = json.loads(capsys.readouterr().out)
    assert alone["drafter"] == "ngram" and alone["baseline"] is None and alone["block_size"] == 16
    assert run([*args, "--drafter", "dflash"]) == 2  # the drafter needs its export
    assert "--export" in capsys.readouterr().err
