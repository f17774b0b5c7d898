"""Issue 58, N5: two `data regenerate` into one --out both ran and wrote every answer twice; a later resume
accepted the doubled file and `data preview` (and `train`) trained the doubles. The output is locked for the
run (the second refused, naming the first's pid and host); resume drops repeated ids, saying how many; the
data checks of `train` and `data preview` refuse them, saying how many."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from pathlib import Path

import pytest

from dflash_base.errors import ConfigError, DoctorError
from tests.trainer.regenerate.test_regenerate import SETTINGS, EchoEngine, lines, write_prompts
from trainer.regenerate.job import regenerate, scan_input
from trainer.regenerate.out_lock import holding_output, lock_paths
from trainer.runspec.data_files import check_data_file


def _prompts(tmp_path: Path, count: int = 4) -> Path:
    return write_prompts(tmp_path / "in.jsonl", [{"id": f"p{i}", "prompt": f"q{i}"} for i in range(count)])


def test_n5_a_second_run_into_one_out_is_refused_naming_the_first(tmp_path: Path) -> None:
    prompts, out = _prompts(tmp_path), tmp_path / "out.jsonl"
    engine = EchoEngine()
    holder = f"pid {os.getpid()} on {socket.gethostname()}"
    with holding_output(out), pytest.raises(DoctorError, match=holder) as refused:  # the first run, writing
        regenerate(scan_input(prompts, "stop"), out, SETTINGS, lambda: engine)
    assert "another data regenerate" in refused.value.message and "--out" in (refused.value.hint or "")
    assert not engine.calls and not out.exists()  # nothing generated, nothing written
    summary = regenerate(scan_input(prompts, "stop"), out, SETTINGS, lambda: engine)  # once it is done
    assert summary.written == 4 and not lock_paths(out)[1].exists()  # the holder's note goes with the run


def test_n5_resume_drops_the_ids_a_doubled_file_repeats_saying_how_many(tmp_path: Path) -> None:
    prompts, out = _prompts(tmp_path), tmp_path / "out.jsonl"
    regenerate(scan_input(prompts, "stop"), out, SETTINGS, EchoEngine)
    whole = out.read_text()
    out.write_text(whole + whole.splitlines(keepends=True)[1] + whole)  # two runs' appends interleaved
    summary = regenerate(scan_input(prompts, "stop"), out, SETTINGS, EchoEngine)
    assert summary.duplicates_dropped == 5 and summary.written == 0 and summary.skipped_done == 4
    ids = [line["id"] for line in lines(out)]
    assert sorted(ids) == ["p0", "p1", "p2", "p3"] and out.read_text() == whole
    assert summary.to_json()["duplicates_dropped"] == 5


def _chat(ident: str) -> dict[str, object]:
    return {
        "id": ident,
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
    }


def test_n5_train_and_preview_refuse_repeated_ids_saying_how_many(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(_chat(i)) + "\n" for i in ["a", "b", "a", "c", "b", "a"]))
    with pytest.raises(ConfigError, match=r"3 record\(s\) repeat an id") as refused:
        check_data_file("chat", str(data))
    assert 'id "a" on line 3, first on line 1' in refused.value.message
    assert "data regenerate" in (refused.value.hint or "")
    data.write_text("".join(json.dumps(_chat(i)) + "\n" for i in ["a", "b", "c"]))
    check_data_file("chat", str(data))  # unique ids: quiet


def test_n5_a_greedy_and_a_sampled_run_concatenated_share_ids_and_pass(tmp_path: Path) -> None:
    """docs/data.md's recipe: `cat greedy.jsonl sampled.jsonl` carries each prompt's id twice, made with other
    settings: not a doubled line. The same id with the same settings is one (the line above)."""
    prompts = _prompts(tmp_path)
    greedy, sampled = tmp_path / "greedy.jsonl", tmp_path / "sampled.jsonl"
    regenerate(scan_input(prompts, "stop"), greedy, SETTINGS, EchoEngine)
    warm = dataclasses.replace(SETTINGS, temperature=0.8, seed=1)
    regenerate(scan_input(prompts, "stop"), sampled, warm, KeyedEcho)
    both = tmp_path / "train.jsonl"
    both.write_text(greedy.read_text() + sampled.read_text())
    check_data_file("chat", str(both))
    both.write_text(greedy.read_text() + greedy.read_text())
    with pytest.raises(ConfigError, match=r"4 record\(s\) repeat an id"):
        check_data_file("chat", str(both))


class KeyedEcho(EchoEngine):
    """EchoEngine for a sampled run: it is given each answer's key too."""

    def generate(self, chats, keys=None):  # type: ignore[no-untyped-def]
        return super().generate(chats)
