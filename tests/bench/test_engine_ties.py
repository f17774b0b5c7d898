"""bench/decode/engine_ties.py: two engines' differing answers judged at their first flip, on the tiny target."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from bench.decode.engine_ties import END, answer_ids, classify_answers, classify_flip
from bench.lib.target_folder import make_target_folder
from trainer.engine.target import load_generation_target, prompt_ids
from trainer.regenerate.settings import Completion

CHAT = [{"role": "user", "content": "w1 w2 w3"}]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    folder = make_target_folder(tmp_path_factory.mktemp("ties") / "target")
    return load_generation_target(str(folder), torch.device("cpu"))


def ranked_next(model: Any, ids: list[int]) -> list[int]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
    return logits.argsort(descending=True).tolist()


def test_a_runner_up_within_the_tolerance_is_a_tie_and_a_far_token_is_not(target: tuple[Any, Any]) -> None:
    model, tokenizer = target
    prompt = prompt_ids(tokenizer, CHAT, {})
    best, second, *_, worst = ranked_next(model, prompt)
    wide = classify_flip(model, prompt, [best], [second], tie_ulps=1 << 40)
    assert wide is not None and wide.verdict == "tie" and wide.margin_a == 0.0 and wide.margin_b > 0
    tight = classify_flip(model, prompt, [best], [second], tie_ulps=0)
    assert tight is not None and tight.verdict == "different"
    far = classify_flip(model, prompt, [best], [worst], tie_ulps=16)
    assert far is not None and far.verdict == "different" and far.margin_b > far.allowed


def test_the_flip_is_judged_after_the_shared_prefix(target: tuple[Any, Any]) -> None:
    model, tokenizer = target
    prompt = prompt_ids(tokenizer, CHAT, {})
    first = ranked_next(model, prompt)[0]
    best, second = ranked_next(model, [*prompt, first])[:2]
    flip = classify_flip(model, prompt, [first, best], [first, second], tie_ulps=1 << 40)
    assert flip is not None and flip.at == 1 and (flip.token_a, flip.token_b) == (best, second)
    assert classify_flip(model, prompt, [first, best], [first, best], tie_ulps=0) is None


def test_answers_are_counted_identical_cut_or_different(target: tuple[Any, Any]) -> None:
    model, tokenizer = target
    stop = [tokenizer.eos_token_id]
    prompt = prompt_ids(tokenizer, CHAT, {})
    worst = ranked_next(model, prompt)[-1]
    same = Completion("w5 w6", 3, "stop")
    cut = Completion("w5", 1, "length")  # the other engine stopped at a smaller cap: no token pair
    wrong = Completion(tokenizer.decode([worst]), 1, "length")
    report = classify_answers(model, tokenizer, stop, [CHAT] * 3, [same, same, same], [same, cut, wrong])
    assert (report["identical"], report["cut_prefix"], report["different"], report["tie"]) == (1, 1, 1, 0)
    assert report["dtype"] == "float32" and report["tie_ulps"] == 64
    assert report["different_examples"][0]["answer"] == 2
    assert answer_ids(tokenizer, same)[-1] == END and answer_ids(tokenizer, cut)[-1] != END


def test_an_ended_turn_is_judged_by_the_best_of_the_stop_ids(target: tuple[Any, Any]) -> None:
    """An engine stops on any stop id: against a continuing answer, the ended one's logit is the best of them
    (judged by one listed stop id alone, a turn ended on another would look like a real difference)."""
    model, tokenizer = target
    prompt = prompt_ids(tokenizer, CHAT, {})
    ranked = ranked_next(model, prompt)
    best, second, worst = ranked[0], ranked[1], ranked[-1]
    runner_up = classify_flip(model, prompt, [best], [second], tie_ulps=1 << 40)
    assert runner_up is not None
    # a tolerance that admits the runner-up and not the worst token
    tolerance = int(1.01 * runner_up.margin_b / (runner_up.allowed / (1 << 40))) + 1
    as_stop = classify_flip(model, prompt, [best], [END], tolerance, stop_ids=[worst, second])
    assert as_stop is not None and as_stop.token_b == END and as_stop.verdict == "tie"
    only_worst = classify_flip(model, prompt, [best], [END], tolerance, stop_ids=[worst])
    assert only_worst is not None and only_worst.verdict == "different"


def test_both_torch_engines_keep_the_ids_they_wrote_and_agree_in_fp32(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The comparison reads the engines' own ids (text can tokenise back differently): each keeps them up to
    its end-of-turn token, they decode to the answer's text, and on CPU in fp32 the two engines agree."""
    from trainer.regenerate.generate_engine import TorchEngine
    from trainer.regenerate.kv_engine import KVEngine
    from trainer.regenerate.settings import GenerationSettings

    folder = make_target_folder(tmp_path_factory.mktemp("ids") / "target")
    settings = GenerationSettings(target=str(folder), max_new_tokens=12)
    chats = [[{"role": "user", "content": " ".join(f"w{j}" for j in range(1, 2 + i))}] for i in range(4)]
    old_engine = TorchEngine(settings, "cpu", batch_size=4)
    kv = KVEngine(settings, "cpu")
    old, new = old_engine.generate(chats), kv.generate(chats)
    for answer in (*old, *new):
        assert answer.token_ids and len(answer.token_ids) == answer.tokens
        kept = answer.token_ids[:-1] if answer.finish_reason == "stop" else answer.token_ids
        assert old_engine.tokenizer.decode(list(kept), skip_special_tokens=True) == answer.text
        assert (answer.finish_reason == "stop") == (answer.token_ids[-1] in old_engine.stop_ids)
    report = classify_answers(old_engine.model, old_engine.tokenizer, old_engine.stop_ids, chats, old, new)
    assert report["identical"] == len(chats) and report["different"] == 0
