"""`data regenerate`: inputs, turn-by-turn answers, resume, torn and damaged output, engines (CPU, tiny target)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from dflash_doctor.cli import run as cli_run
from tests.disk_fixtures import small_disk  # noqa: F401  (fixture)
from trainer.engine.target import Chat
from trainer.regenerate.conversations import PromptRecord, RecordError, Regeneration, parse_record
from trainer.regenerate.job import RegenerateError, regenerate, resume_state, scan_input
from trainer.regenerate.settings import Completion, GenerationSettings

ROOT = Path(__file__).resolve().parents[3]
SETTINGS = GenerationSettings(target="/models/t", max_new_tokens=8)


class EchoEngine:
    """Answers `a<k>:<turns>` (k counts calls' answers): the prompt length shows what the answer saw."""

    name = "fake"
    rows_at_once = 1

    def __init__(self, fail_after_calls: int | None = None) -> None:
        self.calls: list[list[Chat]] = []
        self.fail_after_calls = fail_after_calls
        self.closed = False

    def generate(self, chats: Sequence[Chat]) -> list[Completion]:
        if self.fail_after_calls is not None and len(self.calls) >= self.fail_after_calls:
            raise KeyboardInterrupt
        self.calls.append([list(c) for c in chats])
        return [Completion(f"answer to {c[-1]['content']}", 3, "stop") for c in chats]

    def close(self) -> None:
        self.closed = True


def write_prompts(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


# ---------------------------------------------------------------- input records


def test_prompt_and_chat_records_parse() -> None:
    assert parse_record(3, '{"prompt": "hi"}') == PromptRecord(
        "line-3", 3, ({"role": "user", "content": "hi"},)
    )
    chat = parse_record(
        1,
        json.dumps(
            {"id": 7, "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]}
        ),
    )
    assert chat.id == "7" and [m["role"] for m in chat.messages] == ["system", "user"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "JSON object"),
        ('{"text": "x"}', 'needs "messages"'),
        ('{"messages": [{"role": "assistant", "content": "a"}]}', "must follow a user"),
        (
            '{"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "s"}]}',
            "only come first",
        ),
        (
            '{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}',
            "out of order",
        ),
        ('{"messages": [{"role": "bot", "content": "a"}]}', "role must be one of"),
        ('{"messages": [{"role": "user", "content": 3}]}', "content must be a string"),
        ('{"prompt": ""}', "non-empty"),
    ],
)
def test_bad_records_name_their_line(text: str, says: str) -> None:
    with pytest.raises(RecordError, match=says) as info:
        parse_record(12, text)
    assert info.value.line == 12 and "line 12" in str(info.value)


def test_every_assistant_turn_is_answered_again_from_the_conversation_so_far() -> None:
    record = parse_record(
        1,
        json.dumps(
            {
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "q1"},
                    {"role": "assistant", "content": "OLD1"},
                    {"role": "user", "content": "q2"},
                    {"role": "assistant", "content": "OLD2"},
                    {"role": "user", "content": "q3"},
                ]
            }
        ),
    )
    walk = Regeneration(record)
    seen = []
    while (prompt := walk.prompt()) is not None:
        seen.append([m["content"] for m in prompt])
        walk.answer(f"NEW{len(seen)}", "stop", 2)
    # three answers: two in place of the old ones, one for the trailing user turn
    assert seen == [
        ["be brief", "q1"],
        ["be brief", "q1", "NEW1", "q2"],
        ["be brief", "q1", "NEW1", "q2", "NEW2", "q3"],
    ]
    assert [m["content"] for m in walk.turns] == ["be brief", "q1", "NEW1", "q2", "NEW2", "q3", "NEW3"]
    assert "OLD1" not in json.dumps(walk.turns) and walk.generated_tokens == 6 and walk.done


# ---------------------------------------------------------------- the job


def test_chat_and_prompt_inputs_become_chat_records(tmp_path: Path) -> None:
    prompts = write_prompts(
        tmp_path / "in.jsonl",
        [
            {"id": "a", "prompt": "p1"},
            {
                "id": "b",
                "messages": [
                    {"role": "user", "content": "u1"},
                    {"role": "assistant", "content": "x"},
                    {"role": "user", "content": "u2"},
                    {"role": "assistant", "content": "y"},
                ],
            },
        ],
    )
    out = tmp_path / "out.jsonl"
    summary = regenerate(scan_input(prompts, "stop"), out, SETTINGS, EchoEngine)
    got = lines(out)
    assert [g["id"] for g in got] == ["a", "b"] and summary.written == 2 and summary.answers == 3
    assert got[0]["messages"] == [
        {"role": "user", "content": "p1"},
        {"role": "assistant", "content": "answer to p1"},
    ]
    assert [m["content"] for m in got[1]["messages"]] == ["u1", "answer to u1", "u2", "answer to u2"]
    meta = got[1]["generation"]
    assert (
        meta["target"] == "/models/t"
        and meta["max_new_tokens"] == 8
        and meta["finish_reasons"] == ["stop", "stop"]
    )


