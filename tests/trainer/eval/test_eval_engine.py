"""`eval` on the engine (issue 56): the figures the Python loop gives, every token checked against the target,
tau per group of the prompts file, the latency table, and bad input refused before anything loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from dflash_doctor.cli import run
from tests.trainer.eval.test_eval import PROMPTS, _untrained_drafter
from trainer.engine.speculative import SpeculativeDecoder
from trainer.eval.lossless import check_outputs
from trainer.model.export import export_drafter
from trainer.target_model.tiny import build_embedded_target

MORE = [*PROMPTS, [7, 8, 9, 7, 8, 9, 7, 8], [300, 301] * 6]  # repetitive ones: prompt lookup accepts some


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_drafter(_untrained_drafter(), tmp_path_factory.mktemp("e") / "export")


def prompts_file(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def eval_json(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, dict[str, Any]]:
    code = run([*args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_the_engine_reports_what_the_python_loop_reports(
    tmp_path: Path, export: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Same export, prompts and target (fp32, CPU): the same tokens, tau and histograms either way."""
    prompts = prompts_file(tmp_path / "p.jsonl", [{"input_ids": p} for p in MORE])
    args = [
        "eval",
        "--export",
        str(export),
        "--target",
        "tiny",
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "16",
    ]
    kv_code, kv = eval_json(capsys, [*args, "--engine", "kv"])
    loop_code, loop = eval_json(capsys, [*args, "--engine", "loop"])
    assert (kv_code, loop_code) == (0, 0)
    assert (kv["engine"], loop["engine"]) == ("kv", "loop")
    for field in ("prompts", "new_tokens", "mean_accept_len", "target_forwards", "accept_length_histogram"):
        assert kv[field] == loop[field], field
        assert kv["baseline"][field] == loop["baseline"][field], field
    assert kv["baseline"]["mean_accept_len"] > 1.0  # prompt lookup accepted something: not a vacuous match
    assert [r["new_tokens"] for r in kv["per_prompt"]] == [r["new_tokens"] for r in loop["per_prompt"]]
    assert kv["lossless"]["checked"] == kv["new_tokens"] and kv["lossless"]["off"] == 0
    assert kv["target_lossless"]["exact"] == kv["target_lossless"]["checked"]  # fp32: every token the argmax
    assert kv["max_new_tokens"] == 16 and kv["latency"] == []  # no latency table on a CPU unless asked


def test_every_prompt_of_the_file_is_decoded_unless_narrowed(
    tmp_path: Path, export: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's figures are what its commands print: --prompts decodes the whole file by default (it took
    the first 16)."""
    many = [{"input_ids": [1 + i, 2 + i, 3 + i]} for i in range(20)]
    prompts = prompts_file(tmp_path / "p.jsonl", many)
    args = [
        "eval",
        "--export",
        str(export),
        "--target",
        "tiny",
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "4",
    ]
    assert eval_json(capsys, args)[1]["prompts"] == 20
    assert eval_json(capsys, [*args, "--num-prompts", "5"])[1]["prompts"] == 5


def test_tau_per_kind_and_twins_apart(
    tmp_path: Path, export: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = [
        {"input_ids": MORE[0], "kind": "code", "twin": False},
        {"input_ids": MORE[3], "kind": "code", "twin": True},
        {"input_ids": MORE[4], "kind": "chat", "twin": True},
    ]
    prompts = prompts_file(tmp_path / "p.jsonl", records)
    args = [
        "eval",
        "--export",
        str(export),
        "--target",
        "tiny",
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "12",
    ]
    code, report = eval_json(capsys, args)
    groups = {g["group"]: g for g in report["groups"]}
    assert code == 0 and set(groups) == {"kind:code", "kind:chat", "twin", "no twin"}
    assert (groups["kind:code"]["prompts"], groups["twin"]["prompts"], groups["no twin"]["prompts"]) == (
        2,
        2,
        1,
    )
    for g in groups.values():
        assert g["baseline_tau"] is not None and g["ratio"] == pytest.approx(
            g["tau"] / g["baseline_tau"], abs=1e-3
        )
    assert run([*args]) == 0
    assert "tau per group of the prompts file" in capsys.readouterr().out


def test_the_latency_table_times_each_way_at_each_batch(
    tmp_path: Path, export: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = prompts_file(tmp_path / "p.jsonl", [{"input_ids": p} for p in MORE])
    args = [
        "eval",
        "--export",
        str(export),
        "--target",
        "tiny",
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "8",
    ]
    code, report = eval_json(capsys, [*args, "--latency", "1,2", "--latency-prompts", "3"])
    rows = report["latency"]
    assert code == 0 and [(r["batch"], r["drafter"]) for r in rows] == [
        (1, "target"), (1, "dflash"), (1, "ngram"), (2, "target"), (2, "dflash"), (2, "ngram"),
    ]  # fmt: skip
    for r in rows:
        assert r["requests"] == 3 and r["tok_s"] > 0 and r["seconds"] > 0 and r["ms_per_step"] > 0
        assert r["speedup"] == (1.0 if r["drafter"] == "target" else pytest.approx(r["speedup"]))
        assert (r["tau"] is None) == (r["drafter"] == "target")
    target_1 = next(r for r in rows if r["batch"] == 1 and r["drafter"] == "target")
    drafter_1 = next(r for r in rows if r["batch"] == 1 and r["drafter"] == "dflash")
    assert drafter_1["speedup"] == pytest.approx(drafter_1["tok_s"] / target_1["tok_s"], rel=1e-2)
    assert run([*args, "--latency", "1", "--latency-prompts", "2"]) == 0
    assert "wall clock: generated tok/s with a batch of requests in flight" in capsys.readouterr().out


def test_a_token_the_target_did_not_choose_is_off_and_fails(
    tmp_path: Path, export: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A planted bug (the engine's accept step swaps one emitted token for another): the every-token check
    names it `off` and eval exits 1; untouched, it passes."""
    original = SpeculativeDecoder._accept

    def swapped(
        self: SpeculativeDecoder, choices: torch.Tensor, drafts: torch.Tensor, counts: torch.Tensor
    ) -> Any:
        choices = choices.clone()
        choices[:, 0] = (choices[:, 0] + 97) % 512  # every verify's first emitted token: a wrong one
        return original(self, choices, drafts, counts)

    prompts = prompts_file(tmp_path / "p.jsonl", [{"input_ids": p} for p in PROMPTS])
    args = [
        "eval",
        "--export",
        str(export),
        "--target",
        "tiny",
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "8",
    ]
    assert run(args) == 0
    capsys.readouterr()
    monkeypatch.setattr(SpeculativeDecoder, "_accept", swapped)
    code, report = eval_json(capsys, args)
    assert code == 1 and report["lossless"]["off"] > 0 and report["lossless"]["off_at"]
    assert report["target_lossless"]["off"] == 0  # target-only greedy does not go through the swapped step
    assert report["differences"] > 0


