"""`data regenerate --samples-per-prompt N --temperature T --seed S` (issue 36 section 2): ids that say which
prompt and sample, each answer's key, resume with nothing lost or doubled, engines that cannot take keys
refused."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from dflash_base.errors import DoctorError
from tests.trainer.regenerate.test_regenerate import EchoEngine, lines, write_prompts
from trainer.engine.sampling import row_key
from trainer.engine.target import Chat
from trainer.regenerate.job import RegenerateError, regenerate, scan_input
from trainer.regenerate.settings import Completion, GenerationSettings

SAMPLED = GenerationSettings(target="/models/t", max_new_tokens=8, temperature=0.7, seed=5)


class KeyedEngine(EchoEngine):
    """Answers with the key it was given: the answer is a function of the key alone, as the KV engine's."""

    def generate(self, chats: Sequence[Chat], keys: Sequence[int] | None = None) -> list[Completion]:
        assert keys is not None and len(keys) == len(chats)
        self.calls.append([list(c) for c in chats])
        return [Completion(f"key {k}", 3, "stop") for k in keys]


def test_each_sample_has_its_id_its_prompt_and_its_key(tmp_path: Path) -> None:
    chat = [
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "x"},
        {"role": "user", "content": "u2"},
    ]
    prompts = write_prompts(
        tmp_path / "in.jsonl", [{"id": "a", "prompt": "p"}, {"id": "b", "messages": chat}]
    )
    out = tmp_path / "out.jsonl"
    regenerate(scan_input(prompts, "stop"), out, SAMPLED, KeyedEngine, samples_per_prompt=3)
    got = lines(out)
    assert [g["id"] for g in got] == ["a", "a#1", "a#2", "b", "b#1", "b#2"]
    assert [(g["prompt_id"], g["sample"]) for g in got] == [(p, k) for p in "ab" for k in range(3)]
    for g in got:
        answers = [m["content"] for m in g["messages"] if m["role"] == "assistant"]
        keys = [row_key(5, g["prompt_id"], g["sample"], turn) for turn in range(len(answers))]
        assert answers == [f"key {k}" for k in keys]
    assert len({g["messages"][-1]["content"] for g in got}) == 6  # every sample its own draw


