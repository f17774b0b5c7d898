"""Issue 29, "bad input is exit 2, never exit 3": each row of the table, one test. A user's own bad file or
option is a named error (exit 2) before any model loads, with nothing written; never "a bug in
dflash-doctor" (exit 3), a silent pass, or minutes of work first."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from dflash_base.errors import ConfigError
from dflash_doctor.cli import run
from trainer.decode.regenerate import RegenerateError, regenerate, scan_input
from trainer.spec.config import load_config
from trainer.spec.data_files import check_data_file
from trainer.spec.eval_request import EvalRequest

LONE = '"w1 \\ud800 w2"'  # JSON's spelling of a lone surrogate: Python reads it, no encoder takes it


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(scope="module")
def target_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3 target with a 512-word tokenizer and a chat template; context 4096."""
    from tests.trainer.target_folder import make_target_folder

    return make_target_folder(tmp_path_factory.mktemp("target"))


def run_config(folder: Path, target: Path, data: Path, mask: bool = True) -> Path:
    path = folder / "run.toml"
    drafter = "[drafter]\nmask_token_id = 511\n" if mask else ""
    path.write_text(
        f'[target]\npath = "{target}"\n[data]\nkind = "chat"\npath = "{data}"\nseq_len = 64\n{drafter}'
        f'[optim]\nsteps = 2\n[output]\ndir = "{folder / "out"}"\n[run]\ndevice = "cpu"\n'
    )
    return path


def chats(path: Path, count: int, answered: bool = True, extra: str = "") -> Path:
    answer = ', {"role": "assistant", "content": "w3 w4"}' if answered else ""
    line = '{"messages": [{"role": "user", "content": "w1 w2"}' + answer + "]}\n"
    path.write_text(line * count + extra)
    return path


