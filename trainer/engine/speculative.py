"""Greedy block speculative decoding in the engine: every slot drafts, verifies and accepts on the device.

One step, for every slot at once (trainer.eval.speculative is the same algorithm one prompt at a time, the
reference this is tested against):
1. the proposer drafts up to B-1 tokens to follow each row's pending token (trainer.engine.drafting: the
   drafter from its static context cache, or prompt lookup over the row's tokens);
2. the target verifies [pending token, drafts] in one forward at the row's positions (its K/V written at those
   B positions), choosing its greedy token after each;
3. the longest prefix of drafts equal to the target's choices is accepted, plus the target's next token: the
   row emits `choices[:k + 1]` (cut at a stop token and at the budget), all on the device;
4. the row's length moves to its accepted tokens: what the verify wrote past them is never read (attention
   stops at each row's length) and the next step writes over it. The proposer takes the verified positions'
   captured layers (the drafter's context) and the emitted tokens (lookup's history).

The step has fixed shapes, so on CUDA it is captured once (with the drafter's forward) as a CUDA graph. A
`SpeculativeDecoder` is driven by `trainer.engine.scheduler.Scheduler` exactly as a `KVDecoder` is; as rows
end it hands over each row's verify forwards, how many of them drafted something, and how many tokens each
emitted (`row_figures`: tau and its histogram).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from trainer.engine.decoder import KVDecoder


class SpeculativeDecoder:
    """A `KVDecoder` whose step is a proposer's block verified by the target (see the module docstring)."""

    def __init__(self, decoder: KVDecoder, proposer: Any) -> None:
        if set(proposer.layer_ids) != set(decoder.capture_layers):
            raise ValueError(
                f"the decoder keeps layers {decoder.capture_layers}, the proposer reads {proposer.layer_ids}"
            )
        self.decoder, self.proposer = decoder, proposer
        self.block = proposer.max_draft + 1
        self.tokens_per_step = self.block
        slots, device = decoder.slots, decoder.device
        self.forwards = torch.zeros(slots, dtype=torch.long, device=device)  # verify forwards per row
        self.drafted = torch.zeros(slots, dtype=torch.long, device=device)  # ... that proposed a token
        self.emitted = torch.zeros((slots, self.block), dtype=torch.long, device=device)  # [n-1]: n emitted

    # What the scheduler reads: the decoder's.
    slots = property(lambda self: self.decoder.slots)
    device = property(lambda self: self.decoder.device)
    max_len = property(lambda self: self.decoder.max_len)
    live = property(lambda self: self.decoder.live)
    positions = property(lambda self: self.decoder.positions)
    produced = property(lambda self: self.decoder.produced)
    answers = property(lambda self: self.decoder.answers)
    exact_lengths = property(lambda self: self.decoder.exact_lengths)
    live_row_steps = property(lambda self: self.decoder.live_row_steps)
    attended_positions = property(lambda self: self.decoder.attended_positions)
    graphs_captured = property(lambda self: self.decoder.graphs_captured)

    def configure(self, max_new_tokens: int, stop_ids: Any, temperature: float, top_p: float) -> None:
        if temperature > 0:
            raise ValueError(
                "speculative decoding here is greedy: every emitted token is the target's argmax"
            )
        self.decoder.configure(max_new_tokens, stop_ids, temperature, top_p)
        for figure in (self.forwards, self.drafted, self.emitted):
            figure.zero_()

    def bucket(self, longest: int) -> int:
        return self.decoder.bucket(longest)

    @torch.inference_mode()
    def start_rows(self, prompts: list[list[int]], slots: list[int], keys: list[int]) -> None:
        features = self.decoder.start_rows(prompts, slots, keys)
        where = torch.tensor(slots, device=self.device)
        self.forwards[where], self.drafted[where], self.emitted[where] = 0, 0, 0
        self.proposer.start_rows(where, prompts, features)

    def _step(self, length: int) -> None:
        decoder, proposer = self.decoder, self.proposer
        positions = decoder.positions.clone()  # the pending tokens' positions, before the step moves them
        drafts, counts = proposer.propose(decoder.tokens, positions, length)
        x, features = decoder.forward_rows(torch.cat([decoder.tokens[:, None], drafts], 1), length)
        choices = decoder.logits(x).argmax(-1)  # (slots, B): the target's token after each fed position
        emitted = self._accept(choices, drafts, counts)
        proposer.accept(features, positions, choices, emitted)

    def _accept(self, choices: Tensor, drafts: Tensor, counts: Tensor) -> Tensor:
        """Each live row's accepted tokens into its answer; its count, whether it ended, its next pending
        token and position; the step's figures. Returns the tokens each row emitted (0 for an idle row)."""
        d = self.decoder
        live, block = d.live, self.block
        j = torch.arange(block, device=d.device)
        agree = (drafts == choices[:, :-1]) & (j[None, :-1] < counts[:, None])
        k = agree.long().cumprod(1).sum(1)  # drafts accepted: the longest agreeing prefix
        stop = d.stopped(choices) & (j[None] <= k[:, None])
        first_stop = torch.where(stop.any(1), stop.long().argmax(1), block)
        emitted = torch.minimum(torch.minimum(k + 1, first_stop + 1), d.max_new - d.produced)
        emitted = torch.where(live, emitted.clamp(min=1), 0)
        keep = j[None] < emitted[:, None]
        at = (d.produced[:, None] + j).clamp(max=d.max_len - 1)
        d.answers.scatter_(1, at, torch.where(keep, choices, d.answers.gather(1, at)))
        ended = live & ((stop & keep).any(1) | (d.produced + emitted >= d.max_new))
        last = choices.gather(1, (emitted - 1).clamp(min=0)[:, None])[:, 0]
        self.forwards += live
        self.drafted += live & (counts > 0)
        self.emitted.scatter_add_(1, (emitted - 1).clamp(min=0)[:, None], live[:, None].long())
        d.live_row_steps += live.sum()
        d.attended_positions += ((d.positions + block) * live).sum()
        d.produced += emitted
        d.tokens.copy_(torch.where(live, last, d.tokens))
        still = live & ~ended
        d.positions.copy_(torch.where(still, d.positions + emitted, 0))
        d.live.copy_(still)
        return emitted

    @torch.inference_mode()
    def step(self, length: int) -> None:
        """One draft-verify-accept step for every live slot."""
        if not self.decoder.use_graphs:
            self._step(length)
            return
        state = [*self.decoder.job_state(), self.forwards, self.drafted, self.emitted, *self.proposer.state()]
        self.decoder.graphs.replay(("speculative", length), lambda: self._step(length), state)

    def row_figures(self, where: Tensor) -> list[dict[str, Any]]:
        """Per row (ended rows, as the scheduler collects them): its verify forwards, how many drafted, and the
        histogram of tokens emitted per forward ([n-1]: forwards that emitted n)."""
        forwards = self.forwards[where].tolist()
        drafted = self.drafted[where].tolist()
        emitted = self.emitted[where].tolist()
        return [
            {"forwards": f, "drafted": p, "emitted": e}
            for f, p, e in zip(forwards, drafted, emitted, strict=True)
        ]
