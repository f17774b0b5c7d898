"""Small inputs on the tiny target that the bad-input tests of several folders share: a run.toml, a chat file,
JSON's spelling of a lone surrogate, and a guard that fails a test if the target loads before a refusal (the
point of those tests is that bad input is refused first, not after minutes of work)."""

from __future__ import annotations

from pathlib import Path

import pytest

LONE = '"w1 \\ud800 w2"'  # JSON's spelling of a lone surrogate: Python reads it, no encoder takes it


def run_config(folder: Path, target: Path, data: Path, mask: bool = True) -> Path:
    path = folder / "run.toml"
    drafter = "[drafter]\nmask_token_id = 511\n" if mask else ""
    path.write_text(
        f'[target]\npath = "{target}"\n[data]\nkind = "chat"\npath = "{data}"\nseq_len = 64\n{drafter}'
        f'[optim]\nsteps = 2\n[output]\ndir = "{folder / "out"}"\n[run]\ndevice = "cpu"\n'
    )
    return path


def chats(path: Path, count: int, answered: bool = True, extra: str = "") -> Path:
    answer = ', {"role": "assistant", "content": "w3 w4"}' if answered else ""
    line = '{"messages": [{"role": "user", "content": "w1 w2"}' + answer + "]}\n"
    path.write_text(line * count + extra)
    return path


def no_target_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading the target (any engine, eval's load) fails the test: the error must come first."""
    import trainer.eval.evaluate as eval_module
    import trainer.regenerate.generate_engine as generation

    def loaded(*args: object, **kwargs: object) -> None:
        raise AssertionError("the target was loaded before the bad input was refused")

    monkeypatch.setattr(generation.TorchEngine, "__init__", loaded)
    monkeypatch.setattr(eval_module, "load_pieces", loaded)
    monkeypatch.setattr(eval_module, "heldout_prompts", loaded)
