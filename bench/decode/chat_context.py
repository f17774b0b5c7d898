"""Issue 38, Q1, on a tiny Qwen3-template chat pipeline on CPU: the run's held-out estimate against `eval`'s
real decoding, with the code before and after "each answer trained in its generation context".

Everything goes through the CLI, so an older checkout (`--before`, e.g. `git archive 23dabad~1`, the commit
before the Q1 fix) runs exactly the commands this one does:

1. a target folder: the tiny random Qwen3 target with an ASCII byte-level tokenizer (filled to 512 ids) and
   Qwen3's published chat template (`tests/trainer/data/templates/qwen3.jinja`); or, with `--target FOLDER`,
   a real HF target whose template writes ChatML's markers (SmolLM2-135M-Instruct: `examples/smollm2/prepare.py`)
   with Qwen3's template swapped in: its answers depend on their context (for it `<think>` is plain text);
2. `--conversations` prompts of `--turns` user turns -> `data regenerate --engine torch` (greedy), with this
   checkout (random words for the tiny target, short English questions and follow-ups for a real one);
3. per checkout: `train` (held-out data) then `eval --dtype fp32 --strict --json` on the held-out
   conversations; the estimate (`summary.json`'s `heldout_accept_len`) against eval's tau, and, from a checkout
   that keeps it, the walk over each held-out conversation's last answer (`heldout_accept_len_last_answer`: the
   answers eval decodes, so Q7's difference is out of that comparison).

    .venv/bin/python -m bench.decode.chat_context --before .tmp/before [--kwargs '{"enable_thinking": false}']
    python -m bench.decode.chat_context --before .tmp/before --target /tmp/smol/target --tag smollm2 \
        --conversations 80 --max-new-tokens 48 --steps 300   # the real-target extra installed

Prints a table, writes bench/results/chat_context[-TAG].json (and each eval report in the work folder, for
`bench/decode/estimate_vs_eval.py` to walk the same conversations).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.lib.roles import RESULTS, print_rows, write_result

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "tests" / "trainer" / "data" / "templates" / "qwen3.jinja"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
COLUMNS = ("code", "kwargs", "heldout_estimate", "heldout_last_answer", "eval_tau", "estimate_vs_eval",
           "last_answer_vs_eval", "identical", "train_s")  # fmt: skip


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what the ByteLevel pre-tokenizer writes for each byte)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = dict(zip(printable, printable, strict=True)), 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = 256 + extra, extra + 1
    return {b: chr(c) for b, c in chars.items()}


def make_target(folder: Path) -> None:
    """The tiny target and a byte-level tokenizer of the 128 ASCII bytes, the chat's special tokens and
    fillers up to the target's 512 rows: every id the random target writes decodes to text that tokenises
    back to that id (a lone byte >= 0x80 would decode to U+FFFD, three other tokens)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from trainer.target_model.tiny import build_embedded_target

    model = build_embedded_target("tiny", 0, torch.device("cpu"))
    chars = _byte_chars()
    tok = Tokenizer(models.BPE(vocab={chars[b]: b for b in range(128)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=TEMPLATE.read_text(),
    )
    fast.add_special_tokens({"additional_special_tokens": SPECIAL})
    fast.add_tokens([f"<|f{i}|>" for i in range(model.config.vocab_size - len(fast))])
    assert len(fast) == model.config.vocab_size
    eos = fast.convert_tokens_to_ids("<|im_end|>")
    model.config.eos_token_id = model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = fast.pad_token_id
    model.save_pretrained(folder)
    fast.save_pretrained(folder)


def use_target(source: Path, folder: Path) -> None:
    """A copy of a real HF target folder (weights linked, not copied) with Qwen3's published template in
    place of its own: `chat_template.jinja` written and any `chat_template` in `tokenizer_config.json` set
    to the same text. The template's markers must be the target's special tokens (ChatML's)."""
    folder.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file() and item.suffix == ".safetensors":
            (folder / item.name).unlink(missing_ok=True)
            (folder / item.name).symlink_to(item.resolve())
        elif item.is_file():
            shutil.copy2(item, folder / item.name)
    template = TEMPLATE.read_text()
    (folder / "chat_template.jinja").write_text(template)
    config = folder / "tokenizer_config.json"
    tokenizer = json.loads(config.read_text())
    if "chat_template" in tokenizer:
        tokenizer["chat_template"] = template
        config.write_text(json.dumps(tokenizer, indent=2))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.chat_template == template, "the folder's tokenizer does not load Qwen3's template"
    for marker in ("<|im_start|>", "<|im_end|>"):
        assert len(tok.encode(marker, add_special_tokens=False)) == 1, f"{marker} is not one token here"


TOPICS = [
    "the moon", "volcanoes", "honey bees", "the Roman Empire", "photosynthesis", "the Pacific Ocean",
    "chess", "coffee", "the piano", "glaciers", "Mount Everest", "owls", "bread", "electric cars",
    "the Sahara", "tea", "whales", "the internet", "rainbows", "penguins", "Jupiter", "tomatoes",
    "the Nile", "earthquakes", "bicycles", "libraries", "lightning", "octopuses", "the violin", "deserts",
    "rice", "castles", "the heart", "comets", "maps", "sharks", "autumn", "trains", "cheese", "forests",
]  # fmt: skip
FIRST = ["Tell me one fact about {}.", "What is special about {}?", "Describe {} briefly."]
FOLLOW = [
    "Why is that?", "Say that again in fewer words.", "Give me another example.", "Can you explain it to a child?",
    "What is a common mistake people make about it?", "Say more.",
]  # fmt: skip


def first_turns(path: Path, count: int, seed: int) -> list[str]:
    """`count` distinct first user turns drawn (seeded) from a prompt set (`{"messages": [...]}` or
    `{"prompt": ...}` lines: examples/smollm2/prepare.py's 60,374): a stronger drafter's run needs more distinct
    conversations than TOPICS' 120 first questions, or held-out conversations repeat trained ones."""
    texts: list[str] = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        users = [m["content"] for m in record.get("messages", []) if m.get("role") == "user"]
        text = users[0] if users else record.get("prompt")
        if isinstance(text, str) and text.strip():
            texts.append(text)
    unique = sorted(set(texts))
    if len(unique) < count:
        raise SystemExit(
            f"--first-prompts {path}: {len(unique)} distinct prompts, fewer than --conversations {count}"
        )
    return random.Random(seed).sample(unique, count)


def make_prompts(
    path: Path, count: int, seed: int, turns: int = 3, natural: bool = False, firsts: list[str] | None = None
) -> None:
    """Conversations of `turns` user turns (answers regenerated after each): 3 short random words each for
    the tiny target; for a real one (`natural`) a question on a topic (or the given `firsts`), then follow-ups
    that refer back to the earlier answers (so what the target writes depends on its context)."""
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghij") for _ in range(3)) for _ in range(40)]
    lines = []
    for j in range(count):
        messages: list[dict[str, str]] = []
        for turn in range(turns):
            if not natural:
                text = " ".join(rng.choice(words) for _ in range(3))
            elif turn == 0 and firsts is not None:
                text = firsts[j]
            elif turn == 0:
                text = rng.choice(FIRST).format(TOPICS[j % len(TOPICS)])
            else:
                text = rng.choice(FOLLOW)
            messages += [{"role": "user", "content": text}, {"role": "assistant", "content": ""}]
        lines.append(json.dumps({"id": f"c{j}", "messages": messages}))
    path.write_text("\n".join(lines) + "\n")


def write_config(
    path: Path,
    target: Path,
    data: Path,
    out: Path,
    kwargs: dict[str, Any],
    steps: int,
    args: argparse.Namespace,
) -> None:
    kw = ", ".join(f"{k} = {json.dumps(v)}" for k, v in kwargs.items())
    mask = "mask_token_id = 511\n" if args.target is None else ""  # a real target's: the trainer's choice
    path.write_text(
        f"""[target]
path = {json.dumps(str(target))}

[drafter]
layers = {args.layers}
block_size = {args.block_size}
{mask}
[data]
kind = "chat"
path = {json.dumps(str(data))}
seq_len = {args.seq_len}
eval_fraction = {args.eval_fraction}
chat_template_kwargs = {{ {kw} }}

[eval]
every = 0

[topology]
mode = "colocated"

[optim]
lr = {args.lr}
steps = {steps}
batch_size = {args.batch_size}
anchors = {args.anchors}

[checkpoint]
every = 0

[output]
dir = {json.dumps(str(out))}

[run]
seed = 0
device = "{args.device}"
log_every = {args.log_every}
timeout_s = {args.timeout_s}
"""
    )


def checkout_env(checkout: Path, threads: int) -> dict[str, str]:
    """The environment that runs `checkout`'s code: its folder first on the path, then what the caller had (a
    device machine's carried wheels live there)."""
    path = os.pathsep.join(p for p in (str(checkout), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": str(threads), "COLUMNS": "200"}


def cli(checkout: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m dflash_doctor ARGS` with `checkout`'s code (its folder first on the path)."""
    env = checkout_env(checkout, threads=2)
    # `-m` runs with the working directory first on the path, then PYTHONPATH: `checkout`'s code either way,
    # never an editable install's
    proc = subprocess.run(
        [sys.executable, "-m", "dflash_doctor", *args], cwd=checkout, env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(args[:2])} ({checkout}) exit {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}"
        )
    return proc


def measure(
    code: str, checkout: Path, work: Path, target: Path, data: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """Train and eval with one checkout on the same data; the estimate against eval's decoding."""
    kwargs = json.loads(args.kwargs)
    config, out = work / f"{code}.toml", work / f"run-{code}"
    write_config(config, target, data, out, kwargs, args.steps, args)
    began = time.monotonic()
    trained = cli(checkout, "train", "--config", str(config), "--no-deep")
    train_s = time.monotonic() - began
    said = [line for line in (trained.stdout + trained.stderr).splitlines() if "are not supervised" in line]
    summary = json.loads((out / "summary.json").read_text())
    decode = ["--export", str(out / "export"), "--config", str(config), "--max-new-tokens",
              str(args.max_new_tokens), *eval_precision(args.device), "--no-baseline"]  # fmt: skip
    began = time.monotonic()
    if args.eval_shards > 1:
        report = sharded_eval(checkout, work, code, config, decode, args)
    else:
        evaluated = cli(checkout, "eval", *decode, "--num-prompts", str(args.eval_prompts), "--json")
        report = json.loads(evaluated.stdout)
        (work / f"eval-{code}.json").write_text(evaluated.stdout)  # for bench/decode/estimate_vs_eval.py
    eval_s = time.monotonic() - began
    estimate, tau = summary["heldout_accept_len"], report["mean_accept_len"]
    last = summary.get("heldout_accept_len_last_answer")  # None from a checkout that did not keep it yet
    return {
        "code": code, "checkout": str(checkout), "kwargs": args.kwargs, "heldout_estimate": round(estimate, 3),
        "eval_tau": round(tau, 3), "estimate_vs_eval": f"{100 * (estimate / tau - 1):+.1f}%",
        "heldout_last_answer": round(last, 3) if last is not None else None,
        "last_answer_vs_eval": f"{100 * (last / tau - 1):+.1f}%" if last is not None else None,
        "identical": report["identical"], "train_s": round(train_s, 1), "eval_s": round(eval_s, 1), "eval_prompts": report["prompts"],
        "eval_new_tokens": report["new_tokens"], "final_loss": summary.get("final_loss"),
        "heldout_sequences": summary.get("heldout_sequences"), "train_warning": said[0].strip() if said else None,
    }  # fmt: skip


def sharded_eval(
    checkout: Path, work: Path, code: str, config: Path, decode: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """`eval` of the held-out conversations in `--eval-shards` processes at once on one device.

    At batch 1 one process leaves a GPU mostly idle: S18's H200 took ~7 minutes for 100 prompts. The prompts
    are written once, by this checkout's bench/decode/heldout_prompts.py (the same records `eval` takes by
    default), so both checkouts decode the same conversations; tau merges exactly (tokens / forwards).
    """
    prompts = work / "heldout-prompts.jsonl"
    if not prompts.is_file():
        subprocess.run(
            [sys.executable, "-m", "bench.decode.heldout_prompts", "--config", str(config),
             "--count", str(args.eval_prompts), "--out", str(prompts)],
            cwd=REPO, check=True, capture_output=True, text=True,
        )  # fmt: skip
    count = sum(1 for line in prompts.read_text().splitlines() if line.strip())
    shards = max(1, min(args.eval_shards, count))  # no shard without a prompt (eval refuses an empty file)
    result = work / f"eval-{code}.json"  # every shard's report and the merge, for estimate_vs_eval.py
    # eval_shards.py by its path, not `-m` from `checkout`: this checkout's driver (standard library only) over
    # that checkout's `eval`, which may be older than the driver
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "decode" / "eval_shards.py"), "--shards", str(shards),
         "--prompts", str(prompts), "--out", str(result), "--", *decode],
        cwd=checkout, env=checkout_env(checkout, threads=1),
        capture_output=True, text=True,
    )  # fmt: skip
    document = json.loads(result.read_text()) if result.is_file() else {}
    if proc.returncode != 0 or "merged" not in document:
        raise SystemExit(
            f"sharded eval ({checkout}) exit {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}"
        )
    merged = document["merged"]
    return {
        **merged,
        "identical": merged["identical_prompts"] == merged["prompts"],
        "seconds": document["seconds"],
    }


def eval_precision(device: str) -> list[str]:
    """fp32 and bitwise on a CPU; bf16 on a GPU (a stronger drafter's run, issue 38), near-ties classified."""
    return ["--dtype", "fp32", "--strict"] if device == "cpu" else ["--dtype", "bf16"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="a checkout of the code to compare with (run first)")
    parser.add_argument("--kwargs", default="{}", help="data.chat_template_kwargs as JSON")
    parser.add_argument(
        "--target", type=Path, help="a real HF target folder (ChatML markers) to use with Qwen3's template"
    )
    parser.add_argument("--conversations", type=int, default=80)
    parser.add_argument(
        "--first-prompts",
        type=Path,
        help="a prompt set (JSONL) whose first user turns open the conversations",
    )
    parser.add_argument("--turns", type=int, default=3, help="user turns a conversation")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--eval-prompts", type=int, default=20)
    parser.add_argument("--eval-fraction", type=float, default=0.25)
    parser.add_argument(
        "--eval-shards",
        type=int,
        default=1,
        help="eval processes at once (a GPU: 16 decode in ~1/10 the time)",
    )
    parser.add_argument("--layers", type=int, default=1, help="drafter layers")
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=320)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--anchors", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--timeout-s", type=int, default=600, help="run.timeout_s of each train")
    parser.add_argument("--regenerate-batch", type=int, help="data regenerate --batch-size")
    parser.add_argument("--work", type=Path, default=REPO / ".tmp" / "chat_context")
    parser.add_argument("--tag", default="")
    parser.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="run.device of every train (cuda: a GPU's run)",
    )
    args = parser.parse_args(argv)
    json.loads(args.kwargs)  # fail here, not after the regenerate
    if args.first_prompts is not None and args.target is None:
        parser.error("--first-prompts: needs --target (the tiny target's conversations are random words)")
    if args.first_prompts is not None and not args.first_prompts.is_file():
        parser.error(f"--first-prompts {args.first_prompts}: no such file")
    if args.target is not None and not (args.target / "config.json").is_file():
        parser.error(f"--target {args.target}: no config.json there (examples/smollm2/prepare.py makes one)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = args.work / (args.tag or "default")
    work.mkdir(parents=True, exist_ok=True)
    target, prompts, data = work / "target", work / "prompts.jsonl", work / "data.jsonl"
    if args.target is not None:
        use_target(args.target, target)
    elif not (target / "config.json").is_file():
        make_target(target)
    firsts = None if args.first_prompts is None else first_turns(args.first_prompts, args.conversations, 0)
    make_prompts(prompts, args.conversations, 0, args.turns, natural=args.target is not None, firsts=firsts)
    regen_config = work / "regenerate.toml"
    write_config(regen_config, target, data, work / "unused", json.loads(args.kwargs), 1, args)
    batch = [] if args.regenerate_batch is None else ["--batch-size", str(args.regenerate_batch)]
    if not data.is_file():
        cli(REPO, "data", "regenerate", "--config", str(regen_config), "--prompts", str(prompts), "--out",
            str(data), "--engine", "torch", "--max-new-tokens", str(args.max_new_tokens), *batch)  # fmt: skip
    preview = json.loads(cli(REPO, "data", "preview", "--config", str(regen_config), "--json").stdout)
    rows = []
    if args.before is not None:
        rows.append(measure("before", args.before.resolve(), work, target, data, args))
    rows.append(measure("after", REPO, work, target, data, args))
    print_rows(
        f"held-out estimate against eval, {args.target or 'tiny'} Qwen3-template chats, kwargs {args.kwargs}",
        COLUMNS,
        rows,
    )
    name = f"chat_context{'-' + args.tag if args.tag else ''}.json"
    result = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "preview_counts": preview.get("counts"),
        "rows": rows,
    }
    print(f"wrote {write_result(RESULTS / name, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
