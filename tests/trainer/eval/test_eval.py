"""`dflash-doctor eval`: greedy block speculative decoding emits exactly target-only greedy's tokens, and a
first difference is told apart: a near-tie flip (exit 0) from a token the target did not choose (exit 1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from dflash_doctor.cli import run
from trainer.eval.evaluate import evaluate
from trainer.eval.report import format_report
from trainer.eval.speculative import SpecTarget, greedy_decode
from trainer.model.drafter import DFlashDrafter, DrafterConfig
from trainer.model.export import export_drafter
from trainer.runspec.target_shapes import tiny_qwen3_config
from trainer.target_model.tiny import build_embedded_target

PROMPTS = [[5, 17, 300, 42, 9, 77], [1, 2, 3], [400, 401, 402, 403, 404, 405, 406, 407]]


def _tiny_target() -> SpecTarget:
    return SpecTarget(build_embedded_target("tiny", seed=0), [2])


def _untrained_drafter(block: int = 4) -> DFlashDrafter:
    model = build_embedded_target("tiny", seed=0)
    cfg = DrafterConfig.from_target(tiny_qwen3_config(), 1, block, 511, [2])
    torch.manual_seed(0)
    return DFlashDrafter(cfg, model.model.embed_tokens.weight, model.lm_head.weight)


class OracleDrafter:
    """Proposes the target's own greedy continuation (known in advance): every block should be accepted whole."""

    name, needs_features = "oracle", False

    def __init__(self, continuation: list[int], prompt_len: int, block: int) -> None:
        self.max_draft = block - 1
        self.sequence, self.prompt_len = continuation, prompt_len

    def start(self) -> None:
        pass

    def propose(self, ids: list[int], features: Tensor | None) -> list[int]:
        start = len(ids) - self.prompt_len  # the generated index the next token has
        return [self.sequence[min(start + k, len(self.sequence) - 1)] for k in range(self.max_draft)]


def test_untrained_drafter_output_equals_target_only_greedy() -> None:
    report = evaluate(_tiny_target(), _untrained_drafter(), PROMPTS, max_new=20)
    assert report.identical and all(r.identical for r in report.per_prompt)
    assert (report.ties, report.differences, report.exit_code(strict=True)) == (0, 0, 0)
    assert {r.comparison.verdict for r in report.per_prompt} == {"identical"}
    assert report.dtype == "float32" and report.tie_ulps == 64  # fp32's default
    assert report.new_tokens == 60 and 1.0 <= report.mean_accept_len <= 4.0
    assert report.baseline_forwards == 60  # one forward per token
    assert report.target_forwards <= report.baseline_forwards


def test_an_oracle_drafter_gets_whole_blocks_accepted() -> None:
    target, block, max_new = _tiny_target(), 4, 21
    prompt = PROMPTS[0]
    greedy = greedy_decode(target, prompt, max_new + block, None).tokens
    oracle = OracleDrafter(greedy, len(prompt), block)
    report = evaluate(target, oracle, [prompt], max_new=max_new)
    assert report.identical
    assert report.mean_accept_len == block  # every verify forward accepts B-1 drafts + the bonus token
    assert report.target_forwards == 1 + 5  # prefill (1 token) + 5 verify forwards of 4 tokens


