"""Which of the host's GPUs a CUDA process sees, and in what order: `CUDA_VISIBLE_DEVICES`, read as CUDA does.

NVML lists every GPU on the host; torch numbers only the ones this variable leaves, `cuda:0..n-1` in the
variable's order. The rules (CUDA Programming Guide, "CUDA Environment Variables", 5.2.1.1):

- unset: every GPU; set to an empty string: none.
- a comma-separated list of identifiers, enumerated in the list's order. Each is an integer index (NVML's
  order, as `nvidia-smi` numbers them; read like `strtoul`, so `1gpu` is `1`), a GPU UUID as `nvidia-smi -L`
  prints it (`GPU-8932f937-...`) or any prefix of one that names a single GPU, or a MIG device: its UUID
  (`MIG-<uuid>`, or a unique prefix) or the older `MIG-GPU-<gpu uuid>/<gpu instance>/<compute instance>`.
- an invalid identifier (negative, out of range, unknown or ambiguous UUID) ends the list: the devices
  before it stay visible, none after it (`0,2,-1,1` shows 0 and 2).
- a device named twice leaves no device visible (what torch's own parser mirrors,
  `torch.cuda._parse_visible_devices`: "Repeated ordinal results in empty set").

Pure functions of the value and the host's devices: no NVML, no `os.environ`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dflash_doctor.env.gpus import GpuDevice

VARIABLE = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class Visibility:
    """The devices CUDA enumerates (`visible[i]` is `cuda:i`) and, when the list ended early, why."""

    visible: tuple[GpuDevice, ...]
    problem: str | None = None  # "entry '7' is not a GPU of this host (0-3): the list ends there"


def strtoul_index(entry: str) -> int | None:
    """The integer a CUDA index entry starts with (`strtoul`: `1gpu` is 1), None when it starts with none
    or is negative."""
    digits = entry[1:] if entry[:1] == "+" else entry
    count = len(digits) - len(digits.lstrip("0123456789"))
    return int(digits[:count]) if count else None


def _by_prefix(entry: str, devices: Sequence[GpuDevice]) -> GpuDevice | str:
    """The one device whose UUID starts with `entry`, or why there is none."""
    matches = [d for d in devices if d.uuid and d.uuid.startswith(entry)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        return f"'{entry}' is the start of {len(matches)} GPUs' UUIDs (ambiguous)"
    return f"no GPU of this host has a UUID starting '{entry}'"


def _legacy_mig(entry: str, migs: Sequence[GpuDevice], host: Sequence[GpuDevice]) -> GpuDevice | str:
    """`MIG-GPU-<gpu uuid>/<gpu instance>/<compute instance>`: the MIG device by its parent and ids."""
    parent_text, _, ids = entry.removeprefix("MIG-").partition("/")
    parent = _by_prefix(parent_text, host)
    if isinstance(parent, str):
        return parent
    for mig in migs:
        if mig.mig is not None and mig.index == parent.index and f"{mig.mig[0]}/{mig.mig[1]}" == ids:
            return mig
    return f"GPU {parent.index} has no MIG device {ids} (gpu instance/compute instance)"


def _resolve(entry: str, host: Sequence[GpuDevice], migs: Sequence[GpuDevice]) -> GpuDevice | str:
    """One identifier of the list: the device it names, or why it is invalid."""
    if entry.startswith("MIG-GPU-"):
        return _legacy_mig(entry, migs, host)
    if entry.startswith("MIG-"):
        return _by_prefix(entry, migs)
    if entry.startswith("GPU-"):
        return _by_prefix(entry, host)
    index = strtoul_index(entry)
    if index is None:
        return f"'{entry}' is not an index, a GPU-… or a MIG-… UUID"
    if index >= len(host):
        return f"index {index} is not a GPU of this host ({_span(len(host))})"
    return host[index]


def _span(count: int) -> str:
    return "it has none" if count == 0 else f"0-{count - 1}" if count > 1 else "only 0"


def resolve_visible(
    value: str | None, host: Sequence[GpuDevice], migs: Sequence[GpuDevice] = ()
) -> Visibility:
    """The devices a CUDA process started with `CUDA_VISIBLE_DEVICES=value` sees, in its order.

    `host`: NVML's GPUs in NVML's order; `migs`: the MIG devices of MIG-enabled GPUs (only a MIG identifier
    makes one visible; unset shows the physical GPUs, as NVML lists them).
    """
    if value is None:
        return Visibility(tuple(host))
    if not value.strip():
        return Visibility((), "it is set but empty: CUDA sees no GPU")
    visible: list[GpuDevice] = []
    for raw in value.split(","):
        entry = raw.strip()
        found = _resolve(entry, host, migs)
        if isinstance(found, str):
            return Visibility(tuple(visible), f"{found}: CUDA stops reading the list there")
        if any(seen is found for seen in visible):
            return Visibility((), f"'{entry}' names a GPU already in the list: CUDA then sees no GPU")
        visible.append(found)
    return Visibility(tuple(visible))
