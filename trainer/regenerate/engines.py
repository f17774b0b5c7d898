"""Which engine answers `data regenerate`, on which devices: vLLM where asked for (or installed), else ours
(the KV engine for the targets it knows, `generate` for the rest), one process per device when there are
several."""

from __future__ import annotations

import multiprocessing as mp
import queue
from collections.abc import Callable, Sequence
from typing import Any

from trainer.engine.support import kv_engine_reason
from trainer.engine.target import Chat
from trainer.regenerate.generate_engine import TorchEngine
from trainer.regenerate.kv_engine import KVEngine
from trainer.regenerate.settings import Completion, GenerationSettings
from trainer.regenerate.vllm_engine import VllmEngine, vllm_available


def torch_engine(settings: GenerationSettings, device: str, batch_size: int | None) -> Any:
    """The torch engine for one device: the KV engine where the target is one it knows, else `generate`'s
    (its batch: `batch_size`, or 128 on a GPU and 8 on a CPU, the best measured on an H200 at Qwen3-8B shapes)."""
    if kv_engine_reason(settings.target) is None:
        return KVEngine(settings, device, slots=batch_size)
    default = 8 if device == "cpu" else 128
    return TorchEngine(settings, device, batch_size or default)


def _worker(
    settings: GenerationSettings, device: str, batch_size: int | None, jobs: Any, results: Any
) -> None:
    """One process per device: load the target once, answer jobs until told to stop (None)."""
    try:
        engine = torch_engine(settings, device, batch_size)
    except Exception as exc:  # reported to the parent, which raises it
        results.put(("error", repr(exc)))
        return
    results.put(("ready", device))
    engine.on_tokens = _forwarded_tokens(results)
    while True:
        job = jobs.get()
        if job is None:
            return
        key, chats, keys = job
        try:
            results.put(
                ("done", key, engine.generate(chats, keys) if keys is not None else engine.generate(chats))
            )
        except Exception as exc:
            results.put(("error", repr(exc)))
            return


# A device process passes its token counts to the parent at most this often (a message per step would be
# thousands a second from the `generate` engine's steps).
TOKENS_EVERY_S = 0.5


def _forwarded_tokens(results: Any) -> Callable[[int], None]:
    """An engine's `on_tokens` in a device process: the counts summed, sent as ("tokens", n) every TOKENS_EVERY_S."""
    import time

    pending, last = [0], [time.monotonic()]

    def tell(count: int) -> None:
        pending[0] += count
        if time.monotonic() - last[0] >= TOKENS_EVERY_S:
            results.put(("tokens", pending[0]))
            pending[0], last[0] = 0, time.monotonic()

    return tell


class DevicePool:
    """TorchEngine on several devices at once, one process each; a call's chats are split across them."""

    name = "torch"

    def __init__(self, settings: GenerationSettings, devices: list[str], batch_size: int | None = 8) -> None:
        ctx = mp.get_context("spawn")  # CUDA cannot be used in a forked child
        self.on_tokens: Callable[[int], None] | None = None  # the device processes' counts, passed on
        self.results: Any = ctx.Queue()
        self.jobs: list[Any] = []
        self.procs: list[Any] = []
        for device in devices:
            jobs = ctx.Queue()
            proc = ctx.Process(
                target=_worker, args=(settings, device, batch_size, jobs, self.results), daemon=True
            )
            proc.start()
            self.jobs.append(jobs)
            self.procs.append(proc)
        for _ in devices:
            self._receive("ready")
        on_gpus = all(d.startswith("cuda") for d in devices)
        # a call's chats go to every device; the KV engine's time follows its rows (batch_size None)
        self.rows_at_once = batch_size * len(devices) if on_gpus and batch_size else 1
        # CPU processes: one fill of each one's rows first, as a single CPU engine's (about a minute)
        self.first_chunk = None if on_gpus else (batch_size or 8) * len(devices)

    def _receive(self, kind: str) -> tuple[Any, ...]:
        while True:
            try:
                message = self.results.get(timeout=5.0)
            except queue.Empty:
                dead = [p for p in self.procs if not p.is_alive()]
                if dead:
                    raise RuntimeError(f"a generation worker died (exit code {dead[0].exitcode})") from None
                continue
            if message[0] == "error":
                raise RuntimeError(f"a generation worker failed: {message[1]}")
            if message[0] == "tokens":
                if self.on_tokens is not None:
                    self.on_tokens(int(message[1]))
                continue
            if message[0] == kind:
                return tuple(message)

    def generate(self, chats: Sequence[Chat], keys: Sequence[int] | None = None) -> list[Completion]:
        shards = [list(range(i, len(chats), len(self.jobs))) for i in range(len(self.jobs))]
        sent = 0
        for key, (jobs, shard) in enumerate(zip(self.jobs, shards, strict=True)):
            if shard:
                shard_keys = [keys[i] for i in shard] if keys is not None else None
                jobs.put((key, [chats[i] for i in shard], shard_keys))
                sent += 1
        out: dict[int, Completion] = {}
        for _ in range(sent):
            _, key, completions = self._receive("done")
            out.update(zip(shards[key], completions, strict=True))
        return [out[i] for i in range(len(chats))]

    def close(self) -> None:
        for jobs in self.jobs:
            jobs.put(None)
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()


