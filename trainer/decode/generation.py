"""Engines that answer a batch of chats with the target: our own (transformers' `generate` on local devices)
and vLLM's `LLM.chat` when vLLM is installed. Both take chats and give back text, so the file they feed is the
same whichever ran.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Chat = list[dict[str, str]]

# Prompt widths are rounded up to this many tokens under a static cache (one compiled shape per bucket).
WIDTH_BUCKET = 256
# Up to this batch size a static cache (compiled decode step) beats eager decoding on an H200.
STATIC_CACHE_MAX_BATCH = 64


@dataclass(frozen=True)
class GenerationSettings:
    """What decides the answers: recorded in every output line, compared on resume."""

    target: str
    max_new_tokens: int = 1024
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    dtype: str = "auto"  # target.dtype: auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp16 | fp32

    def to_json(self) -> dict[str, Any]:
        """`dtype` is written only when not auto, so that outputs written before it was recorded resume."""
        return {
            "target": self.target,
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "chat_template_kwargs": dict(self.chat_template_kwargs),
            "seed": self.seed,
        } | ({"dtype": self.dtype} if self.dtype != "auto" else {})


@dataclass(frozen=True)
class Completion:
    text: str
    tokens: int  # generated tokens, the end-of-turn token included when there was one
    finish_reason: str  # "stop" (the model ended its turn) or "length" (max_new_tokens reached)
    # the ids the engine wrote, up to its end-of-turn token: for comparing engines token by token (the text alone
    # can tokenise back differently); not part of equality, which stays the answer's text and ending
    token_ids: tuple[int, ...] = field(default=(), compare=False)


class Engine(Protocol):
    name: str
    # Rows decoded at once on a GPU, where a batch costs about the same however full it is (the commit pace
    # counts whole batches there); 1 where time follows the rows (a CPU) or is unknown (vLLM schedules its own)
    rows_at_once: int

    # keys: one per chat when sampling (trainer.decode.sampling.row_key); greedy engines may ignore them
    def generate(self, chats: Sequence[Chat], keys: Sequence[int] | None = None) -> list[Completion]: ...

    def close(self) -> None: ...


@runtime_checkable
class CountsTokens(Protocol):
    """An engine that counts its tokens as it makes them: `on_tokens` (None until the caller sets it) is told
    the tokens made since its last call, so progress moves while a call runs (the KV engine every SYNC_EVERY
    steps, `generate` every step, a device pool every TOKENS_EVERY_S); vLLM's engine has none."""

    on_tokens: Callable[[int], None] | None


# ---------------------------------------------------------------- our own engine


def prompt_ids(tokenizer: Any, chat: Chat, template_kwargs: dict[str, Any]) -> list[int]:
    """The chat rendered by the target's own template, ending in the assistant's header."""
    out = tokenizer.apply_chat_template(chat, tokenize=True, add_generation_prompt=True, **template_kwargs)
    if hasattr(out, "keys"):  # newer transformers return a BatchEncoding
        out = out["input_ids"]
    return list(out)


def stop_token_ids(tokenizer: Any, model_config: Any) -> list[int]:
    """Where an answer ends: the model's generation config's eos ids, else the tokenizer's eos token."""
    ids: list[int] = []
    generation_config = getattr(model_config, "eos_token_id", None)
    for value in (generation_config, getattr(tokenizer, "eos_token_id", None)):
        if isinstance(value, int):
            ids.append(value)
        elif isinstance(value, list | tuple):
            ids += [v for v in value if isinstance(v, int)]
    return sorted(set(ids))


