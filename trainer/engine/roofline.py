"""What a decode job could have done at the GPU's peaks: the bytes its steps had to read (the weights once a
step, the K/V each live row attended) and the FLOPs they had to do, against memory bandwidth and matrix rate.

Peaks are the datasheets' (dense bf16, HBM); a GPU not in the table gets no roofline rather than a made-up
one. The achieved share is the decode's generated tokens over its decode seconds, against this bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# name fragment (as torch.cuda.get_device_name says it) -> (HBM TB/s, dense bf16 TFLOP/s)
PEAKS = {
    "H200": (4.8, 989.0),
    "H100 SXM": (3.35, 989.0),
    "H100 80GB HBM3": (3.35, 989.0),
    "H100 PCIe": (2.0, 756.0),
    "A100-SXM4-80GB": (2.04, 312.0),
    "A100-SXM4-40GB": (1.56, 312.0),
    "L40S": (0.864, 362.0),
}


def peaks_of(device_name: str) -> tuple[float, float] | None:
    for fragment, peaks in PEAKS.items():
        if fragment in device_name:
            return peaks
    return None


@dataclass(frozen=True)
class Roofline:
    bytes_read: float
    flops: float
    bound_s: float
    bound_tok_s: float
    achieved_tok_s: float

    @property
    def share(self) -> float:
        return self.achieved_tok_s / self.bound_tok_s if self.bound_tok_s else 0.0

    def to_json(self) -> dict[str, float]:
        return {
            "bytes_read_gb": round(self.bytes_read / 1e9, 3),
            "tflop": round(self.flops / 1e12, 3),
            "roofline_tok_s": round(self.bound_tok_s, 1),
            "decode_tok_s": round(self.achieved_tok_s, 1),
            "share_of_roofline": round(self.share, 4),
        }


def decode_roofline(model: Any, stats: Any, kv_bytes_per_token: int, peaks: tuple[float, float]) -> Roofline:
    """The bound for the decode steps in `stats` (trainer.engine.scheduler.DecodeStats)."""
    config = model.config
    params = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight.data_ptr() == embed.data_ptr()
    read_params = params - (0 if tied else embed.numel())  # a lookup reads one row of an untied embedding
    dense_params = params - embed.numel() + (embed.numel() if tied else 0)  # the head multiplies either way
    width = config.num_attention_heads * (
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )
    attention_flops = 4 * width * config.num_hidden_layers * stats.attended  # q.k and p.v per position
    bytes_read = stats.steps * read_params * embed.element_size() + stats.attended * kv_bytes_per_token
    flops = 2 * dense_params * stats.row_steps + attention_flops
    bandwidth, peak = peaks
    bound_s = max(bytes_read / (bandwidth * 1e12), flops / (peak * 1e12))
    decoded = stats.row_steps
    return Roofline(
        bytes_read,
        flops,
        bound_s,
        decoded / bound_s if bound_s else 0.0,
        decoded / stats.decode_s if stats.decode_s else 0.0,
    )