def local_devices(devices: str | None) -> list[str]:
    """`--devices` as a list (default: every local GPU, else the CPU). A list with no device, a device that
    is not `cpu` / `cuda:N`, or a GPU this torch cannot see: one DoctorError naming `--devices`, before the
    target loads (was: a KeyError, or an AssertionError from a CPU build of torch)."""
    import torch

    from dflash_base.errors import ConfigError

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if devices is None:
        return [f"cuda:{i}" for i in range(count)] or ["cpu"]
    chosen = [d.strip() for d in devices.split(",") if d.strip()]
    if not chosen:
        raise ConfigError(
            f"--devices: {devices!r} names no device", hint="e.g. --devices cuda:0,cuda:1 or cpu"
        )
    for device in chosen:
        if chosen.count(device) > 1 or (device == "cuda" and "cuda:0" in chosen):  # N14: `cpu,cpu`
            raise ConfigError(
                f"--devices: {device} is named twice in {devices!r}: each device runs one copy of the target",
                hint="name each device once",
            )
    for device in chosen:
        kind, _, index = device.partition(":")
        if device == "cpu":
            continue
        if kind != "cuda" or (index and not index.isdigit()):
            raise ConfigError(f"--devices: {device!r} is not a device", hint="give cpu, cuda or cuda:N")
        if int(index or 0) >= count:
            seen = f"{count} GPU(s)" if count else "no GPU (a CPU build of torch, or no driver)"
            raise ConfigError(f"--devices: {device} is not here: this torch sees {seen}")
    return chosen


def engine_factory(
    engine: str,
    settings: GenerationSettings,
    devices: list[str],
    batch_size: int | None,
    tensor_parallel: int,
) -> Any:
    """What makes the engine (called once there is work): vLLM for `vllm` (or `auto` where it is
    installed), else ours, one process per device when there are several. Refused here, before the target
    loads: vLLM asked for and absent, --tensor-parallel for our engine (it would be ignored)."""
    from dflash_base.errors import DoctorError

    if engine == "vllm" or (engine == "auto" and vllm_available()):
        if not vllm_available():
            raise DoctorError(
                "--engine vllm: vLLM is not installed here", hint="pip install vllm, or --engine torch"
            )
        return lambda: VllmEngine(settings, tensor_parallel_size=tensor_parallel)
    if tensor_parallel > 1:
        raise DoctorError(
            f"--tensor-parallel {tensor_parallel}: the torch engine does not split a model across GPUs "
            "(vLLM is not installed here)",
            hint="leave it out (one copy of the target per device in --devices), or install vllm",
        )
    why = kv_engine_reason(settings.target) if settings.temperature > 0 else None
    if why is not None:  # transformers' generate draws from one generator: batch and order change answers
        raise DoctorError(
            f"--engine {engine} --temperature {settings.temperature}: the torch engine for this target is "
            f"transformers' generate ({why}), whose sampled answers are not reproducible from (seed, prompt, "
            "sample)",
            hint="use --engine vllm (each answer seeded by its key), a target the KV engine supports "
            "(llama, qwen2, qwen3, mistral), or --temperature 0",
        )
    if len(devices) == 1:
        return lambda: torch_engine(settings, devices[0], batch_size)
    return lambda: DevicePool(settings, devices, batch_size)