def test_turn_k_of_every_conversation_goes_in_one_engine_call(tmp_path: Path) -> None:
    records = [
        {
            "messages": [
                {"role": "user", "content": f"u{i}"},
                {"role": "assistant", "content": "x"},
                {"role": "user", "content": "again"},
            ]
        }
        for i in range(3)
    ]
    engine = EchoEngine()
    regenerate(
        scan_input(write_prompts(tmp_path / "in.jsonl", records), "stop"),
        tmp_path / "o.jsonl",
        SETTINGS,
        lambda: engine,
    )
    assert [len(call) for call in engine.calls] == [3, 3] and engine.closed
    assert (
        engine.calls[1][0][1]["content"] == "answer to u0"
    )  # the second turn saw the target's own first answer


def test_resume_after_a_stop_mid_file_loses_and_repeats_nothing(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": f"p{i}"} for i in range(10)])
    out = tmp_path / "out.jsonl"
    scan = scan_input(prompts, "stop")
    with pytest.raises(KeyboardInterrupt):
        regenerate(scan, out, SETTINGS, lambda: EchoEngine(fail_after_calls=2), chunk_size=3)
    assert [g["id"] for g in lines(out)] == [f"r{i}" for i in range(6)]  # two whole chunks, nothing torn
    summary = regenerate(scan, out, SETTINGS, EchoEngine, chunk_size=3)
    assert summary.skipped_done == 6 and summary.written == 4
    assert [g["id"] for g in lines(out)] == [f"r{i}" for i in range(10)]


def test_a_torn_last_line_is_dropped_and_generated_again(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": f"p{i}"} for i in range(3)])
    out = tmp_path / "out.jsonl"
    scan = scan_input(prompts, "stop")
    regenerate(scan, out, SETTINGS, EchoEngine, limit=2)
    whole = out.read_text().splitlines(keepends=True)
    out.write_text(whole[0] + whole[1][:25])  # a crash in the middle of the second line
    assert resume_state(out, SETTINGS, force=False) == {"r0"}
    assert out.read_text() == whole[0]
    regenerate(scan, out, SETTINGS, EchoEngine)
    assert [g["id"] for g in lines(out)] == ["r0", "r1", "r2"]


def test_a_damaged_line_inside_the_output_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text("garbage\n" + json.dumps({"id": "x", "generation": SETTINGS.to_json()}) + "\n")
    with pytest.raises(RegenerateError, match="line 1 is damaged"):
        resume_state(out, SETTINGS, force=False)


def test_an_output_of_other_settings_is_refused_unless_forced(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "in.jsonl", [{"id": "r0", "prompt": "p"}])
    out = tmp_path / "out.jsonl"
    scan = scan_input(prompts, "stop")
    regenerate(scan, out, SETTINGS, EchoEngine)
    other = GenerationSettings(target="/models/other", max_new_tokens=8)
    with pytest.raises(RegenerateError, match="other settings") as info:
        regenerate(scan, out, other, EchoEngine)
    assert "/models/t" in info.value.message and len(lines(out)) == 1
    summary = regenerate(scan, out, other, EchoEngine, force=True)
    assert summary.written == 1 and lines(out)[0]["generation"]["target"] == "/models/other"
    assert len(list(tmp_path.glob("out.jsonl.old-*"))) == 1  # the old file kept beside


def test_a_run_that_fails_before_its_first_answer_leaves_no_file(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "in.jsonl", [{"id": "r0", "prompt": "p"}])
    out = tmp_path / "out.jsonl"
    with pytest.raises(KeyboardInterrupt):
        regenerate(scan_input(prompts, "stop"), out, SETTINGS, lambda: EchoEngine(fail_after_calls=0))
    assert not out.exists()  # was a 0-byte --out


def test_out_on_a_full_disk_names_the_path_and_keeps_the_whole_lines(small_disk, tmp_path: Path) -> None:  # noqa: F811
    from dflash_base.disk import NoSpace

    disk = small_disk(64)
    records = [{"id": f"r{i}", "prompt": "p" * 300} for i in range(200)]
    prompts = write_prompts(tmp_path / "in.jsonl", records)
    out = disk / "out.jsonl"
    with pytest.raises(NoSpace) as caught:
        regenerate(scan_input(prompts, "stop"), out, SETTINGS, EchoEngine, chunk_size=10)
    assert caught.value.path == str(out) and "no space left on the device for" in caught.value.message
    kept = lines(out)  # every line whole: a re-run resumes after them
    assert (
        kept and len(kept) % 10 == 0 and resume_state(out, SETTINGS, force=False) == {r["id"] for r in kept}
    )


def test_in_a_pipe_a_progress_line_comes_while_a_chunk_is_answered(
    target_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Off a terminal no bar is drawn: a line at least every EVERY_S seconds (30; 0.2 here) even while the
    first chunk is still being answered (CPU, 1024 new tokens: 11 minutes of nothing before)."""
    from dflash_doctor import progress
    from dflash_doctor.commands import data as data_command

    class SlowEngine(EchoEngine):
        def generate(self, chats: Sequence[Chat]) -> list[Completion]:
            time.sleep(1.0)
            return super().generate(chats)

    monkeypatch.setattr(progress, "EVERY_S", 0.2)
    monkeypatch.setattr(data_command, "_engine_factory", lambda *a: SlowEngine)
    prompts = write_prompts(tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": "w1"} for i in range(3)])
    config = tmp_path / "run.toml"
    config.write_text(
        f'[target]\npath = "{target_folder}"\n[data]\nkind = "chat"\npath = "x.jsonl"\n[optim]\nsteps = 1\n'
    )
    argv = [
        "data",
        "regenerate",
        "--config",
        str(config),
        "--prompts",
        str(prompts),
        "--out",
        str(tmp_path / "o"),
    ]
    assert cli_run(argv) == 0
    err = capsys.readouterr().err.splitlines()
    waiting = [line for line in err if line.startswith("regenerating: 0 of 3 conversations written")]
    assert len(waiting) >= 3, err  # while the one chunk was answered
    assert any(line.startswith("regenerating: 3 of 3 conversations written, 3 answers") for line in err), err


def test_loading_the_target_draws_no_bar_of_transformers(target_folder: Path, capfd) -> None:
    from trainer.target_model.load import load_target_model

    capfd.readouterr()
    load_target_model(str(target_folder), 0, __import__("torch").device("cpu"), __import__("torch").float32)
    captured = capfd.readouterr()
    assert "Loading weights" not in captured.err + captured.out


def test_bad_input_lines_stop_or_are_skipped(tmp_path: Path) -> None:
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "ok"}\n{"oops": 1}\n{"id": "line-1", "prompt": "dup"}\n')
    with pytest.raises(RegenerateError, match="line 2") as info:
        scan_input(prompts, "stop")
    assert "--on-error skip" in (info.value.hint or "")
    scan = scan_input(prompts, "skip")
    assert [r.id for r in scan.records] == ["line-1"] and [b.line for b in scan.bad] == [2, 3]


# ---------------------------------------------------------------- the real engine on the tiny target


@pytest.fixture(scope="module")
def target_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from bench.lib.target_folder import make_target_folder

    return make_target_folder(tmp_path_factory.mktemp("target"))


def test_torch_engine_is_greedy_and_batching_changes_nothing(target_folder: Path) -> None:
    import torch

    from trainer.engine.target import prompt_ids
    from trainer.regenerate.generate_engine import TorchEngine

    settings = GenerationSettings(target=str(target_folder), max_new_tokens=6)
    engine = TorchEngine(settings, "cpu", batch_size=4)
    chats = [[{"role": "user", "content": "w1 w2 w3 w4 w5"}], [{"role": "user", "content": "w9"}]]
    together = engine.generate(chats)
    alone = [engine.generate([c])[0] for c in chats]
    assert together == alone  # left padding and the attention mask keep rows independent
    ids = prompt_ids(engine.tokenizer, chats[1], {})
    with torch.no_grad():  # a plain greedy loop, no cache
        for _ in range(6):
            nxt = int(engine.model(torch.tensor([ids])).logits[0, -1].argmax())
            if nxt in engine.stop_ids:
                break
            ids.append(nxt)
    expected = engine.tokenizer.decode(ids[len(prompt_ids(engine.tokenizer, chats[1], {})) :])
    assert together[1].text == expected and together[1].tokens >= 1


def test_cli_regenerates_a_file_that_trains_as_chat(
    target_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainer.data.sources import build_source
    from trainer.runspec.config import load_config

    config = tmp_path / "run.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            [target]
            path = "{target_folder}"
            [data]
            kind = "chat"
            path = "{tmp_path / "regen.jsonl"}"
            seq_len = 64
            [drafter]
            mask_token_id = 511
            [optim]
            steps = 2
            """
        )
    )
    prompts = write_prompts(
        tmp_path / "in.jsonl",
        [
            {"id": "q1", "prompt": "w1 w2"},
            {
                "id": "q2",
                "messages": [
                    {"role": "user", "content": "w3"},
                    {"role": "assistant", "content": "w4"},
                    {"role": "user", "content": "w5"},
                ],
            },
        ],
    )
    argv = [
        "data",
        "regenerate",
        "--config",
        str(config),
        "--prompts",
        str(prompts),
        "--out",
        str(tmp_path / "regen.jsonl"),
        "--max-new-tokens",
        "5",
        "--engine",
        "torch",
        "--json",
    ]
    assert cli_run(argv) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    # a random target at 5 new tokens: answers are cut short, and the command says so
    assert report["answers_cut_at_max_new_tokens"] > 0
    cut = f"{report['answers_cut_at_max_new_tokens']} of {report['answers']} answers"
    assert cut in " ".join(captured.err.split()) and "stopped at --max-new-tokens 5" in captured.err
    got = lines(tmp_path / "regen.jsonl")
    assert [g["id"] for g in got] == ["q1", "q2"] and got[1]["generation"]["engine"] == "torch"
    assert cli_run(argv) == 0  # everything already there: nothing regenerated
    assert len(lines(tmp_path / "regen.jsonl")) == 2
    cfg = load_config(config)  # the file passes the launch's data check
    source = build_source(cfg, __import__("torch").device("cpu"), 512)
    ids, mask = source.get(1)
    assert len(source) == 2 and 0 < int(mask.sum()) < int((ids != 0).sum())  # assistant turns only


def test_cli_refuses_a_bad_line_with_exit_2_before_loading_the_target(
    target_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "ok"}\nnot json\n')
    config = tmp_path / "run.toml"
    config.write_text(
        f'[target]\npath = "{target_folder}"\n[data]\nkind = "chat"\npath = "x.jsonl"\n'
        "[drafter]\nmask_token_id = 511\n[optim]\nsteps = 1\n"
    )
    argv = [
        "data",
        "regenerate",
        "--config",
        str(config),
        "--prompts",
        str(prompts),
        "--out",
        str(tmp_path / "o.jsonl"),
    ]
    assert cli_run(argv) == 2
    err = " ".join(capsys.readouterr().err.split())  # rich may wrap the line
    assert "line 2: not JSON" in err and not (tmp_path / "o.jsonl").exists()


# ---------------------------------------------------------------- a kill, for real


def test_sigkill_mid_file_then_resume_has_every_id_once(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": f"p{i}"} for i in range(40)])
    out = tmp_path / "out.jsonl"
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from tests.trainer.regenerate.test_regenerate import EchoEngine, SETTINGS
        from trainer.regenerate.job import regenerate, scan_input
        class Slow(EchoEngine):
            def generate(self, chats):
                time.sleep(0.05)
                return super().generate(chats)
        regenerate(scan_input(__import__("pathlib").Path({str(prompts)!r}), "stop"),
                   __import__("pathlib").Path({str(out)!r}), SETTINGS, Slow, chunk_size=2)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not out.exists() or out.stat().st_size < 2000):
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    written = [g["id"] for g in lines(out)] if out.exists() else []
    assert 0 < len(written) < 40
    regenerate(scan_input(prompts, "stop"), out, SETTINGS, EchoEngine)
    ids = [g["id"] for g in lines(out)]
    assert sorted(ids) == sorted(f"r{i}" for i in range(40)) and len(ids) == len(set(ids))


# ---------------------------------------------------------------- vLLM, faked


def test_vllm_engine_hands_chats_and_template_kwargs_to_llm_chat(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    seen: dict = {}

    class FakeLLM:
        def __init__(self, model: str, tensor_parallel_size: int) -> None:
            seen["init"] = (model, tensor_parallel_size)

        def chat(self, chats, sampling_params, chat_template_kwargs, use_tqdm):
            seen["chat"] = (chats, sampling_params, chat_template_kwargs)
            out = types.SimpleNamespace(text="hello", token_ids=[1, 2, 3], finish_reason="length")
            return [types.SimpleNamespace(outputs=[out]) for _ in chats]

    fake = types.SimpleNamespace(LLM=FakeLLM, SamplingParams=lambda **kw: kw)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    from trainer.regenerate.vllm_engine import VllmEngine

    settings = GenerationSettings(
        target="/m", max_new_tokens=9, chat_template_kwargs={"enable_thinking": False}
    )
    engine = VllmEngine(settings, tensor_parallel_size=2)
    got = engine.generate([[{"role": "user", "content": "hi"}]])
    assert got == [Completion("hello", 3, "length")] and seen["init"] == ("/m", 2)
    assert seen["chat"][1]["max_tokens"] == 9 and seen["chat"][1]["temperature"] == 0.0
    assert seen["chat"][2] == {"enable_thinking": False}


def test_a_pool_of_device_processes_gives_the_same_answers(target_folder: Path) -> None:
    from trainer.regenerate.engines import DevicePool
    from trainer.regenerate.generate_engine import TorchEngine

    settings = GenerationSettings(target=str(target_folder), max_new_tokens=4)
    chats = [[{"role": "user", "content": f"w{i} w{i + 1}"}] for i in range(5)]
    pool = DevicePool(settings, ["cpu", "cpu"], batch_size=2)
    try:
        pooled = pool.generate(chats)
    finally:
        pool.close()
    assert pooled == TorchEngine(settings, "cpu").generate(chats)
    assert not any(p.is_alive() for p in pool.procs)


def test_a_static_cache_gives_the_same_tokens_as_the_dynamic_one(target_folder: Path) -> None:
    from trainer.regenerate.generate_engine import WIDTH_BUCKET, TorchEngine, generate_token_batch

    engine = TorchEngine(GenerationSettings(target=str(target_folder), max_new_tokens=5), "cpu")
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12]]  # padded to WIDTH_BUCKET columns under the static cache
    args = (engine.model, prompts, engine.settings, engine.pad_id, engine.stop_ids)
    assert len(prompts[0]) < WIDTH_BUCKET
    dynamic = generate_token_batch(*args, seed=0)
    static = generate_token_batch(*args, seed=0, static_cache=True)
    assert static == dynamic and all(len(row) == 5 for row in static)


