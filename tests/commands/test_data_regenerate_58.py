"""Issue 58, `data regenerate` and the config files every command reads: N7 (a plan too large refused before
anything is allocated), N8 (sampling options without sampling refused), N4 (an integer of 5,000 digits in a
config file: exit 2 naming it, was exit 3), N14's seed past 64 bits."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_base.errors import ConfigError
from dflash_doctor.cli import run as cli_run
from tests.commands.test_data_regenerate import argv_for, no_target_loads, target_folder  # noqa: F401  (fixture)
from trainer.regenerate import job
from trainer.regenerate.conversations import PromptRecord
from trainer.runspec.regenerate_request import RegenerateRequest


def _scan(count: int) -> job.InputScan:
    return job.InputScan(
        [PromptRecord(f"p{i}", i + 1, ({"role": "user", "content": "hi"},)) for i in range(count)]
    )


def test_n7_a_plan_too_large_for_the_memory_is_refused_before_it_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = RegenerateRequest(out=tmp_path / "out.jsonl", samples_per_prompt=1000, temperature=0.7)
    monkeypatch.setattr(job, "available_memory", lambda: 1 << 20)
    with pytest.raises(
        job.RegenerateError, match=r"2 prompts x --samples-per-prompt 1,000 = 2,000 conversations"
    ):
        job.check_plan(_scan(2), request)
    monkeypatch.setattr(job, "available_memory", lambda: 1 << 30)
    job.check_plan(_scan(2), request)  # fits: quiet


def test_n7_a_plan_too_large_for_the_disk_says_what_it_would_need(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = RegenerateRequest(out=tmp_path / "out.jsonl", samples_per_prompt=1000, temperature=0.7)
    monkeypatch.setattr(job, "disk_free", lambda folder: 100_000)
    with pytest.raises(job.RegenerateError, match=r"needs at least 50\d\.\d kB .* 100\.0 kB are free"):
        job.check_plan(_scan(2), request)


def test_n7_a_billion_samples_is_refused_at_once_by_the_command(
    target_folder: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The row's own command: 2 prompts, --samples-per-prompt 1000000000 (it grew to 6.6 GB with no output)."""
    no_target_loads(monkeypatch)
    argv = argv_for(tmp_path, target_folder, '{"prompt": "a"}\n{"prompt": "b"}\n')
    assert cli_run([*argv, "--samples-per-prompt", "1000000000", "--temperature", "0.7"]) == 2
    err = capsys.readouterr().err
    assert "2,000,000,000 conversations" in err and "Traceback" not in err
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        (
            {"samples_per_prompt": 2},
            "--samples-per-prompt 2 at --temperature 0: greedy decoding gives the same",
        ),
        ({"top_p": 0.9}, "--top-p 0.9 at --temperature 0"),
        ({"seed": 7}, "--seed 7 at --temperature 0"),
    ],
)
def test_n8_sampling_options_without_sampling_are_refused(changes: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        RegenerateRequest(**changes).validate()  # type: ignore[arg-type]
    assert says in refused.value.message and "--temperature" in (refused.value.hint or "")
    RegenerateRequest(**changes, temperature=0.7).validate()  # type: ignore[arg-type]  # sampling: fine


def test_n14_a_seed_past_64_bits_is_refused() -> None:
    with pytest.raises(ConfigError, match="--seed: 18446744073709551616 is not a seed"):
        RegenerateRequest(seed=2**64, temperature=0.7).validate()
    RegenerateRequest(seed=2**64 - 1, temperature=0.7).validate()


def _huge_config(tmp_path: Path) -> Path:
    config = tmp_path / "huge.toml"
    config.write_text(f'[target]\npath = "tiny"\n[optim]\nsteps = {"9" * 5000}\n')
    return config


@pytest.mark.parametrize("command", [["train", "--dry-run"], ["data", "preview"]])
def test_n4_an_integer_of_5000_digits_in_a_config_file_is_named(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: list[str],
) -> None:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    config = _huge_config(tmp_path)
    assert cli_run([*command, "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"{config} line 4: an integer of more digits than Python reads" in err and "Traceback" not in err


# -- N9: one line that is not UTF-8


def test_n9_a_line_that_is_not_utf8_is_named_and_skippable(tmp_path: Path) -> None:
    prompts = tmp_path / "in.jsonl"
    prompts.write_bytes(b'{"prompt": "a"}\n{"prompt": "caf\xe9"}\n{"prompt": "c"}\n')
    with pytest.raises(job.RegenerateError, match="line 2: not UTF-8 text"):
        job.scan_input(prompts, "stop")
    scan = job.scan_input(prompts, "skip")
    assert [r.line for r in scan.records] == [1, 3] and [b.line for b in scan.bad] == [2]


def test_n9_train_and_preview_name_the_line_that_is_not_utf8(tmp_path: Path) -> None:
    from trainer.runspec.data_files import check_data_file

    data = tmp_path / "data.jsonl"
    chat = b'{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n'
    data.write_bytes(chat + b'{"messages": "\xff"}\n' + chat)
    with pytest.raises(ConfigError, match=r"line 2: not UTF-8 text \(byte 15 of the line"):
        check_data_file("chat", str(data))


# -- N12: Ctrl-C before the first commit says what was dropped


def test_n12_a_stop_before_the_first_commit_says_what_was_dropped(
    target_folder: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dflash_doctor.commands import data as data_command
    from tests.trainer.regenerate.test_regenerate import EchoEngine

    monkeypatch.setattr(data_command, "_engine_factory", lambda *a: lambda: EchoEngine(fail_after_calls=0))
    argv = argv_for(tmp_path, target_folder, '{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "c"}\n')
    assert cli_run(argv) == 130
    err = " ".join(capsys.readouterr().err.split())
    out = tmp_path / "out.jsonl"
    assert f"nothing written to {out}; the 3 being answered were dropped" in err and "start again" in err
    assert not out.exists()


# -- N13: messages that say which option, which column, which path


def test_n13_eval_names_the_option_that_is_below_one() -> None:
    from trainer.runspec.eval_request import EvalRequest

    for field, option in (("max_new_tokens", "--max-new-tokens"), ("num_prompts", "--num-prompts"),
                          ("prompt_len", "--prompt-len")):  # fmt: skip
        with pytest.raises(ConfigError) as refused:
            EvalRequest(export=None, **{field: 0}).check()  # type: ignore[arg-type]
        assert refused.value.message.startswith(f"{option}: must be >= 1, got 0")


def test_n13_a_nul_byte_is_named_with_its_column(tmp_path: Path) -> None:
    prompts = tmp_path / "in.jsonl"
    prompts.write_bytes(b'{"prompt": "a\x00b"}\n')
    with pytest.raises(job.RegenerateError, match=r"line 1: not JSON .* at column 14: a NUL byte"):
        job.scan_input(prompts, "stop")


def test_n13_an_empty_out_is_named(
    target_folder: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    no_target_loads(monkeypatch)
    argv = argv_for(tmp_path, target_folder)
    assert cli_run([*argv[:-1], ""]) == 2
    assert "--out '.': names no file (empty, or the current folder)" in capsys.readouterr().err


def test_n13_an_error_under_json_is_a_json_document_on_stdout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    assert cli_run(["train", "--dry-run", "--json", "--config", str(tmp_path / "missing.toml")]) == 2
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert document["schema"] == "dflash-doctor/error/v1" and document["exit_code"] == 2
    assert "missing.toml" in document["error"] and "error:" in captured.err


# -- N14: options accepted that torchrun or the engines could never act on


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"master_port": 99999}, "--master-port 99999: not a TCP port"),
        ({"node_rank": 5, "nnodes": 1}, "--node-rank 5: not a node of --nnodes 1"),
        ({"node_rank": -1, "nnodes": 2}, "--node-rank -1: not a node of --nnodes 2"),
    ],
)
def test_n14_torchrun_options_out_of_range_are_refused(options: dict[str, int], says: str) -> None:
    from dflash_base.errors import DoctorError
    from dflash_doctor.launch.plan import TorchrunOptions

    with pytest.raises(DoctorError, match=says):
        TorchrunOptions(**options)  # type: ignore[arg-type]
    TorchrunOptions(nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29500)  # in range: fine


def test_n14_train_refuses_master_port_99999(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    assert cli_run(["train", "--dry-run", "--config", "tiny-cpu", "--master-port", "99999"]) == 2
    assert "--master-port 99999: not a TCP port" in capsys.readouterr().err


def test_n14_a_device_named_twice_is_refused() -> None:
    from trainer.regenerate.engines import local_devices

    with pytest.raises(ConfigError, match="--devices: cpu is named twice in 'cpu,cpu'"):
        local_devices("cpu,cpu")
    assert local_devices("cpu") == ["cpu"]


# -- U14b: `--set optim.epochs` drops the config's `steps`, and says so


def test_u14b_a_set_that_replaces_a_key_of_the_file_says_so() -> None:
    from trainer.runspec.config_file import replaced_by_overrides

    raw = {"optim": {"steps": 300, "lr": 0.005}}
    assert replaced_by_overrides(raw, ["optim.epochs=2"]) == [
        "--set optim.epochs replaces the config's optim.steps = 300 (a run takes one of the two)"
    ]
    assert replaced_by_overrides(raw, ["optim.steps=7"]) == []  # the same key: nothing dropped
    assert replaced_by_overrides(raw, ["optim.epochs=2", "optim.steps=5"]) == []  # both given: the check says


def test_u14b_train_dry_run_prints_what_the_set_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    argv = ["train", "--dry-run", "--json", "--no-deep", "--config", "tiny-cpu", "--set", "optim.epochs=2"]
    assert cli_run([*argv, "--set", f"output.dir={tmp_path / 'out'}"]) in (0, 1)
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert notes == [
        "--set optim.epochs replaces the config's optim.steps = 300 (a run takes one of the two)"
    ]