class TorchEngine:
    """Batched generation with the target on one device: chats sorted by length (less padding), left-padded,
    KV cache, greedy or sampled (transformers' `generate`)."""

    name = "torch"

    def __init__(self, settings: GenerationSettings, device: str = "cpu", batch_size: int = 8) -> None:
        import torch

        self.settings, self.batch_size = settings, batch_size
        self.device = torch.device(device)
        self.model, self.tokenizer = load_generation_target(settings.target, self.device, settings.dtype)
        self.stop_ids = stop_token_ids(self.tokenizer, self.model.generation_config)
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if isinstance(pad, int) else (self.stop_ids[0] if self.stop_ids else 0)
        self.calls = 0
        self.rows_at_once = batch_size if self.device.type == "cuda" else 1
        # On a CPU one batch is the first commit (about a minute at 8 rows, not 64 conversations' ~9 minutes).
        self.first_chunk = batch_size if self.device.type == "cpu" else None
        self.on_tokens: Callable[[int], None] | None = None
        # Small batches on a GPU are bound by Python and kernel launches: a static cache lets `generate` replay
        # one compiled step per token instead (H200, Qwen3-8B shapes: 34 -> 126 tok/s at batch 1, 409 -> 1235 at
        # 16, 1642 -> 2145 at 64). From 128 rows eager decoding is faster (3048 vs 2475 tok/s): the compiled
        # step attends over the whole preallocated cache. bench/decode/regenerate_throughput.py measures both.
        self.static_cache = self.device.type == "cuda" and batch_size <= STATIC_CACHE_MAX_BATCH
        if self.static_cache:
            import torch._dynamo

            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)

    def generate(self, chats: Sequence[Chat], keys: Sequence[int] | None = None) -> list[Completion]:
        if keys is not None and self.settings.temperature > 0:  # engine_factory refuses this up front
            raise ValueError("transformers' generate cannot draw an answer from its own key")
        encoded = [prompt_ids(self.tokenizer, c, self.settings.chat_template_kwargs) for c in chats]
        order = sorted(range(len(chats)), key=lambda i: len(encoded[i]))
        results: dict[int, Completion] = {}
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            for i, completion in zip(batch, self._generate_batch([encoded[i] for i in batch]), strict=True):
                results[i] = completion
        return [results[i] for i in range(len(chats))]

    def _generate_batch(self, prompts: list[list[int]]) -> list[Completion]:
        self.calls += 1
        rows = generate_token_batch(
            self.model,
            prompts,
            self.settings,
            self.pad_id,
            self.stop_ids,
            seed=self.settings.seed + self.calls,
            static_cache=self.static_cache,
            on_tokens=self.on_tokens,
        )
        return [self._completion(row) for row in rows]

    def _completion(self, new_ids: list[int]) -> Completion:
        ended = next((i for i, t in enumerate(new_ids) if t in self.stop_ids), None)
        kept = new_ids if ended is None else new_ids[:ended]
        text = self.tokenizer.decode(kept, skip_special_tokens=True)
        tokens = len(kept) + (0 if ended is None else 1)
        written = tuple(new_ids if ended is None else new_ids[: ended + 1])
        return Completion(text, tokens, "length" if ended is None else "stop", written)

    def close(self) -> None:
        pass


def load_generation_target(path: str, device: Any, dtype: str = "auto") -> tuple[Any, Any]:
    """(causal LM with its head, tokenizer) from a local folder, in the dtype policy training uses
    (`target.dtype`; auto: bf16 on CUDA, fp32 on CPU)."""
    from dflash_base.errors import ConfigError
    from trainer.model.device import target_dtype
    from trainer.spec.target_shapes import is_embedded
    from trainer.target_model.load import load_target_model
    from trainer.target_model.tokenizer import load_tokenizer

    if is_embedded(path):
        raise ConfigError(
            f'target.path: "{path}" has no tokenizer or chat template; regeneration needs a target folder'
        )
    tokenizer = load_tokenizer(path)
    if getattr(tokenizer, "chat_template", None) is None:
        raise ConfigError(f"target.path: {path}: the tokenizer has no chat template")
    model = load_target_model(path, 0, device, target_dtype(dtype, device))
    return model.eval(), tokenizer


