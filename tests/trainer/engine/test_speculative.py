"""Speculative decoding in the engine against the Python loop it replaces (trainer.eval.speculative): on a CPU
in fp32 the same tokens, the same verify forwards and the same tokens emitted by each, for the drafter and for
prompt lookup, with stop tokens, budgets cut mid-block and fewer slots than prompts (rows refilled)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from torch import Tensor

from trainer.engine.decoder import KVDecoder
from trainer.engine.drafting import DrafterProposer, LookupProposer
from trainer.engine.scheduler import Scheduler
from trainer.engine.speculative import SpeculativeDecoder
from trainer.eval.proposers import DFlashProposer, PromptLookup, lookup
from trainer.eval.speculative import SpecTarget, greedy_decode, speculative_decode
from trainer.model.drafter import DFlashDrafter, DrafterConfig
from trainer.runspec.target_shapes import tiny_qwen3_config
from trainer.target_model.tiny import build_embedded_target

BLOCK = 4


@pytest.fixture(scope="module")
def model() -> Any:
    return build_embedded_target("tiny", seed=0).eval()


@pytest.fixture(scope="module")
def drafter(model: Any) -> DFlashDrafter:
    cfg = DrafterConfig.from_target(tiny_qwen3_config(), 1, BLOCK, 511, [2])
    torch.manual_seed(0)
    return DFlashDrafter(cfg, model.model.embed_tokens.weight, model.lm_head.weight).eval()


def prompt_set() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(2, 40, (9,), generator=gen).tolist()
    prompts = [torch.randint(0, 500, (n,), generator=gen).tolist() for n in lengths]
    return [*prompts, [5, 6, 7, 8] * 5, [1, 2, 3, 1, 2, 3, 1, 2]]  # repetitive ones: lookup finds matches


def engine(
    model: Any, proposer_kind: str, drafter: DFlashDrafter, slots: int, max_len: int = 80
) -> SpeculativeDecoder:
    if proposer_kind == "dflash":
        decoder = KVDecoder(model, slots, max_len, capture_layers=[2])
        return SpeculativeDecoder(
            decoder, DrafterProposer(drafter, slots, decoder.max_len, decoder.exact_lengths)
        )
    decoder = KVDecoder(model, slots, max_len)
    return SpeculativeDecoder(
        decoder, LookupProposer(BLOCK - 1, 1, 4, slots, decoder.max_len, decoder.device)
    )


def loop_proposer(kind: str, drafter: DFlashDrafter) -> Any:
    return DFlashProposer(drafter) if kind == "dflash" else PromptLookup(BLOCK - 1)


@pytest.mark.parametrize("kind", ["dflash", "ngram"])
@pytest.mark.parametrize("stops", [False, True], ids=["no-stop", "stops"])
def test_the_engine_decodes_what_the_python_loop_decodes(
    model: Any, drafter: DFlashDrafter, kind: str, stops: bool
) -> None:
    prompts, max_new = prompt_set(), 24
    target = SpecTarget(model, [2] if kind == "dflash" else [])
    eos = None
    if stops:  # tokens the greedy answers do write, so rows end mid-block at them
        greedy = [greedy_decode(SpecTarget(model, []), p, max_new, None).tokens for p in prompts]
        eos = sorted({g[5] for g in greedy})[:3]
    reference = [speculative_decode(target, loop_proposer(kind, drafter), p, max_new, eos) for p in prompts]
    scheduler = Scheduler(engine(model, kind, drafter, slots=3), prompts, max_new, eos or [], sync_every=2)
    tokens, _ = scheduler.run()
    assert tokens == [r.tokens for r in reference]
    for figures, r in zip(scheduler.figures, reference, strict=True):
        histogram = [sum(a == n for a in r.accepted) for n in range(1, BLOCK + 1)]
        assert (figures["forwards"], figures["emitted"]) == (len(r.accepted), histogram)
        assert figures["drafted"] == sum(1 for n in r.proposed if n)
    if stops:
        assert any(len(t) < max_new for t in tokens)  # some rows did end at a stop token
    if kind == "ngram":
        assert sum(len(r.accepted) for r in reference) < sum(len(t) for t in tokens)  # lookup did accept


def test_the_engines_drafts_are_the_drafters_own_at_every_block(model: Any, drafter: DFlashDrafter) -> None:
    """The untrained drafter's drafts are all rejected, so equal tokens alone say nothing of them: record what
    both paths proposed, block by block, and hold them equal (the static context cache against ContextCache)."""
    prompts, max_new = prompt_set()[:5], 16
    seen_loop: list[list[list[int]]] = []
    for p in prompts:
        proposer, calls = DFlashProposer(drafter), []
        original = proposer.propose

        def recording(
            ids: list[int], features: Tensor | None, original: Any = original, calls: list = calls
        ) -> list[int]:
            calls.append(original(ids, features))
            return calls[-1]

        proposer.propose = recording  # type: ignore[method-assign]
        speculative_decode(SpecTarget(model, [2]), proposer, p, max_new, None)
        seen_loop.append(calls)
    spec = engine(model, "dflash", drafter, slots=len(prompts))
    seen_engine: list[list[list[int]]] = [[] for _ in prompts]
    prompt_of_row: dict[int, int] = {}  # the scheduler seats the longest prompts first
    original_propose, original_start = spec.proposer.propose, spec.proposer.start_rows

    def seating(where: Tensor, seated: list[list[int]], features: Tensor | None) -> None:
        prompt_of_row.update({row: prompts.index(p) for row, p in zip(where.tolist(), seated, strict=True)})
        original_start(where, seated, features)

    def engine_recording(tokens: Tensor, positions: Tensor, span: int) -> tuple[Tensor, Tensor]:
        drafts, counts = original_propose(tokens, positions, span)
        for row in torch.nonzero(spec.live).flatten().tolist():
            seen_engine[prompt_of_row[row]].append(drafts[row].tolist())
        return drafts, counts

    spec.proposer.start_rows = seating  # type: ignore[method-assign]
    spec.proposer.propose = engine_recording  # type: ignore[method-assign]
    Scheduler(spec, prompts, max_new, [], sync_every=1).run()
    assert seen_engine == seen_loop


def test_device_prompt_lookup_is_the_python_rule() -> None:
    rng = random.Random(0)
    slots, max_len, k = 64, 64, 5
    proposer = LookupProposer(k, 1, 4, slots, max_len, torch.device("cpu"))
    histories = [[rng.randrange(6) for _ in range(rng.randrange(2, 40))] for _ in range(slots)]
    for row, h in enumerate(histories):
        proposer.history[row, : len(h) - 1] = torch.tensor(h[:-1])
    tokens = torch.tensor([h[-1] for h in histories])
    positions = torch.tensor([len(h) - 1 for h in histories])
    drafts, counts = proposer.propose(tokens, positions, 0)
    for row, h in enumerate(histories):
        want = lookup(h, k, 1, 4)
        assert drafts[row, : counts[row]].tolist() == want, (row, h)


class OracleProposer:
    """Proposes each row's known greedy continuation (from `continuations`), wrong from `wrong_at` on: a block
    is accepted up to there, whole when `wrong_at` >= B - 1."""

    name, layer_ids = "oracle", []

    def __init__(
        self, continuations: dict[tuple[int, ...], list[int]], slots: int, block: int, wrong_at: int
    ) -> None:
        self.max_draft, self.wrong_at, self.continuations = block - 1, wrong_at, continuations
        width = max(map(len, continuations.values()))
        self.sequence = torch.zeros((slots, width), dtype=torch.long)  # the continuation of each row's prompt
        self.prompt_lens = torch.zeros(slots, dtype=torch.long)

    def start_rows(self, where: Tensor, prompts: list[list[int]], features: Tensor | None) -> None:
        for row, prompt in zip(where.tolist(), prompts, strict=True):
            known = self.continuations[tuple(prompt)]
            self.sequence[row, : len(known)] = torch.tensor(known)
            self.prompt_lens[row] = len(prompt)

    def propose(self, tokens: Tensor, positions: Tensor, span: int) -> tuple[Tensor, Tensor]:
        at = (positions - self.prompt_lens + 1)[:, None] + torch.arange(self.max_draft)
        drafts = self.sequence.gather(1, at.clamp(0, self.sequence.shape[1] - 1))
        drafts[:, self.wrong_at :] = (drafts[:, self.wrong_at :] + 1) % 500
        return drafts, torch.full_like(positions, self.max_draft)

    def accept(self, features: Tensor | None, positions: Tensor, emitted: Tensor, counts: Tensor) -> None:
        pass

    def state(self) -> list[Tensor]:
        return []


@pytest.mark.parametrize("wrong_at, tau", [(3, 4.0), (1, 2.0), (0, 1.0)])
def test_an_oracle_block_is_accepted_up_to_its_first_wrong_token(
    model: Any, wrong_at: int, tau: float
) -> None:
    """21 new tokens: the prefill's, then 20 from verify forwards of B = 4: whole blocks (5 forwards of 4), two
    at a time (10 of 2), one (20 of 1). The budget cuts the last block: 22 asked of an oracle of block 4 is the
    prefill's token, 5 whole blocks and one more forward emitting 1."""
    prompts = prompt_set()[:4]
    greedy = [greedy_decode(SpecTarget(model, []), p, 40, None).tokens for p in prompts]
    for max_new, last in ((21, None), (22, 1)):
        decoder = KVDecoder(model, len(prompts), 90)
        oracle = OracleProposer(
            {tuple(p): g for p, g in zip(prompts, greedy, strict=True)}, len(prompts), BLOCK, wrong_at
        )
        scheduler = Scheduler(SpeculativeDecoder(decoder, oracle), prompts, max_new, [], sync_every=4)
        tokens, _ = scheduler.run()
        assert tokens == [g[:max_new] for g in greedy]
        for figures in scheduler.figures:
            emitted, whole = figures["emitted"], int(tau)
            # 20 tokens from whole blocks; the 22nd asked: one more forward, cut to the 1 token the budget allows
            expected = [0] * BLOCK
            expected[whole - 1] += 20 // whole
            expected[0] += 0 if last is None else last
            assert emitted == expected
            assert sum((n + 1) * c for n, c in enumerate(emitted)) == max_new - 1