def no_target_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading the target (any engine, eval's load) fails the test: the error must come first."""
    import trainer.decode.eval as eval_module
    import trainer.decode.generation as generation

    def loaded(*args: object, **kwargs: object) -> None:
        raise AssertionError("the target was loaded before the bad input was refused")

    monkeypatch.setattr(generation.TorchEngine, "__init__", loaded)
    monkeypatch.setattr(eval_module, "load_pieces", loaded)
    monkeypatch.setattr(eval_module, "heldout_prompts", loaded)


# ---------------------------------------------------------------- a lone surrogate in prompts and chat data


def test_a_lone_surrogate_in_prompts_is_a_named_line_and_nothing_is_written(
    target_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: `data regenerate` exit 3 (the tokenizer's TypeError) with a 0-byte --out."""
    no_target_loads(monkeypatch)
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "w1"}\n{"prompt": ' + LONE + "}\n")
    out = tmp_path / "out.jsonl"
    config = run_config(tmp_path, target_folder, tmp_path / "x.jsonl")
    argv = ["data", "regenerate", "--config", str(config), "--prompts", str(prompts), "--out", str(out)]
    assert run([*argv, "--engine", "torch"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "line 2: \"prompt\" holds a lone surrogate ('\\ud800') at character 3" in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("kind", "line"),
    [
        ("chat", '{"messages": [{"role": "user", "content": ' + LONE + "}]}"),
        (
            "chat",
            '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": '
            + LONE
            + "}]}",
        ),
        ("text", '{"text": ' + LONE + "}"),
    ],
)
def test_a_lone_surrogate_in_training_data_is_refused_at_the_gate(
    tmp_path: Path, kind: str, line: str
) -> None:
    """Was: `train --dry-run` passed it, `data preview` exit 3."""
    data = chats(tmp_path / "d.jsonl", 3, extra=line + "\n")
    if kind == "text":
        data.write_text('{"text": "w1 w2"}\n' * 3 + line + "\n")
    with pytest.raises(ConfigError, match=r"line 4: .*lone surrogate"):
        check_data_file(kind, str(data), 512)


def test_a_lone_surrogate_in_eval_prompts_is_a_named_line(tmp_path: Path) -> None:
    from trainer.spec.eval_request import check_eval_prompts

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": ' + LONE + "}\n")
    with pytest.raises(ConfigError, match=r"line 1: prompt holds a lone surrogate"):
        check_eval_prompts(str(prompts), 512)


# ---------------------------------------------------------------- a prompt longer than the context


def test_a_prompt_longer_than_the_context_is_refused_before_the_target_loads(
    target_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: exit 3 after 75 s (an allocation failure at 3.5M tokens), a 0-byte --out."""
    no_target_loads(monkeypatch)
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "w1 w2"}\n' + json.dumps({"prompt": " ".join(["w5"] * 5000)}) + "\n")
    out = tmp_path / "out.jsonl"
    config = run_config(tmp_path, target_folder, tmp_path / "x.jsonl")
    argv = ["data", "regenerate", "--config", str(config), "--prompts", str(prompts), "--out", str(out)]
    assert run([*argv, "--engine", "torch"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "line 2: 5,00" in err and "tokens, longer than the target's context (4,096 tokens)" in err
    assert not out.exists()


def test_with_on_error_skip_a_too_long_prompt_is_left_out(target_folder: Path, tmp_path: Path) -> None:
    from trainer.decode.generation import GenerationSettings
    from trainer.decode.regenerate import check_prompt_lengths

    prompts = tmp_path / "in.jsonl"
    long_chat = {"messages": [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2"}]}
    long_chat["messages"].append({"role": "user", "content": " ".join(["w5"] * 4200)})  # a later turn
    prompts.write_text('{"prompt": "w1 w2"}\n' + json.dumps(long_chat) + "\n")
    scan = check_prompt_lengths(scan_input(prompts, "skip"), GenerationSettings(str(target_folder)), "skip")
    assert [r.line for r in scan.records] == [1] and [b.line for b in scan.bad] == [2]


# ---------------------------------------------------------------- eval: a damaged export, another target's


@pytest.fixture
def export(tmp_path: Path) -> Path:
    from tests.trainer.decode.test_eval import _untrained_drafter
    from trainer.model.export import export_drafter

    return export_drafter(_untrained_drafter(), tmp_path / "export")


@pytest.mark.parametrize("cut", ["half", "empty", "header"])
def test_eval_with_a_cut_weights_file_names_it_before_any_work(
    export: Path, cut: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: exit 3 (SafetensorError), with --config after 2-4 min of making held-out data."""
    no_target_loads(monkeypatch)
    weights = export / "model.safetensors"
    size = weights.stat().st_size
    os.truncate(weights, {"half": size // 2, "empty": 0, "header": 20}[cut])
    with pytest.raises(ConfigError, match=r"model\.safetensors is .* bytes"):
        EvalRequest(str(export)).check()
    assert run(["eval", "--export", str(export), "--config", "tiny-cpu"]) == 2
    assert f"{weights} is " in " ".join(capsys.readouterr().err.split())


def test_eval_with_an_export_for_another_target_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: exit 3 (`ValueError: embed_weight has shape ...`)."""
    import torch

    from trainer.model.drafter import DFlashDrafter, DrafterConfig
    from trainer.model.export import export_drafter

    no_target_loads(monkeypatch)
    cfg = DrafterConfig(256, 512, 1, 4, 2, 64, 1e-6, 1e4, 512, 4096, 8, [1], 511, 4)
    export = export_drafter(DFlashDrafter(cfg, torch.zeros(512, 256), torch.zeros(512, 256)), tmp_path / "e")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"input_ids": [1, 2, 3]}\n')
    assert run(["eval", "--export", str(export), "--target", "tiny", "--prompts", str(prompts)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "was made for another target (hidden 256 vs 128" in err


@pytest.mark.parametrize(
    ("ids", "says"),
    [
        ("[1, 2, 9999]", "input_ids[2] is 9999, outside the target's vocabulary (0..511)"),
        ("[1, -3]", "input_ids[1] is -3, outside the target's vocabulary (0..511)"),
        ("[1, 2.5]", "input_ids[1] is 2.5, not a token id (an integer)"),
        ("[]", "input_ids must be a non-empty list of token ids, got []"),
    ],
)
def test_eval_prompt_ids_are_checked_against_the_vocabulary(
    export: Path, tmp_path: Path, ids: str, says: str, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Was: exit 3 (IndexError) out of the vocabulary or negative; a float accepted; [] "give input_ids"."""
    no_target_loads(monkeypatch)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"input_ids": [4, 5]}\n{"input_ids": ' + ids + "}\n")
    assert run(["eval", "--export", str(export), "--target", "tiny", "--prompts", str(prompts)]) == 2
    assert f"line 2: {says}" in " ".join(capsys.readouterr().err.split())


# ---------------------------------------------------------------- regenerate: --out is --prompts


@pytest.mark.parametrize("name", ["same", "dotdot", "symlink", "hardlink", "same-forced"])
def test_out_that_is_the_prompts_file_is_refused_forced_or_not(tmp_path: Path, name: str) -> None:
    """Was: "made with other settings" (or "damaged"); with --force the prompts were moved aside."""
    from tests.trainer.decode.test_regenerate import SETTINGS, EchoEngine

    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "w1"}\n')
    before = prompts.read_bytes()
    out = {
        "same": prompts,
        "same-forced": prompts,
        "dotdot": tmp_path / "sub" / ".." / "in.jsonl",
        "symlink": tmp_path / "link.jsonl",
        "hardlink": tmp_path / "hard.jsonl",
    }[name]
    (tmp_path / "sub").mkdir()
    if name == "symlink":
        out.symlink_to(prompts)
    if name == "hardlink":
        os.link(prompts, out)
    with pytest.raises(RegenerateError, match="is the --prompts file"):
        regenerate(scan_input(prompts, "stop"), out, SETTINGS, EchoEngine, force=name == "same-forced")
    assert prompts.read_bytes() == before and sorted(p.name for p in tmp_path.glob("in.jsonl*")) == [
        "in.jsonl"
    ]


# ---------------------------------------------------------------- serve-check --python that is not a python


def test_serve_check_with_a_python_that_is_not_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: exit 1, "a bug in dflash-doctor or in the engine; please report it"."""
    from tests.interop.test_serve_check import fake_export

    not_python = shutil.which("ls") or "/bin/ls"
    args = ["serve-check", "--export", str(fake_export(tmp_path / "e")), "--engine", "vllm"]
    assert run([*args, "--python", not_python]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"--python {not_python}: not a python" in err and "report" not in err


# ---------------------------------------------------------------- chat data with nothing to supervise


def test_chat_data_without_any_assistant_turn_is_refused_for_training(
    target_folder: Path, tmp_path: Path
) -> None:
    """Was: `data preview` 0% supervised without a word, `train --dry-run` exit 0."""
    data = chats(tmp_path / "d.jsonl", 20, answered=False)
    config = run_config(tmp_path, target_folder, data)
    with pytest.raises(
        ConfigError, match="none of its 20 conversations has an assistant turn: nothing to supervise"
    ):
        load_config(config)
    assert run(["train", "--config", str(config), "--dry-run", "--no-deep"]) == 2
    chats(data, 19, answered=False, extra=chats(tmp_path / "one.jsonl", 1).read_text())  # one answered: fine
    load_config(config)


# ---------------------------------------------------------------- a step bigger than the data


def test_a_step_bigger_than_the_training_split_is_refused() -> None:
    """Was: `optim.grad_accum=100000000` passed the dry run (800M sequences a step, 461 in the split)."""
    with pytest.raises(
        ConfigError, match=r"optim.grad_accum: one step is .* = 800,000,000 sequences .* the 461 "
    ):
        load_config("tiny-cpu", ["optim.grad_accum=100000000"])
    load_config("tiny-cpu", ["optim.grad_accum=57"])  # 456 of 461: big, but a step


# ---------------------------------------------------------------- regenerate needs no drafter setting


def test_regenerate_with_a_target_that_has_no_mask_token(
    target_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Was: it asked for drafter.mask_token_id, a drafter setting generation never uses."""
    from dflash_doctor.commands import data as data_command
    from tests.trainer.decode.test_regenerate import EchoEngine

    config = run_config(tmp_path, target_folder, tmp_path / "x.jsonl", mask=False)
    with pytest.raises(ConfigError, match=r"drafter\.mask_token_id: no default"):
        load_config(config, check_data=False)  # training still needs one: every embedding row is a token
    monkeypatch.setattr(data_command, "_engine_factory", lambda *a: EchoEngine)
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "w1"}\n')
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
    assert run(argv) == 0, capsys.readouterr().err


# ---------------------------------------------------------------- runs: a home that is a file, a NaN loss


def test_runs_with_a_home_that_is_a_file_says_so(tmp_path: Path, monkeypatch, capsys) -> None:
    """Was: "No runs yet", exit 0."""
    home = tmp_path / "homefile"
    home.write_text("x")
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(home))
    assert run(["runs"]) == 2
    assert f"{home} is a file, not a folder" in " ".join(capsys.readouterr().err.split())
    assert run(["runs", "show", "x"]) == 2


@pytest.mark.parametrize("diverged_at", [3, 1])
def test_runs_show_keeps_a_nan_loss_in_sight(tmp_path: Path, diverged_at: int, capsys) -> None:
    """Was: the loss curve dropped its NaN steps (or vanished when every step was NaN) without a word."""
    from dflash_doctor.launch.runs import RunStore

    rows = [
        {"step": s, "loss": float("nan") if s >= diverged_at else 5.0 - s, "tok_s": 100.0}
        for s in range(1, 8)
    ]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    record = RunStore().create("failed", output_dir=str(tmp_path / "out"))
    assert run(["runs", "show", record.id]) == 0
    out = " ".join(capsys.readouterr().out.split())
    nan_steps = 8 - diverged_at
    assert f"loss is NaN or infinite at {nan_steps} of 7 steps, first at step {diverged_at}" in out
    assert "-> NaN" in out if diverged_at > 1 else "NaN or infinite at every step" in out


# ---------------------------------------------------------------- cache warm --device tpu


def test_cache_warm_on_a_device_it_cannot_compile_for_is_refused_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: rejected by the child, after 8 s."""
    from dflash_doctor.commands import cache as cache_command

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the warm-up child was started")

    monkeypatch.setattr(cache_command, "run_warm_child", started)
    monkeypatch.setattr(cache_command, "_current", started)
    assert run(["cache", "warm", "--device", "tpu"]) == 2
    assert "--device 'tpu': the warm-up compiles for cpu, cuda or cuda:N" in capsys.readouterr().err