def generate_token_batch(
    model: Any,
    prompts: list[list[int]],
    settings: GenerationSettings,
    pad_id: int,
    stop_ids: list[int],
    seed: int,
    static_cache: bool = False,
    on_tokens: Callable[[int], None] | None = None,
) -> list[list[int]]:
    """New token ids for each prompt (left-padded into one batch; KV cache; greedy when temperature is 0).
    Rows that stop early are padded after their stop token, which the caller cuts at.

    `static_cache`: a preallocated cache, which transformers' `generate` pairs with a compiled decode step
    (CUDA graphs) on a GPU; the padded width is rounded up to a multiple of WIDTH_BUCKET so that a job's
    batches share a few compiled shapes instead of compiling one per batch.

    `on_tokens(n)`: after each decode step, the rows that made a token in it (`TokenCounter`).
    """
    import torch

    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    if static_cache:
        width = -(-width // WIDTH_BUCKET) * WIDTH_BUCKET
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):  # left padding: every row's last prompt token is in the same column
        ids[row, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        attention[row, width - len(p) :] = 1
    sample = settings.temperature > 0
    torch.manual_seed(seed)
    extra: dict[str, Any] = {"cache_implementation": "static"} if static_cache else {}
    if on_tokens is not None:
        from transformers import StoppingCriteriaList

        extra["stopping_criteria"] = StoppingCriteriaList([TokenCounter(on_tokens, width, stop_ids, device)])
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=attention.to(device),
            max_new_tokens=settings.max_new_tokens,
            do_sample=sample,
            temperature=settings.temperature if sample else None,
            top_p=settings.top_p if sample else None,
            top_k=None,
            eos_token_id=stop_ids or None,
            pad_token_id=pad_id,
            **extra,
        )
    return [row[width:].tolist() for row in out.cpu()]


class TokenCounter:
    """A stopping criterion that never stops: it tells `on_tokens` how many rows made a token each step.

    On a CPU it reads the step's last column (host memory: free) and stops counting a row after its stop token.
    On a GPU that read would be a host sync per step, so it counts every row until the batch ends: an upper
    bound by the padding after the rows that stopped, corrected when the batch's answers are committed."""

    def __init__(
        self, on_tokens: Callable[[int], None], width: int, stop_ids: list[int], device: Any
    ) -> None:
        self.on_tokens, self.width, self.stops = on_tokens, width, set(stop_ids)
        self.exact = getattr(device, "type", "cpu") == "cpu"
        self.ended: list[bool] = []

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        rows = int(input_ids.shape[0])
        if input_ids.shape[1] > self.width:  # the call after the prefill's first token, and each step's
            if self.exact:
                last = input_ids[:, -1].tolist()
                self.ended = self.ended or [False] * rows
                made = sum(1 for row in range(rows) if not self.ended[row])
                self.ended = [e or t in self.stops for e, t in zip(self.ended, last, strict=True)]
            else:
                made = rows
            if made:
                self.on_tokens(made)
        return torch.zeros(rows, dtype=torch.bool, device=input_ids.device)


def _worker(
    settings: GenerationSettings, device: str, batch_size: int | None, jobs: Any, results: Any
) -> None:
    """One process per device: load the target once, answer jobs until told to stop (None)."""
    from trainer.decode.kv_engine import torch_engine

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


# ---------------------------------------------------------------- vLLM


class VllmEngine:
    """vLLM's offline `LLM.chat`: the engine most people already regenerate with (tensor parallel as asked)."""

    name = "vllm"

    def __init__(self, settings: GenerationSettings, tensor_parallel_size: int = 1) -> None:
        import vllm

        self.settings = settings
        self.sampling = vllm.SamplingParams(
            temperature=settings.temperature,
            top_p=settings.top_p,
            max_tokens=settings.max_new_tokens,
            seed=settings.seed,
        )
        self.llm = vllm.LLM(model=settings.target, tensor_parallel_size=tensor_parallel_size)
        self.rows_at_once = 1  # vLLM batches continuously, up to limits of its own: the pace counts rows

    def generate(self, chats: Sequence[Chat], keys: Sequence[int] | None = None) -> list[Completion]:
        sampling: Any = self.sampling
        if keys is not None and self.settings.temperature > 0:  # vLLM's per-request seed: each answer's key
            sampling = [self._seeded(key) for key in keys]
        outputs = self.llm.chat(
            list(chats),
            sampling_params=sampling,
            chat_template_kwargs=dict(self.settings.chat_template_kwargs),
            use_tqdm=False,
        )
        completions = []
        for request in outputs:
            best = request.outputs[0]
            reason = "stop" if best.finish_reason == "stop" else "length"
            completions.append(Completion(best.text, len(best.token_ids), reason, tuple(best.token_ids)))
        return completions

    def _seeded(self, key: int) -> Any:
        import vllm

        s = self.settings
        return vllm.SamplingParams(
            temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_new_tokens, seed=key
        )

    def close(self) -> None:
        pass


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


# ---------------------------------------------------------------- which engine, on which devices


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
    from trainer.decode.kv_engine import kv_engine_reason, torch_engine

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
