"""Issue 39 U3: the engines count tokens while a call runs (so `data regenerate`'s progress is not 0 until a
chunk ends), the counts add up to what they wrote, and on a CPU the first commit is one fill of the rows, not
64 conversations (~9 minutes of SmolLM2-135M on a 2-core box, which a Ctrl-C lost whole)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from trainer.engine.target import Chat
from trainer.regenerate.generate_engine import TorchEngine
from trainer.regenerate.kv_engine import KVEngine
from trainer.regenerate.settings import Completion, GenerationSettings


@pytest.fixture(scope="module")
def target_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from bench.lib.target_folder import make_target_folder

    return make_target_folder(tmp_path_factory.mktemp("target"))


def chats(n: int) -> list[Chat]:
    return [
        [{"role": "user", "content": " ".join(f"w{(5 * i + j) % 400}" for j in range(1 + i % 9))}]
        for i in range(n)
    ]


def test_the_kv_engine_counts_tokens_at_each_look_and_they_add_up(target_folder: Path) -> None:
    """Tokens are told every SYNC_EVERY steps of one call, not once at its end, and sum to the answers'."""
    engine = KVEngine(GenerationSettings(target=str(target_folder), max_new_tokens=40), "cpu", slots=3)
    counts: list[int] = []
    engine.on_tokens = counts.append
    answers = engine.generate(chats(7))
    assert len(counts) > 2, counts  # many looks in one call: the bar moves while it runs
    assert all(c > 0 for c in counts)
    assert sum(counts) == sum(a.tokens for a in answers) == engine.report()["generated_tokens"]


def test_generates_engine_counts_each_step_on_a_cpu_exactly(target_folder: Path) -> None:
    engine = TorchEngine(
        GenerationSettings(target=str(target_folder), max_new_tokens=12), "cpu", batch_size=4
    )
    counts: list[int] = []
    engine.on_tokens = counts.append
    answers = engine.generate(chats(6))
    assert len(counts) >= 12  # one per decode step, over two batches
    assert sum(counts) == sum(a.tokens for a in answers)


def test_on_a_cpu_the_first_commit_is_one_fill_of_the_rows(target_folder: Path) -> None:
    settings = GenerationSettings(target=str(target_folder), max_new_tokens=8)
    assert KVEngine(settings, "cpu", slots=8).first_chunk == 8  # was None: min(64, --commit-every) = 60
    assert KVEngine(settings, "cpu").first_chunk == 8  # the CPU default slots
    assert TorchEngine(settings, "cpu", batch_size=8).first_chunk == 8


class CountingEngine:
    """Tells `on_tokens` 5 tokens per answer while `generate` runs, and checks the tokens are seen in flight."""

    name = "fake"
    rows_at_once = 1

    def __init__(self) -> None:
        self.on_tokens = None
        self.seen_in_flight: list[int] = []

    def generate(self, chats: Sequence[Chat]) -> list[Completion]:
        for _ in chats:
            assert self.on_tokens is not None
            self.on_tokens(5)
        return [Completion("an answer", 5, "stop") for _ in chats]

    def close(self) -> None:
        pass


def test_regenerate_passes_the_in_flight_tokens_on_and_commits_reset_them(tmp_path: Path) -> None:
    from tests.trainer.regenerate.test_regenerate import SETTINGS, write_prompts
    from trainer.regenerate.job import Summary, regenerate, scan_input

    prompts = write_prompts(tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": f"p{i}"} for i in range(6)])
    seen: list[tuple[int, int, int]] = []  # (written, in flight, tokens so far) at each count

    def counted(summary: Summary) -> None:
        seen.append((summary.written, summary.in_flight_tokens, summary.tokens_so_far))

    summary = regenerate(
        scan_input(prompts, "stop"), tmp_path / "out.jsonl", SETTINGS, CountingEngine, chunk_size=3,
        on_tokens=counted,
    )  # fmt: skip
    assert seen[:3] == [(0, 5, 5), (0, 10, 10), (0, 15, 15)]  # before the first commit: tokens, not zeros
    assert seen[3] == (3, 5, 20)  # the first chunk committed (15), the second's first answer in flight
    assert summary.in_flight_tokens == 0 and summary.generated_tokens == 30 == summary.tokens_so_far
