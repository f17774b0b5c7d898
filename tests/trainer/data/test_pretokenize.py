"""The `jsonl` route's writer: rows `train` reads back exactly, and a bad row writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_base.errors import ConfigError
from trainer.data.pretokenize import write_pretokenized
from trainer.data.sources import JsonlSource


def test_written_rows_train_as_written(tmp_path: Path) -> None:
    out = tmp_path / "data" / "pre.jsonl"
    assert write_pretokenized(out, [([5, 6, 7], [False, True, True]), ([8], [1])], vocab_size=16) == 2
    source = JsonlSource(str(out), 4, 16)
    ids, mask = source.get(0)
    assert ids.tolist()[:3] == [5, 6, 7] and mask.tolist() == [False, True, True, False]


def test_a_bad_row_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    out = tmp_path / "pre.jsonl"
    with pytest.raises(ConfigError, match=r"row 2: loss_mask must be a list of 0/1 as long as input_ids"):
        write_pretokenized(out, [([1, 2], [0, 1]), ([3, 4], [1])])
    assert not out.exists()
    with pytest.raises(ConfigError, match=r"row 1: input_ids must be .* < 8, got id 9"):
        write_pretokenized(out, [([9], [1])], vocab_size=8)
    assert list(tmp_path.iterdir()) == []