def test_cli_eval_with_a_prompts_file_and_json(tmp_path: Path, capsys) -> None:
    export = export_drafter(_untrained_drafter(), tmp_path / "export")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input_ids": p}) + "\n" for p in PROMPTS))
    args = ["eval", "--export", str(export), "--target", "tiny", "--prompts", str(prompts)]
    assert run([*args, "--max-new-tokens", "8", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["identical"] and report["prompts"] == 3 and report["new_tokens"] == 24
    assert {"mean_accept_len", "target_forwards", "tok_s", "baseline_tok_s", "speedup"} <= report.keys()
    prompts.write_text('{"prompt": "hello"}\n')  # text needs a tokenizer; tiny has none
    assert run(args) == 2
    err = " ".join(capsys.readouterr().err.split())  # rich wraps at the terminal width
    assert 'prompts.jsonl line 1: this target has no tokenizer; give "input_ids"' in err
    assert (
        run(["eval", "--export", str(tmp_path / "nowhere"), "--target", "tiny", "--prompts", str(prompts)])
        == 2
    )


FLIP_AT = 9  # the absolute position rewritten below: new token 3 of PROMPTS[0] (6 tokens)


def _rewrite_logits_at(monkeypatch: pytest.MonkeyPatch, position: int, how: str) -> None:
    """Rewrite the target's logits for the token at `position`, as bf16 rounding (or a bug) would.

    "tie": the runner-up sits 1e-5 below the top in a 1-token forward (greedy decoding) and 1e-5 above it in
    a multi-token one (the verify forward): the argmax flips between the paths on a near-tie.
    "bug": multi-token forwards put the target's lowest-rated token on top by 5 logits.
    """
    original = SpecTarget.logits

    def logits(self: SpecTarget, ids: Tensor, cache: Any) -> tuple[Tensor, Tensor, Any]:
        start = cache.get_seq_length() if cache is not None else 0
        out, features, cache = original(self, ids, cache)
        row = position - 1 - start  # row r predicts the token at start + r + 1
        if not 0 <= row < ids.shape[1]:
            return out, features, cache
        out = out.clone()
        best, runner_up = out[row].topk(2).indices.tolist()
        if how == "tie":
            out[row, runner_up] = out[row, best] + (1e-5 if ids.shape[1] > 1 else -1e-5)
        elif ids.shape[1] > 1:
            out[row, int(out[row].argmin())] = out[row, best] + 5.0
        return out, features, cache

    monkeypatch.setattr(SpecTarget, "logits", logits)


def test_a_near_tie_flip_is_a_tie_and_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    _rewrite_logits_at(monkeypatch, FLIP_AT, "tie")
    long_prompt = list(range(100, 112))  # position 9 lies inside it: its outputs stay untouched
    report = evaluate(_tiny_target(), _untrained_drafter(), [PROMPTS[0], long_prompt], max_new=8)
    flipped, untouched = report.per_prompt
    assert not report.identical and not flipped.identical and untouched.identical
    assert flipped.comparison.verdict == "tie" and flipped.comparison.first_diff == FLIP_AT - len(PROMPTS[0])
    assert flipped.comparison.greedy_margin == pytest.approx(1e-5, rel=0.2)
    assert flipped.comparison.spec_margin == pytest.approx(1e-5, rel=0.2)
    assert (report.ties, report.differences) == (1, 0)
    assert report.exit_code() == 0 and report.exit_code(strict=True) == 1
    text = format_report(report)
    assert (
        "1 bitwise, 1 differ only by a near-tie flip" in text and "prompt 1: tie at new token index 3" in text
    )


def test_a_token_the_target_did_not_choose_is_different_and_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    _rewrite_logits_at(monkeypatch, FLIP_AT, "bug")
    report = evaluate(_tiny_target(), _untrained_drafter(), PROMPTS[:1], max_new=8)
    comparison = report.per_prompt[0].comparison
    assert comparison.verdict == "different" and comparison.first_diff == 3
    assert comparison.greedy_margin is None  # the greedy path has it nowhere near its top 4
    assert (report.ties, report.differences, report.exit_code()) == (0, 1, 1)
    assert "DIFFERENT from target-only greedy decoding in 1 of 1 prompts" in format_report(report)


def _cli_args(tmp_path: Path) -> list[str]:
    export = export_drafter(_untrained_drafter(), tmp_path / "export")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"input_ids": PROMPTS[0]}) + "\n")
    return [
        "eval",
        "--export",
        str(export),
        "--target",
        "tiny",
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "8",
        "--engine",
        "loop",  # the rewritten logits are the Python loop's (the engine's own: tests/trainer/eval/test_eval_engine.py)
    ]


