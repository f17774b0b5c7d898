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
        from trainer.kernels.decode_attention import decode_attention, _sdpa_reference
        torch.manual_seed(0)
        for slots, heads, kv_heads, d, span in ((5, 9, 3, 64, 200), (3, 8, 2, 32, 70)):
            q = torch.randn(slots, heads, d)
            k, v = torch.randn(2, slots, kv_heads, span, d)
            lengths = torch.tensor([1, span, 65, 64, 3][:slots], dtype=torch.int32)
            got = decode_attention(q, k, v, lengths, 0.125)
            want = _sdpa_reference(q, k, v, lengths, 0.125)
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


def test_the_decoder_on_the_kernel_writes_the_tokens_it_writes_on_sdpa(tmp_path: Path) -> None:
    out = run_interpreted(
        f"""
        from pathlib import Path
        import torch
        from tests.trainer.target_folder import make_target_folder
        from trainer.engine.scheduler import decode_all
        from trainer.engine.target import load_generation_target
        from trainer.engine.decoder import KVDecoder
        model, _ = load_generation_target(str(make_target_folder(Path({str(tmp_path)!r}) / "t")), torch.device("cpu"))
        prompts = [[1 + (5 * i + j) % 90 for j in range(2 + (i * 7) % 19)] for i in range(7)]
        answers = {{}}
        for exact in (True, False):
            decoder = KVDecoder(model, 3, 40)
            assert decoder.exact_lengths
            decoder.exact_lengths = exact
            answers[exact], stats = decode_all(decoder, prompts, 9, [], sync_every=3)
            assert all(len(a) == 9 for a in answers[exact])
        assert answers[True] == answers[False]
        print("ok")
        """
    )
    assert out.strip() == "ok"
