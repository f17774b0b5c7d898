"""`dflash-doctor eval`: greedy block speculative decoding emits exactly target-only greedy's tokens."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import Tensor

from dflash_doctor.cli import run
from trainer.drafter import DFlashDrafter, DrafterConfig
from trainer.eval import SpecTarget, evaluate, greedy_decode
from trainer.export import export_drafter
from trainer.tiny import build_embedded_target, tiny_qwen3_config

PROMPTS = [[5, 17, 300, 42, 9, 77], [1, 2, 3], [400, 401, 402, 403, 404, 405, 406, 407]]


def _tiny_target() -> SpecTarget:
    return SpecTarget(build_embedded_target("tiny", seed=0), [2])


def _untrained_drafter(block: int = 4) -> DFlashDrafter:
    model = build_embedded_target("tiny", seed=0)
    cfg = DrafterConfig.from_target(tiny_qwen3_config(), 1, block, 511, [2])
    torch.manual_seed(0)
    return DFlashDrafter(cfg, model.model.embed_tokens.weight, model.lm_head.weight)


class OracleDrafter:
    """Drafts the target's own greedy continuation (known in advance): every block should be accepted whole."""

    def __init__(self, continuation: list[int], prompt_len: int, block: int, vocab: int) -> None:
        self.cfg = SimpleNamespace(block_size=block)
        self.lm_head_weight = torch.eye(vocab)
        self.sequence, self.vocab = continuation, vocab
        self.prompt_len = prompt_len

    def draft_hidden(self, ids: Tensor, context: Tensor, anchor: Tensor, valid: Tensor) -> Tensor:
        start = int(anchor) + 1 - self.prompt_len  # the generated index the slot-1 token has
        picks = [self.sequence[min(start + k, len(self.sequence) - 1)] for k in range(self.cfg.block_size)]
        out = torch.zeros(1, 1, self.cfg.block_size, self.vocab)
        out[0, 0, torch.arange(self.cfg.block_size - 1) + 1, torch.tensor(picks[:-1])] = 1.0
        return out


def test_untrained_drafter_output_equals_target_only_greedy() -> None:
    report = evaluate(_tiny_target(), _untrained_drafter(), PROMPTS, max_new=20)
    assert report.identical and all(r.identical for r in report.per_prompt)
    assert report.new_tokens == 60 and 1.0 <= report.mean_accept_len <= 4.0
    assert report.baseline_forwards == 60  # one forward per token
    assert report.target_forwards <= report.baseline_forwards


def test_an_oracle_drafter_gets_whole_blocks_accepted() -> None:
    target, block, max_new = _tiny_target(), 4, 21
    prompt = PROMPTS[0]
    greedy = greedy_decode(target, prompt, max_new + block, None).tokens
    oracle = OracleDrafter(greedy, len(prompt), block, 512)
    report = evaluate(target, oracle, [prompt], max_new=max_new)  # type: ignore[arg-type]
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