def test_commits_follow_the_pace_not_a_fixed_64() -> None:
    """A commit is about --commit-every seconds of work: a slow CPU (15 s a conversation) commits 4 at a time
    (64 took 38 min there and a kill lost them all); a fast GPU commits enough for its batch."""
    from trainer.regenerate.job import MAX_CHUNK, CommitPace

    pace = CommitPace(60.0)
    assert pace.size == 64  # before the pace is known
    pace.record(64, 960.0)  # 15 s a conversation
    assert pace.size == 4
    pace.record(4, 0.5)  # 0.125 s a conversation
    assert pace.size == 480
    pace.record(480, 0.48)
    assert pace.size == MAX_CHUNK  # bounded
    fixed = CommitPace(60.0, first=3, fixed=True)
    fixed.record(3, 1000.0)
    assert fixed.size == 3


def test_on_a_gpu_the_pace_counts_whole_batches() -> None:
    """A GPU batch costs about the same however full it is (H200, SmolLM2-135M: 64 rows ~40 s, 1,024 ~50 s).
    Counted in rows, 64 rows in 40 s said 96 fit a minute, and the run grew ~1.6x a commit through partial
    batches; counted in batches the first commit is a full one and the pace keeps whole ones."""
    from trainer.regenerate.job import MAX_CHUNK, CommitPace

    rows = CommitPace(60.0)  # the old arithmetic, still a CPU's
    rows.record(64, 40.0)
    assert rows.size == 96
    gpu = CommitPace(60.0, batch=1024)
    assert gpu.size == 1024  # one full batch first
    gpu.record(1024, 50.0)
    assert gpu.size == 1024
    gpu.record(1024, 15.0)
    assert gpu.size == 4096  # four batches fit a minute
    gpu.record(100, 15.0)  # a partial batch took a whole batch's time
    assert gpu.size == 4096
    gpu.record(2048, 200.0)  # slower than the pace: still one whole batch, never a part of one
    assert gpu.size == 1024
    huge = CommitPace(60.0, batch=3000)
    huge.record(3000, 1.0)
    assert huge.size == MAX_CHUNK // 3000 * 3000 <= MAX_CHUNK  # whole batches up to the cap


