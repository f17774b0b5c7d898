"""The decode-attention kernel reads each row's own length and gives what SDPA with a mask gives; the KV
decoder on it writes the same tokens as on SDPA. Triton runs here under its CPU interpreter (fp32: the
interpreter's bf16 dot is wrong, so bf16 is checked on the GPU by bench/decode/kv_engine_throughput.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

triton = pytest.importorskip("triton", reason="Triton is not installed (the kernel runs where it is)")

ROOT = Path(__file__).resolve().parents[3]


def run_interpreted(code: str) -> str:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_kernel_equals_masked_sdpa_and_stops_at_each_rows_length() -> None:
    out = run_interpreted(
        """
        import torch
        from trainer.kernels.cached_attention import cached_attention, decode_attention, masked_attention
        torch.manual_seed(0)
        for slots, heads, kv_heads, d, span in ((5, 9, 3, 64, 200), (3, 8, 2, 32, 70)):
            q = torch.randn(slots, heads, d)
            k, v = torch.randn(2, slots, kv_heads, span, d)
            lengths = torch.tensor([1, span, 65, 64, 3][:slots], dtype=torch.int32)
            got = decode_attention(q, k, v, lengths, 0.125)
            want = masked_attention(q[:, None], k, v, lengths, 0.125)[:, 0]
            assert (got - want).abs().max() < 1e-5, (got - want).abs().max()
            # what lies past a row's length is never read: poison it and get the same answer
            k2, v2 = k.clone(), v.clone()
            for row, n in enumerate(lengths.tolist()):
                k2[row, :, n:], v2[row, :, n:] = float("nan"), float("nan")
            assert torch.equal(decode_attention(q, k2, v2, lengths, 0.125), got)
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_a_block_of_queries_sees_what_its_mode_allows() -> None:
    """A verified block (causal: query t sees the keys up to its own) and a drafted block (every key up to the
    row's length), against SDPA with the mask spelt out, and against one query at a time for the causal mode:
    a block's query t attends exactly what a decode step at that position would."""
    out = run_interpreted(
        """
        import torch
        from trainer.kernels.cached_attention import cached_attention, decode_attention, masked_attention
        torch.manual_seed(1)
        slots, queries, heads, kv_heads, d, span = 4, 16, 9, 3, 64, 160
        q = torch.randn(slots, queries, heads, d)
        k, v = torch.randn(2, slots, kv_heads, span, d)
        lengths = torch.tensor([16, 17, 90, 160], dtype=torch.int32)
        for causal in (True, False):
            got = cached_attention(q, k, v, lengths, 0.125, causal=causal)
            want = masked_attention(q, k, v, lengths, 0.125, causal=causal)
            assert (got - want).abs().max() < 1e-5, (causal, (got - want).abs().max())
            # by hand for one row: row 2's query 3 sees keys [0, 90 - 16 + 3 + 1) causal, [0, 90) otherwise
            end = 78 if causal else 90
            scores = torch.einsum("hd,hjd->hj", q[2, 3].view(kv_heads, 3, d).reshape(heads, d),
                                  k[2].repeat_interleave(3, 0)[:, :end]) * 0.125
            by_hand = torch.einsum("hj,hjd->hd", scores.softmax(-1), v[2].repeat_interleave(3, 0)[:, :end])
            assert (got[2, 3] - by_hand).abs().max() < 1e-5
        causal = cached_attention(q, k, v, lengths, 0.125, causal=True)
        for t in range(queries):
            one = decode_attention(q[:, t].contiguous(), k, v, lengths - queries + t + 1, 0.125)
            assert (causal[:, t] - one).abs().max() < 1e-5, t
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_the_masked_reference_equals_attention_by_hand() -> None:
    """The fallback (SDPA with a mask, what a CPU without Triton runs) against softmax written out."""
    import torch

    from trainer.kernels.cached_attention import masked_attention

    torch.manual_seed(2)
    q = torch.randn(2, 3, 4, 8)
    k, v = torch.randn(2, 2, 2, 12, 8)
    lengths = torch.tensor([5, 12])
    for causal in (True, False):
        got = masked_attention(q, k, v, lengths, 0.5, causal)
        for row in range(2):
            for t in range(3):
                end = int(lengths[row]) - 3 + t + 1 if causal else int(lengths[row])
                kk = k[row].repeat_interleave(2, 0)[:, :end]
                vv = v[row].repeat_interleave(2, 0)[:, :end]
                want = torch.einsum(
                    "hj,hjd->hd", (torch.einsum("hd,hjd->hj", q[row, t], kk) * 0.5).softmax(-1), vv
                )
                assert (got[row, t] - want).abs().max() < 1e-5


def test_the_decoder_on_the_kernel_writes_the_tokens_it_writes_on_sdpa(tmp_path: Path) -> None:
    out = run_interpreted(
        f"""
        from pathlib import Path
        import torch
        from bench.lib.target_folder import make_target_folder
        from trainer.engine.scheduler import Scheduler
        from trainer.engine.target import load_generation_target
        from trainer.engine.decoder import KVDecoder
        model, _ = load_generation_target(str(make_target_folder(Path({str(tmp_path)!r}) / "t")), torch.device("cpu"))
        prompts = [[1 + (5 * i + j) % 90 for j in range(2 + (i * 7) % 19)] for i in range(7)]
        answers = {{}}
        for exact in (True, False):
            decoder = KVDecoder(model, 3, 40)
            assert decoder.exact_lengths
            decoder.exact_lengths = exact
            answers[exact], stats = Scheduler(decoder, prompts, 9, [], sync_every=3).run()
            assert all(len(a) == 9 for a in answers[exact])
        assert answers[True] == answers[False]
        print("ok")
        """
    )
    assert out.strip() == "ok"