def test_cli_exit_codes_for_a_tie_strict_and_a_bad_tolerance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _cli_args(tmp_path)
    _rewrite_logits_at(monkeypatch, FLIP_AT, "tie")
    assert run([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["identical"], report["ties"], report["differences"]) == (False, 1, 0)
    assert report["per_prompt"][0]["comparison"]["verdict"] == "tie"
    assert report["per_prompt"][0]["comparison"]["first_diff"] == 3
    assert run([*args, "--strict"]) == 1
    assert run([*args, "--tie-ulps", "0"]) == 1  # 0 accepts only bitwise ties: this one is 1e-5 apart
    capsys.readouterr()
    assert run([*args, "--tie-ulps", "-1"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--tie-ulps: -1 is not a tolerance; give the ulps of the top logit" in err
    assert run([*args, "--tie-ulps", "nan"]) == 2  # refused before anything loads


def test_cli_exits_1_on_a_real_difference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _cli_args(tmp_path)
    _rewrite_logits_at(monkeypatch, FLIP_AT, "bug")
    assert run(args) == 1
    assert "prompt 1: different at new token index 3" in capsys.readouterr().out


@pytest.mark.slow
def test_bf16_rounding_flips_are_ties_never_differences() -> None:
    """Real bf16 (no rewritten logits): verify and decode forwards round differently; eval must still pass."""
    model = build_embedded_target("tiny", seed=0, dtype=torch.bfloat16)
    target = SpecTarget(model, [2])
    drafter = _untrained_drafter().to(torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 511, (32,), generator=gen).tolist() for _ in range(16)]
    report = evaluate(target, drafter, prompts, max_new=64)
    assert report.dtype == "bfloat16" and report.tie_ulps == 16
    assert report.differences == 0 and report.exit_code() == 0
    for row in report.per_prompt:  # any flip is a tie whose both margins were seen in the top-k
        margins = (row.comparison.greedy_margin, row.comparison.spec_margin)
        assert row.identical or (row.comparison.verdict == "tie" and None not in margins)


def test_cli_dtype_chooses_the_compute_dtype_and_refuses_an_unknown_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _cli_args(tmp_path)
    assert run([*args, "--dtype", "bf16", "--json"]) in (0, 1)  # bf16 on CPU: ties allowed, not the point
    report = json.loads(capsys.readouterr().out)
    assert report["dtype"] == "bfloat16" and report["tie_ulps"] == 16
    assert run([*args, "--dtype", "fp32", "--strict", "--json"]) == 0  # fp32: bitwise identical
    assert json.loads(capsys.readouterr().out)["dtype"] == "float32"
    assert run([*args, "--dtype", "fp64"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert '--dtype: "fp64" is not one of auto, bf16, fp32' in err


def test_cli_refuses_a_device_eval_cannot_run_on_and_names_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--device tpu` ran on the CPU with exit 0; `--device cuda` without CUDA answered about `run.device`."""
    args = _cli_args(tmp_path)
    assert run([*args, "--device", "tpu"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--device 'tpu': eval runs on auto, cpu, cuda or cuda:N" in err
    if not torch.cuda.is_available():
        assert run([*args, "--device", "cuda"]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert "--device cuda: torch sees no CUDA device here" in err and "run.device" not in err


def test_with_prompts_a_config_holding_out_less_than_a_batch_is_evaluated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--prompts` replaces the held-out sequences; a config whose split holds out fewer than one batch (6 of
    64) was refused anyway, and is taken now that the last held-out batch is padded (issue 38 D8)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"input_ids": PROMPTS[0]}) + "\n")
    args = ["eval", "--drafter", "ngram", "--config", "tiny-cpu", "--set", "data.num_samples=64"]
    assert run([*args, "--prompts", str(prompts), "--max-new-tokens", "4", "--json"]) == 0, (
        capsys.readouterr()
    )
    assert json.loads(capsys.readouterr().out)["prompts"] == 1


def test_a_prompts_line_with_both_prompt_and_messages_is_refused_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 39 U14: "prompt" was used and "messages" dropped without a word (data regenerate took the
    other one)."""
    prompts = tmp_path / "prompts.jsonl"
    chat = [{"role": "user", "content": "a question"}]
    lines = [{"input_ids": PROMPTS[0]}, {"prompt": "another", "messages": chat}]
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    args = ["eval", "--drafter", "ngram", "--config", "tiny-cpu", "--prompts", str(prompts)]
    assert run([*args, "--max-new-tokens", "4"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f'{prompts} line 2: gives both "prompt" and "messages"' in err, err


def test_a_prompts_file_with_a_utf8_byte_order_mark_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 39 U15: a BOM (Windows editors) made line 1 "not JSON", refusing the file."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b"\xef\xbb\xbf" + (json.dumps({"input_ids": PROMPTS[0]}) + "\n").encode())
    args = ["eval", "--drafter", "ngram", "--config", "tiny-cpu", "--prompts", str(prompts)]
    assert run([*args, "--max-new-tokens", "4", "--json"]) == 0, capsys.readouterr()
    assert json.loads(capsys.readouterr().out)["prompts"] == 1
