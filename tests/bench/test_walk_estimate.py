"""bench/decode/walk_estimate.py scores any export on named chat sets with the run's own decoding walk, and
bench/decode/loop_share.py counts the supervision `data.loops = "cut"` takes out (issue 36, S13)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.trainer.chat_fixtures import save_chat_target
from trainer.model.build import build_drafter
from trainer.model.export import export_drafter
from trainer.runspec.config import load_config
from trainer.target_model.load import load_target_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def chat_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_chat_target(tmp_path_factory.mktemp("target"))


CHATS = [
    [{"role": "user", "content": f"Q{i}"}, {"role": "assistant", "content": f"Answer number {i}, short."}]
    for i in range(5)
]


def _write(path: Path, chats: list[list[dict[str, str]]]) -> Path:
    path.write_text("".join(json.dumps({"id": str(i), "messages": c}) + "\n" for i, c in enumerate(chats)))
    return path


def test_walk_estimate_scores_each_export_on_each_set(tmp_path: Path, chat_target: Path) -> None:
    data = _write(tmp_path / "a.jsonl", CHATS)
    other = _write(tmp_path / "b.jsonl", CHATS[:3])
    config = tmp_path / "run.toml"
    config.write_text(
        f'[target]\npath = "{chat_target}"\n[drafter]\nblock_size = 4\ntarget_layer_ids = [1]\n'
        f'[data]\nkind = "chat"\npath = "{data}"\nseq_len = 64\n[optim]\nsteps = 1\nanchors = 8\n'
    )
    cfg = load_config(str(config))
    target = load_target_model(str(chat_target), 0, torch.device("cpu"), torch.float32)
    embed = target.get_input_embeddings().weight.detach()
    drafter = build_drafter(cfg, target.config, embed, embed, torch.device("cpu"))
    export = export_drafter(drafter, tmp_path / "export", dtype=torch.float32)
    out = tmp_path / "walk.json"
    command = [sys.executable, "-m", "bench.decode.walk_estimate", "--config", str(config), "--dtype", "fp32"]
    command += ["--export", f"x={export}", "--export", f"y={export}", "--batch", "2", "--out", str(out)]
    command += ["--set", f"a={data}", "--set", f"b={other}"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    walk = json.loads(out.read_text())["walk"]
    assert set(walk) == {"x", "y"} and walk["x"] == walk["y"]  # one capture serves both exports
    assert walk["x"]["a"]["conversations"] == 5 and walk["x"]["b"]["conversations"] == 3
    for scored in walk["x"].values():  # tokens / forwards of the walk, at least 1 token a forward
        assert scored["walk_forwards"] > 0 and scored["walk_tau"] >= 1.0
        assert scored["walk_tau"] == pytest.approx(scored["walk_tokens"] / scored["walk_forwards"], abs=1e-3)


def test_loop_share_counts_what_cutting_loops_leaves_out(tmp_path: Path, chat_target: Path) -> None:
    looping = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "Ok. " + "ab" * 100}]
    data = tmp_path / "d.jsonl"
    data.write_text(
        json.dumps({"messages": looping, "generation": {"finish_reasons": ["length"]}})
        + "\n"
        + json.dumps({"messages": CHATS[0], "generation": {"finish_reasons": ["stop"]}})
        + "\n"
    )
    out = tmp_path / "share.json"
    command = [sys.executable, "-m", "bench.decode.loop_share", "--target", str(chat_target)]
    command += ["--data", f"d={data}", "--sample", "2", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    share = json.loads(out.read_text())["d"]
    assert share["records"] == 2 and share["ending_in_loop_text"] == 1
    assert share["keep"]["loops_cut"] == 0 and share["cut"]["loops_cut"] == 1
    assert share["keep"]["unfinished"] == share["cut"]["unfinished"] == 1
    # the looping answer's repeats and its end-of-turn leave the loss; the short answer is whole either way
    assert share["keep"]["supervised"] - share["cut"]["supervised"] == share["cut"]["tokens_left_out"] - 1
