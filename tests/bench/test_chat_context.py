"""bench/decode/chat_context.py's options (issue 38, Q1): the tiny default and a real `--target` folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomllib

from bench.decode.chat_context import make_prompts, parse_args, write_config


def test_defaults_are_the_tiny_run() -> None:
    args = parse_args([])
    assert args.target is None and args.turns == 3 and args.layers == 1 and args.batch_size == 8
    assert args.regenerate_batch is None


def test_target_needs_a_model_folder(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--target", str(tmp_path)])
    with pytest.raises(json.JSONDecodeError):
        parse_args(["--kwargs", "{enable_thinking: false}"])
    (tmp_path / "config.json").write_text("{}")
    assert parse_args(["--target", str(tmp_path)]).target == tmp_path


def test_config_follows_the_sizes(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    for argv, mask in (([], 511), (["--target", str(tmp_path)], None)):
        args = parse_args([*argv, "--layers", "2", "--seq-len", "256", "--batch-size", "4", "--lr", "1e-3"])
        path = tmp_path / "c.toml"
        write_config(
            path, tmp_path, tmp_path / "d.jsonl", tmp_path / "o", {"enable_thinking": False}, 7, args
        )
        cfg = tomllib.loads(path.read_text())
        assert cfg["drafter"]["layers"] == 2 and cfg["drafter"].get("mask_token_id") == mask
        assert cfg["data"]["seq_len"] == 256 and cfg["data"]["chat_template_kwargs"] == {
            "enable_thinking": False
        }
        assert cfg["optim"] == {"lr": 1e-3, "steps": 7, "batch_size": 4, "anchors": 32}


def test_prompts(tmp_path: Path) -> None:
    for natural in (False, True):
        make_prompts(tmp_path / "p.jsonl", 5, 0, turns=2, natural=natural)
        records = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
        assert len(records) == 5
        for record in records:
            roles = [m["role"] for m in record["messages"]]
            assert roles == ["user", "assistant"] * 2
            assert all(m["content"] == "" for m in record["messages"] if m["role"] == "assistant")
    assert records[0]["messages"][0]["content"].endswith(("the moon.", "the moon?", "the moon briefly."))


def test_a_gpu_run_trains_on_cuda_and_decodes_in_bf16(tmp_path: Path) -> None:
    from bench.decode.chat_context import eval_precision

    for device, precision in (("cpu", ["--dtype", "fp32", "--strict"]), ("cuda", ["--dtype", "bf16"])):
        args = parse_args(["--device", device])
        write_config(tmp_path / "c.toml", tmp_path, tmp_path / "d.jsonl", tmp_path / "o", {}, 3, args)
        assert tomllib.loads((tmp_path / "c.toml").read_text())["run"]["device"] == device
        assert eval_precision(device) == precision
    with pytest.raises(SystemExit):
        parse_args(["--device", "tpu"])


def test_first_turns_come_from_a_prompt_set(tmp_path: Path) -> None:
    from bench.decode.chat_context import first_turns

    prompts = tmp_path / "prompts.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"question {j}"}]} for j in range(6)]
    rows += [
        {"prompt": "question 0"},
        {"prompt": "a plain prompt"},
        {"messages": [{"role": "system", "content": "x"}]},
    ]
    prompts.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    picked = first_turns(prompts, 7, 0)
    assert len(set(picked)) == 7 and set(picked) <= {f"question {j}" for j in range(6)} | {"a plain prompt"}
    assert first_turns(prompts, 7, 0) == picked  # seeded
    with pytest.raises(SystemExit, match="7 distinct prompts, fewer than --conversations 8"):
        first_turns(prompts, 8, 0)
    make_prompts(tmp_path / "c.jsonl", 3, 0, turns=2, natural=True, firsts=picked[:3])
    records = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert [r["messages"][0]["content"] for r in records] == picked[:3]
    assert all(r["messages"][2]["content"] for r in records)  # the follow-ups stay


def test_first_prompts_need_a_real_target_and_a_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "p.jsonl").write_text("{}\n")
    with pytest.raises(SystemExit):
        parse_args(["--first-prompts", str(tmp_path / "p.jsonl")])  # the tiny target's words
    with pytest.raises(SystemExit):
        parse_args(["--target", str(tmp_path), "--first-prompts", str(tmp_path / "absent.jsonl")])
    args = parse_args(["--target", str(tmp_path), "--first-prompts", str(tmp_path / "p.jsonl")])
    assert args.first_prompts == tmp_path / "p.jsonl"


def test_the_checkouts_cli_keeps_the_callers_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a device machine's carried wheels are on PYTHONPATH: the checkout goes first, they stay (S14 lost them)
    import subprocess

    from bench.decode import chat_context

    seen: dict[str, str] = {}

    def fake_run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        seen.update(kwargs["env"])  # type: ignore[arg-type]
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(chat_context.subprocess, "run", fake_run)
    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    chat_context.cli(tmp_path, "check")
    assert seen["PYTHONPATH"].split(":") == [str(tmp_path), "/tmp/site"]


def test_eval_shards_default_to_one_process_and_the_gpu_suite_uses_sixteen() -> None:
    """One process on a CPU (the dry run's numbers stay as they were); the H200 suite decodes in 16 (S18's
    100 prompts took ~7 minutes in one process, which lost the after arm's eval to the lease's end)."""
    assert parse_args([]).eval_shards == 1
    assert parse_args(["--eval-shards", "16"]).eval_shards == 16
    suite = (Path(__file__).resolve().parents[2] / "bench" / "suites" / "context_h200.sh").read_text()
    assert "--eval-shards 16" in suite and "python3 -u -m bench.decode.chat_context" in suite
