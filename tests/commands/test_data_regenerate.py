"""`data regenerate`'s bad input: exit 2 with one line naming the option or the line, before the target loads
and with nothing written (issue 36 "Bad input", issue 39 U5, U6, U8); and the loop counts in its text."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from dflash_doctor.cli import run as cli_run
from trainer.engine.target import Chat
from trainer.regenerate.settings import Completion


@pytest.fixture(scope="module")
def target_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from bench.lib.target_folder import make_target_folder

    return make_target_folder(tmp_path_factory.mktemp("target"))


def no_target_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading the target with any engine fails the test: the error must come first."""
    import trainer.regenerate.generate_engine as generation

    def loaded(*args: object, **kwargs: object) -> None:
        raise AssertionError("the target was loaded before the bad input was refused")

    monkeypatch.setattr(generation, "load_generation_target", loaded)
    monkeypatch.setattr("trainer.regenerate.kv_engine.load_generation_target", loaded)


def argv_for(tmp_path: Path, target: Path, prompts: str = '{"prompt": "w1"}\n') -> list[str]:
    config = tmp_path / "run.toml"
    config.write_text(
        f'[target]\npath = "{target}"\n[data]\nkind = "chat"\npath = "x.jsonl"\n[optim]\nsteps = 1\n'
    )
    (tmp_path / "in.jsonl").write_text(prompts)
    prompts_path, out = str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl")
    return ["data", "regenerate", "--config", str(config), "--prompts", prompts_path, "--out", out]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--temperature", "inf"], "--temperature: inf is not a sampling temperature"),
        (["--temperature", "nan"], "--temperature: nan is not a sampling temperature"),
        (["--temperature", "-0.5"], "--temperature: -0.5 is not a sampling temperature"),
        (["--top-p", "nan"], "--top-p: nan is outside (0, 1]"),
        (["--top-p", "0"], "--top-p: 0.0 is outside (0, 1]"),
        (["--top-p", "1.5"], "--top-p: 1.5 is outside (0, 1]"),
        (["--samples-per-prompt", "0"], "--samples-per-prompt: must be >= 1, got 0"),
        (["--samples-per-prompt", "-2"], "--samples-per-prompt: must be >= 1, got -2"),
        (["--seed", "-1"], "--seed: -1 is not a seed"),
        (["--seed", "1.5"], "Invalid value for '--seed'"),  # typer's own usage error
        (["--commit-every", "inf"], "--commit-every: inf is not a number of seconds"),
        (["--commit-every", "nan"], "--commit-every: nan is not a number of seconds"),
        (["--devices", ",,,"], "--devices: ',,,' names no device"),
        (["--devices", "cuda:7"], "--devices: cuda:7 is not here"),
        (["--devices", "gpu0"], "--devices: 'gpu0' is not a device"),
        (["--engine", "torch", "--tensor-parallel", "4"], "--tensor-parallel 4: only the vllm engine"),
        (
            ["--max-new-tokens", "100000000"],
            "--max-new-tokens 100,000,000: not shorter than the target's context (4,096 tokens)",
        ),
    ],
)
def test_bad_options_are_refused_before_the_target_loads(
    target_folder: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    says: str,
) -> None:
    """Was: inf/NaN sampled at random, an OverflowError, an AssertionError, a KeyError (exit 3), a
    --tensor-parallel silently ignored, a 100M-token answer run against a 4,096-token context."""
    no_target_loads(monkeypatch)
    if extra[:2] == ["--devices", "cuda:7"]:
        monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # a CPU build of torch, on any host
    assert cli_run([*argv_for(tmp_path, target_folder), *extra]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert says in err and "Traceback" not in err
    assert not (tmp_path / "out.jsonl").exists()


def test_a_prompts_line_nested_5000_levels_deep_is_a_named_line(
    target_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: a RecursionError, exit 3."""
    no_target_loads(monkeypatch)
    deep = '{"prompt": ' + "[" * 5000 + "]" * 5000 + "}\n"
    assert cli_run(argv_for(tmp_path, target_folder, '{"prompt": "w1"}\n' + deep)) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "line 2: nested too deeply to read" in err and not (tmp_path / "out.jsonl").exists()


class LoopingEngine:
    """Every answer repeats itself to the cap: a loop at --max-new-tokens."""

    name = "fake"
    rows_at_once = 1

    def generate(self, chats: Sequence[Chat]) -> list[Completion]:
        return [Completion("the same words again " * 40, 8, "length") for _ in chats]

    def close(self) -> None:
        pass


def test_the_text_summary_says_how_many_answers_end_in_a_loop(
    target_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: the loop counts were in --json only."""
    from dflash_doctor.commands import data as data_command

    monkeypatch.setattr(data_command, "_engine_factory", lambda *a: LoopingEngine)
    prompts = "".join(json.dumps({"id": f"r{i}", "prompt": "w1"}) + "\n" for i in range(3))
    assert cli_run(argv_for(tmp_path, target_folder, prompts)) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "3 ending in a repetition loop (3 of them at --max-new-tokens)" in out, out


def test_a_prompts_line_with_both_prompt_and_messages_is_refused_naming_both(
    target_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 39 U14: "messages" was used and "prompt" dropped without a word."""
    no_target_loads(monkeypatch)
    chat = [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2"}]
    both = json.dumps({"prompt": "w3", "messages": chat})
    assert cli_run(argv_for(tmp_path, target_folder, '{"prompt": "w1"}\n' + both + "\n")) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert 'line 2: gives both "messages" and "prompt"' in err, err
    assert "jq -c 'del(.prompt)' keeps \"messages\"" in err and not (tmp_path / "out.jsonl").exists()


def test_a_prompts_file_with_a_utf8_byte_order_mark_is_read(tmp_path: Path) -> None:
    """Issue 39 U15: a BOM (Windows editors) made line 1 "not JSON", refusing the file."""
    from trainer.regenerate.job import scan_input

    prompts = tmp_path / "in.jsonl"
    prompts.write_bytes(b"\xef\xbb\xbf" + b'{"id": "a", "prompt": "w1"}\n{"prompt": "w2"}\n')
    scan = scan_input(prompts, "stop")
    assert [r.id for r in scan.records] == ["a", "line-2"] and not scan.bad


class AnsweringEngine(LoopingEngine):
    def generate(self, chats: Sequence[Chat]) -> list[Completion]:
        return [Completion("an answer", 2, "stop") for _ in chats]


@pytest.mark.skipif(not Path("/proc/version").is_file(), reason="needs Linux's /proc/version")
def test_out_that_is_not_a_regenerated_file_hints_another_out_which_works(
    target_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 39 U15: `--out /proc/version` hinted --force, which gave the same error."""
    from dflash_doctor.commands import data as data_command

    monkeypatch.setattr(data_command, "_engine_factory", lambda *a: AnsweringEngine)
    argv = argv_for(tmp_path, target_folder)
    at_proc = [*argv[:-1], "/proc/version"]
    assert cli_run(at_proc) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "/proc/version line 1 is not a regenerated conversation" in err and "choose another --out" in err
    assert "pass --force" not in err
    assert cli_run([*at_proc, "--force"]) == 2  # --force does not move someone's file aside either
    assert "/proc/version line 1 is not a regenerated conversation" in capsys.readouterr().err
    assert cli_run([*argv[:-1], str(tmp_path / "new.jsonl")]) == 0  # what the hint says: another --out
    assert (tmp_path / "new.jsonl").read_text().count("\n") == 1


def test_a_damaged_output_hints_force_which_starts_over(
    target_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 39 U15: a damaged line in a file data regenerate wrote hinted --force, which refused again."""
    from dflash_doctor.commands import data as data_command

    monkeypatch.setattr(data_command, "_engine_factory", lambda *a: AnsweringEngine)
    argv = argv_for(tmp_path, target_folder, '{"id": "a", "prompt": "w1"}\n{"id": "b", "prompt": "w2"}\n')
    assert cli_run(argv) == 0
    out = tmp_path / "out.jsonl"
    out.write_text(out.read_text().replace('{"id": "b"', "{damaged", 1))
    assert cli_run(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "line 2 is damaged" in err and "pass --force to start over" in err
    assert cli_run([*argv, "--force"]) == 0, capsys.readouterr()
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["a", "b"]
    assert len(list(tmp_path.glob("out.jsonl.old-*"))) == 1  # the damaged file kept beside
