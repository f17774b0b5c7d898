"""Held-out evaluation compiles nothing in the middle of a run: the warm-up compiles the drafter's scoring
graph, and the target scores in its capture's grad mode (compiled graphs guard on grad mode and
`training`, so either difference meant a second graph at the first evaluation, on every rank)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from trainer.model.batch import CapturedBatch
from trainer.model.build import build_drafter
from trainer.model.drafter import DFlashDrafter
from trainer.run.heldout import HeldoutSums, evaluate_heldout
from trainer.run.warmup import dummy_batch, warm_up_model
from trainer.runspec.config import TrainConfig, load_config
from trainer.runspec.target_shapes import target_hf_config
from trainer.target_model.capture import load_capture_target

SMALL = ["data.seq_len=32", "optim.anchors=4", "optim.batch_size=1"]


def graphs() -> int:
    return int(counters["stats"]["unique_graphs"])


@dataclass
class Warmed:
    """A compiled CPU drafter after the trainer's warm-up, and a held-out batch at the run's shapes."""

    cfg: TrainConfig
    model: DFlashDrafter
    report: dict
    graphs: int  # Dynamo graphs the warm-up left
    batch: CapturedBatch

    def score(self) -> HeldoutSums:
        return evaluate_heldout(self.model, [self.batch], self.cfg.optim.anchors)


def warmed_drafter(eval_fraction: float) -> Warmed:
    torch._dynamo.reset()
    counters.clear()
    cfg = load_config("tiny-cpu", [*SMALL, f"data.eval_fraction={eval_fraction}"])
    device = torch.device("cpu")
    hf = target_hf_config(cfg.target.path)
    frozen = torch.zeros(int(hf.vocab_size), int(hf.hidden_size))
    model = build_drafter(cfg, hf, frozen, frozen, device)
    model.compile_layers(None)  # CPU runs are eager by default; compile here to see the graphs
    report = warm_up_model(model, cfg, device)
    batch = dummy_batch(cfg, model, device)
    batch.target_ids = batch.input_ids.clone()
    return Warmed(cfg, model, report, graphs(), batch)


def test_the_warm_up_compiles_the_held_out_graph_when_the_run_evaluates() -> None:
    warmed = warmed_drafter(0.1)
    assert "decoder layers (training and held-out)" in warmed.report["compiled"]
    with torch._dynamo.config.patch(error_on_recompile=True):
        sums = warmed.score()
    assert graphs() == warmed.graphs
    assert sums.anchors > 0 and warmed.model.training  # scored, and back in training mode


def test_without_held_out_data_the_warm_up_compiles_only_training() -> None:
    """The other side: a run that never evaluates pays for no scoring graph, and scoring would need one
    (what the warm-up above saves the first evaluation of a run that does)."""
    warmed = warmed_drafter(0.0)
    assert "decoder layers" in warmed.report["compiled"]
    warmed.score()
    assert graphs() > warmed.graphs


def test_a_colocated_target_scores_held_out_data_with_its_capture_graph() -> None:
    cfg = load_config("tiny-cpu", SMALL)
    assert cfg.drafter.target_layer_ids is not None
    device = torch.device("cpu")
    ids = torch.zeros(1, 32, dtype=torch.long)
    mask = torch.ones_like(ids, dtype=torch.bool)
    for inference_tensors in (False, True):  # colocated ranks capture under no_grad, split targets not
        torch._dynamo.reset()
        counters.clear()
        target = load_capture_target(
            cfg.target.path,
            cfg.drafter.target_layer_ids,
            cfg.run.seed,
            device,
            torch.float32,
            compile_layers=True,
            keep_head=True,
            inference_tensors=inference_tensors,
        )
        captured = target.capture(ids, mask, 0)
        after_capture = graphs()
        with torch._dynamo.config.patch(error_on_recompile=True):
            scored = target.capture_with_greedy(ids, mask, 0)
        assert graphs() == after_capture, f"inference_tensors={inference_tensors}"
        assert scored.target_ids is not None and scored.target_ids.shape == ids.shape
        torch.testing.assert_close(scored.hidden, captured.hidden)
        assert scored.hidden.is_inference() == inference_tensors