def test_the_check_counts_near_ties_within_the_tolerance_and_off_beyond() -> None:
    model = build_embedded_target("tiny", seed=0)
    prompt = [5, 17, 300, 42]
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1]
    order = logits.argsort(descending=True).tolist()
    gap_ulps = float(logits[order[0]] - logits[order[1]]) / (
        2.0 ** (int(torch.log2(logits[order[0]].abs())) - 23)
    )
    exact, _ = check_outputs(model, [prompt], [[order[0]]], "x")
    assert (exact.checked, exact.exact, exact.near_ties, exact.off) == (1, 1, 0, 0)
    wide, _ = check_outputs(model, [prompt], [[order[1]]], "x", tolerance_ulps=int(gap_ulps * 2) + 1)
    assert (wide.near_ties, wide.off) == (1, 0) and wide.worst_ulps > 0
    tight, _ = check_outputs(model, [prompt], [[order[1]]], "x", tolerance_ulps=0)
    assert (tight.near_ties, tight.off) == (0, 1) and tight.off_at[0]["argmax"] == order[0]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--max-new-tokens", "100000000"], "--max-new-tokens 100000000: the target's context is"),
        (["--ngram-k", "100000"], "--ngram-k / --ngram-min / --ngram-max: need 1 <= k <= 64"),
        (["--latency", "1,x"], "--latency: '1,x' is not a list of batch sizes"),
        (["--latency", "0"], "--latency: a batch of 0"),
        (["--engine", "vllm"], '--engine: "vllm" is not one of auto, kv, loop'),
        (["--latency-prompts", "0"], "--latency-prompts: must be >= 1, got 0"),
    ],
)
def test_bad_options_are_refused_before_the_target_loads(
    tmp_path: Path,
    export: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    from tests.trainer.input_files import no_target_loads

    no_target_loads(monkeypatch)
    prompts = prompts_file(tmp_path / "p.jsonl", [{"input_ids": PROMPTS[0]}])
    assert run(["eval", "--export", str(export), "--target", "tiny", "--prompts", str(prompts), *extra]) == 2
    assert message in " ".join(capsys.readouterr().err.split())


def test_a_prompt_longer_than_the_context_and_a_deep_line_are_named(
    tmp_path: Path, export: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A prompt past the target's context was decoded and reported; a 5,000-deep JSON line was exit 3."""
    from tests.trainer.input_files import no_target_loads

    no_target_loads(monkeypatch)
    base = ["eval", "--export", str(export), "--target", "tiny"]
    long_prompt = prompts_file(tmp_path / "long.jsonl", [{"input_ids": [1, 2]}, {"input_ids": [3] * 5000}])
    assert run([*base, "--prompts", str(long_prompt)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "long.jsonl line 2: 5,000 prompt tokens and --max-new-tokens 128 are more than the target's context"
        in err
    )
    deep = tmp_path / "deep.jsonl"
    deep.write_text(json.dumps({"input_ids": [1]}) + "\n" + "[" * 5000 + "]" * 5000 + "\n")
    assert run([*base, "--prompts", str(deep)]) == 2
    assert "deep.jsonl line 2: nested too deeply to read" in " ".join(capsys.readouterr().err.split())


def test_a_runs_output_folder_given_as_export_names_its_export(
    tmp_path: Path, export: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`eval --export RUN` (the run's output folder, not its export) said only that a file was missing (N13)."""
    import shutil

    from tests.trainer.input_files import no_target_loads

    no_target_loads(monkeypatch)
    run_folder = tmp_path / "run"
    shutil.copytree(export, run_folder / "export")
    prompts = prompts_file(tmp_path / "p.jsonl", [{"input_ids": PROMPTS[0]}])
    assert run(["eval", "--export", str(run_folder), "--target", "tiny", "--prompts", str(prompts)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"--export: {run_folder} is a run's output folder; its drafter is in {run_folder}/export" in err
    assert f"--export {run_folder}/export" in err