def _commit_sizes(tmp_path: Path, engine: type, rows: int = 20, **constants: int) -> list[int]:
    """The conversations of each commit of a run over `rows` prompts (module constants patched as given)."""
    from trainer.regenerate import job as module

    prompts = write_prompts(tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": f"p{i}"} for i in range(rows)])
    sizes: list[int] = []
    real = module.regenerate_chunk

    def spy(engine: object, records: list, *rest: int | None) -> list:
        sizes.append(len(records))
        return real(engine, records, *rest)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "regenerate_chunk", spy)
        for name, value in constants.items():
            patch.setattr(module, name, value)
        regenerate(scan_input(prompts, "stop"), tmp_path / "out.jsonl", SETTINGS, engine, commit_every_s=60.0)
    return sizes


def test_a_batching_engine_commits_whole_batches(tmp_path: Path) -> None:
    class BatchingEngine(EchoEngine):
        rows_at_once = 8

    sizes = _commit_sizes(tmp_path, BatchingEngine, MAX_CHUNK=16)
    assert sizes == [8, 12]  # one batch, then two (the cap), of which 12 were left


def test_an_engine_that_batches_continuously_first_commits_its_own_chunk(tmp_path: Path) -> None:
    class ContinuousEngine(EchoEngine):
        first_chunk = 12  # the KV engine's: a few times its slots, so a commit is not mostly its tail

    (tmp_path / "kv").mkdir()
    (tmp_path / "plain").mkdir()
    assert _commit_sizes(tmp_path / "kv", ContinuousEngine, FIRST_CHUNK=2)[0] == 12
    assert _commit_sizes(tmp_path / "plain", EchoEngine, FIRST_CHUNK=2)[0] == 2