def test_the_same_keys_whatever_the_chunks(tmp_path: Path) -> None:
    """A sampled answer does not depend on the commit (chunk) it was drawn in."""
    prompts = write_prompts(tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": "p"} for i in range(5)])
    texts = []
    for size in (1, 4):
        out = tmp_path / f"out{size}.jsonl"
        regenerate(
            scan_input(prompts, "stop"), out, SAMPLED, KeyedEngine, samples_per_prompt=2, chunk_size=size
        )
        texts.append([(g["id"], g["messages"][-1]["content"]) for g in lines(out)])
    assert texts[0] == texts[1]


def test_resume_from_a_partial_output_generates_only_what_is_missing(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": "p"} for i in range(4)])
    out = tmp_path / "out.jsonl"
    scan = scan_input(prompts, "stop")
    with pytest.raises(KeyboardInterrupt):  # a stop after 2 chunks of 3 conversations
        regenerate(scan, out, SAMPLED, lambda: _failing(2), samples_per_prompt=3, chunk_size=3)
    assert [g["id"] for g in lines(out)] == ["r0", "r0#1", "r0#2", "r1", "r1#1", "r1#2"]
    engine = KeyedEngine()
    summary = regenerate(scan, out, SAMPLED, lambda: engine, samples_per_prompt=3, chunk_size=3)
    ids = [g["id"] for g in lines(out)]
    assert sorted(ids) == sorted(f"r{i}" + (f"#{k}" if k else "") for i in range(4) for k in range(3))
    assert len(ids) == len(set(ids)) == 12 and summary.skipped_done == 6 and summary.written == 6
    asked = sum(len(call) for call in engine.calls)
    assert asked == 6  # only the missing (prompt, sample) pairs
    more = regenerate(scan, out, SAMPLED, KeyedEngine, samples_per_prompt=4)  # one more sample each
    assert more.written == 4 and len(lines(out)) == 16


def _failing(calls: int) -> KeyedEngine:
    engine = KeyedEngine()
    real = engine.generate

    def generate(chats: Sequence[Chat], keys: Sequence[int] | None = None) -> list[Completion]:
        if len(engine.calls) >= calls:
            raise KeyboardInterrupt
        return real(chats, keys)

    engine.generate = generate  # type: ignore[method-assign]
    return engine


def test_an_input_id_that_is_another_prompts_sample_id_is_refused(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "in.jsonl", [{"id": "a", "prompt": "p"}, {"id": "a#1", "prompt": "q"}])
    with pytest.raises(RegenerateError, match=r'line 2: id "a#1" gives the output id "a#1", which line 1'):
        regenerate(
            scan_input(prompts, "stop"), tmp_path / "o.jsonl", SAMPLED, KeyedEngine, samples_per_prompt=2
        )
    assert not (tmp_path / "o.jsonl").exists()


def test_greedy_answers_are_asked_without_keys(tmp_path: Path) -> None:
    """Greedy (the default) stays what it was: one answer per prompt, its id the prompt's."""
    prompts = write_prompts(tmp_path / "in.jsonl", [{"id": "a", "prompt": "p"}])
    regenerate(scan_input(prompts, "stop"), tmp_path / "o.jsonl", GenerationSettings("/models/t"), EchoEngine)
    (line,) = lines(tmp_path / "o.jsonl")
    assert line["id"] == "a" and line["sample"] == 0 and line["messages"][-1]["content"] == "answer to p"


def test_sampling_with_an_engine_that_cannot_take_keys_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' generate (a target the KV engine does not know) draws from one generator: refused,
    naming --engine, before it loads."""
    import trainer.regenerate.engines as engines
    from trainer.regenerate.engines import engine_factory

    monkeypatch.setattr(engines, "kv_engine_reason", lambda target: "a gemma model")
    with pytest.raises(DoctorError, match=r"--engine torch --temperature 0.7: .*not reproducible") as info:
        engine_factory("torch", SAMPLED, ["cpu"], None, 1)
    assert "--engine vllm" in (info.value.hint or "")
    greedy = GenerationSettings("/models/t")
    assert callable(engine_factory("torch", greedy, ["cpu"], None, 1))  # greedy needs no key


def test_vllm_seeds_each_answer_with_its_key(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    from trainer.regenerate.vllm_engine import VllmEngine

    seen: dict[str, object] = {}

    class Params:
        def __init__(self, **kwargs: object) -> None:
            self.kwargs = kwargs

    class LLM:
        def __init__(self, **kwargs: object) -> None:
            pass

        def chat(self, chats: list, sampling_params: object, **kwargs: object) -> list:
            seen["params"] = sampling_params
            out = types.SimpleNamespace(text="t", token_ids=[1], finish_reason="stop")
            return [types.SimpleNamespace(outputs=[out]) for _ in chats]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=Params, LLM=LLM))
    engine = VllmEngine(SAMPLED)
    engine.generate([[{"role": "user", "content": "a"}]] * 2, keys=[11, 12])
    params = seen["params"]
    assert isinstance(params, list) and [p.kwargs["seed"] for p in params] == [11, 12]


@pytest.fixture(scope="module")
def target_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from bench.lib.target_folder import make_target_folder

    return make_target_folder(tmp_path_factory.mktemp("target"))


def test_the_kv_engine_draws_the_same_samples_in_any_chunking(target_folder: Path, tmp_path: Path) -> None:
    """The real engine on the tiny target: sampled answers equal across chunk sizes, and differ by sample."""
    from trainer.engine.support import kv_engine_reason
    from trainer.regenerate.kv_engine import KVEngine

    assert kv_engine_reason(str(target_folder)) is None
    settings = GenerationSettings(str(target_folder), max_new_tokens=6, temperature=1.0, seed=3)
    prompts = write_prompts(tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": f"w{i} w2"} for i in range(3)])
    texts = []
    for size in (1, 6):
        out = tmp_path / f"out{size}.jsonl"
        engine = lambda: KVEngine(settings, "cpu", slots=4)  # noqa: E731
        regenerate(scan_input(prompts, "stop"), out, settings, engine, samples_per_prompt=2, chunk_size=size)
        texts.append({g["id"]: g["messages"][-1]["content"] for g in lines(out)})
    assert texts[0] == texts[1] and len(texts[0]) == 6
    assert len(set(texts[0].values())) > 1  # not one answer copied: each sample its own draw