@pytest.mark.gpu
def test_captured_graphs_decode_what_eager_steps_decode(drafter: DFlashDrafter) -> None:
    """On a GPU the speculative step is captured once as a CUDA graph and replayed: the same tokens and
    figures as running it eagerly (bf16 both, one device)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    device = torch.device("cuda")
    model = build_embedded_target("tiny", seed=0, device=device, dtype=torch.bfloat16).eval()
    gpu_drafter = DFlashDrafter(drafter.cfg, model.model.embed_tokens.weight, model.lm_head.weight).to(
        device, torch.bfloat16
    )
    gpu_drafter.load_state_dict(drafter.state_dict())
    prompts = prompt_set()
    results = {}
    for graphs in (True, False):
        for kind in ("target", "dflash", "ngram"):
            layers = [2] if kind == "dflash" else []
            decoder: Any = KVDecoder(model, 4, 96, graphs=graphs, capture_layers=layers)
            if kind == "dflash":
                decoder = SpeculativeDecoder(
                    decoder, DrafterProposer(gpu_drafter, 4, decoder.max_len, decoder.exact_lengths)
                )
            elif kind == "ngram":
                decoder = SpeculativeDecoder(
                    decoder, LookupProposer(BLOCK - 1, 1, 4, 4, decoder.max_len, device)
                )
            scheduler = Scheduler(decoder, prompts, 32, [7, 9], sync_every=3)
            tokens, stats = scheduler.run()
            results[(graphs, kind)] = (tokens, scheduler.figures)
            assert (stats.graphs > 0) == graphs
    for kind in ("target", "dflash", "ngram"):
        assert results[(True, kind)] == results[(False, kind)], kind