def test_a_run_commits_in_paced_chunks(tmp_path: Path) -> None:
    sizes = _commit_sizes(tmp_path, EchoEngine, FIRST_CHUNK=2)
    assert sizes[0] == 2 and len(sizes) == 2 and sum(sizes) == 20  # a fast engine: the rest in one commit


def test_a_template_train_cannot_supervise_is_refused_before_generating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A template `train` cannot read (here: nothing ends an assistant turn) was refused by `train` only after
    `data regenerate` had paid for every answer. Now regenerate refuses first; Mistral's template passes."""
    from dflash_base.errors import ConfigError
    from tests.trainer.chat_fixtures import PLAIN, byte_tokenizer
    from trainer.regenerate.job import check_supervisable
    from trainer.regenerate.settings import GenerationSettings
    from trainer.target_model import tokenizer

    mistral_like = (
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
        "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
    )
    no_end_of_turn = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
    settings = GenerationSettings(target="/models/x", max_new_tokens=8)
    monkeypatch.setattr(tokenizer, "load_tokenizer", lambda _path: byte_tokenizer(no_end_of_turn))
    with pytest.raises(
        ConfigError, match=r"could not supervise answers rendered by this chat template"
    ) as err:
        check_supervisable(settings)
    assert "nothing was generated" in (err.value.hint or "")
    assert "to end its turn" in err.value.message  # the cause, named
    for readable in (PLAIN, mistral_like):  # Mistral's: no assistant header, located by difference (issue 38)
        monkeypatch.setattr(tokenizer, "load_tokenizer", lambda _path, t=readable: byte_tokenizer(t))
        check_supervisable(settings)


class LoopingEngine:
    """Answers odd prompts with a sentence repeated to the cap, even ones with plain text that stops."""

    name = "loop"
    rows_at_once = 1

    def generate(self, chats: Sequence[Chat]) -> list[Completion]:
        out = []
        for chat in chats:
            if int(chat[-1]["content"][1:]) % 2:
                out.append(Completion("The answer is four. " * 12, 60, "length"))
            else:
                out.append(Completion("Four: two and two make four.", 8, "stop"))
        return out

    def close(self) -> None:
        pass


def test_answers_that_end_in_a_loop_are_counted_with_those_cut_at_the_cap(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": f"p{i}"} for i in range(6)])
    summary = regenerate(
        scan_input(prompts, "stop"), tmp_path / "out.jsonl", SETTINGS, LoopingEngine, chunk_size=4
    )
    report = summary.to_json()
    assert report["answers"] == 6
    assert report["answers_ending_in_a_loop"] == 3
    assert report["answers_ending_in_a_loop_at_max_new_tokens"] == 3
