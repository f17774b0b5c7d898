"""`runs show/compare --plot`'s figure (issue 39 U10: every point marked, a one-point series drawn, a title
with the run ids and configs) and its write onto a full disk (U11: the path named, nothing left)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dflash_doctor.launch.run_curves import plot_curves, read_curves


def metrics(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def drawn_figure(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures plot_curves saves, kept for inspection (the PNG's pixels say little)."""
    from matplotlib.figure import Figure

    figures: list[Any] = []
    save = Figure.savefig

    def keep(self: Any, *args: Any, **kwargs: Any) -> Any:
        figures.append(self)
        return save(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


def test_every_point_is_marked_and_a_one_point_series_is_drawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: no markers, so run b's single held-out evaluation (one point) drew nothing."""
    figures = drawn_figure(monkeypatch)
    rows_a = [{"step": s, "loss": 4.0 - s, "heldout_accept_len": 1.0 + s / 10} for s in (1, 2, 3)]
    rows_b = [{"step": 1, "loss": 5.0}, {"step": 2, "loss": 4.0, "heldout_accept_len": 1.5}]
    a = read_curves(metrics(tmp_path / "a.jsonl", rows_a), "a1b2", "tiny-cpu.toml")
    b = read_curves(metrics(tmp_path / "b.jsonl", rows_b), "c3d4", "smollm2-135m.toml")
    plot_curves([a, b], tmp_path / "ab.png")
    (fig,) = figures
    acceptance = next(ax for ax in fig.axes if ax.get_title(loc="left") == "acceptance length")
    lines = {line.get_label(): line for line in acceptance.get_lines()}
    one = lines["c3d4 (heldout_accept_len)"]
    assert list(one.get_xdata()) == [2] and list(one.get_ydata()) == [1.5]
    for ax in fig.axes:
        for line in ax.get_lines():
            assert line.get_marker() not in (None, "None", "", " ") and line.get_markersize() > 0
    assert one.get_visible() and one.get_alpha() in (None, 1.0)


def test_the_title_names_the_runs_and_their_configs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: panels titled loss / acceptance / tok/s, nothing saying which runs or configs they are."""
    figures = drawn_figure(monkeypatch)
    a = read_curves(metrics(tmp_path / "a.jsonl", [{"step": 1, "loss": 2.0}]), "a1b2", "tiny-cpu.toml")
    b = read_curves(metrics(tmp_path / "b.jsonl", [{"step": 1, "loss": 3.0}]), "c3d4")
    plot_curves([a, b], tmp_path / "ab.png")
    title = figures[0].get_suptitle()
    assert title == "run a1b2 (config tiny-cpu.toml) and run c3d4", title


def test_runs_compare_titles_the_plot_with_the_records_configs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dflash_doctor.cli import run
    from dflash_doctor.launch.runs import RunStore

    figures = drawn_figure(monkeypatch)
    store = RunStore()
    ids = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        metrics(tmp_path / name / "metrics.jsonl", [{"step": 1, "loss": 2.0}])
        record = store.create(
            "succeeded", output_dir=str(tmp_path / name), config_path=str(tmp_path / f"{name}.toml")
        )
        ids.append(record.id)
    assert run(["runs", "compare", *ids, "--plot", str(tmp_path / "ab.png")]) == 0, capsys.readouterr()
    assert figures[0].get_suptitle() == f"run {ids[0]} (config a.toml) and run {ids[1]} (config b.toml)"


FULL_DISK = """
import resource, signal, sys
from dflash_doctor.cli import run
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (2048, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
sys.exit(run(sys.argv[1:]))
"""


def test_a_plot_onto_a_full_disk_names_the_path_and_leaves_nothing(tmp_path: Path) -> None:
    """Was: "a file: No space left on device" (the write's error carried no file name). The child may write
    at most 2 kB a file; the PNG is larger."""
    from dflash_doctor.launch.runs import RunStore

    store = RunStore()
    ids = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        metrics(tmp_path / name / "metrics.jsonl", [{"step": s, "loss": 4.0 - s} for s in (1, 2, 3)])
        ids.append(store.create("succeeded", output_dir=str(tmp_path / name)).id)
    out = tmp_path / "plots" / "ab.png"
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK, "runs", "compare", *ids, "--plot", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    err = " ".join(done.stderr.split())
    assert done.returncode == 2, err
    assert f"no space left on the device for {out}" in err and "a file:" not in err, err
    assert not out.exists() and not [p.name for p in out.parent.iterdir()]
