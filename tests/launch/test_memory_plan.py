"""The memory plan is a pure function of shapes: check its parts against hand-computed numbers."""

from __future__ import annotations

from dflash_doctor.launch.memory_plan import (
    GIB,
    ModelShape,
    PlanInputs,
    drafter_estimate,
    drafter_params,
    plan,
)

QWEN3_8B = ModelShape(
    hidden=4096, intermediate=12288, layers=36, heads=32, kv_heads=8, head_dim=128, vocab=151936
)


def inputs(**changes: object) -> PlanInputs:
    base = dict(
        target=QWEN3_8B,
        captured_layers=[1, 9, 17, 25, 33],
        drafter_layers=5,
        drafter_intermediate=12288,
        block_size=16,
        anchors=512,
        seq_len=3072,
        batch_size=1,
        in_flight=2,
        loss_chunk=2048,
    )
    base.update(changes)
    return PlanInputs(**base)  # type: ignore[arg-type]


def test_qwen3_8b_drafter_has_about_1_05b_trainable_parameters() -> None:
    # REFERENCE.md section 5: ~1.05B trainable for 5 layers at Qwen3-8B sizes (fc included).
    assert 1.0e9 < drafter_params(inputs()) < 1.1e9


def test_target_keeps_only_layers_up_to_the_last_captured_one() -> None:
    estimate = plan(inputs())["target"]
    per_layer = QWEN3_8B.layer_params * 2
    embed = QWEN3_8B.vocab * QWEN3_8B.hidden * 2
    assert estimate.parts["weights"] == embed + 34 * per_layer + QWEN3_8B.hidden * 2
    fewer = plan(inputs(captured_layers=[1, 5]))["target"]
    assert fewer.parts["weights"] < estimate.parts["weights"] / 4


def test_drafter_optimizer_state_is_16_bytes_per_parameter() -> None:
    est = drafter_estimate(inputs())
    params = drafter_params(inputs())
    assert (
        est.parts["parameters_fp32"] + est.parts["gradients_fp32"] + est.parts["adamw_state"] == 16 * params
    )


def test_activations_scale_with_anchors_times_block() -> None:
    small = drafter_estimate(inputs(anchors=256)).parts["activations"]
    large = drafter_estimate(inputs(anchors=1024, block_size=32)).parts["activations"]
    assert large > 6 * small  # 8x the query tokens, the context term unchanged


def test_story_shapes_fit_an_h200_and_are_far_above_the_b16_recipe() -> None:
    b16 = plan(inputs())["drafter"].total
    story = plan(inputs(anchors=1024, block_size=32, seq_len=40000))["drafter"].total
    assert 20 * GIB < b16 < story < 139 * GIB


def test_estimates_stay_within_20_percent_of_the_peaks_measured_on_an_h200() -> None:
    """bench/results/h200/*: torch.cuda.max_memory_allocated of each role at both recipes (no transport
    buffers, no CUDA context in the benchmarks, so those parts are left out of the estimate here)."""
    import json
    from pathlib import Path

    results = Path(__file__).resolve().parents[2] / "bench" / "results" / "h200"
    drafter = {
        r["recipe"]: r["peak_gib"]
        for r in json.loads((results / "drafter_variants.json").read_text())["rows"]
        if r["variant"] == "trainer"  # what the trainer runs (compiled layers)
    }
    target = {
        r["seq_len"]: r["peak_gib"]
        for r in json.loads((results / "target_capture.json").read_text())["rows"]
        if r["variant"] == "capture +compiled"  # target.compile_layers defaults to true
    }
    assert set(drafter) == {"qwen3-8b-b16", "seed-b32"} and set(target) == {3072, 40000}
    recipes = {"qwen3-8b-b16": inputs(), "seed-b32": inputs(anchors=1024, block_size=32, seq_len=40000)}
    for name, shape in recipes.items():
        d = drafter_estimate(shape)
        estimate = (d.total - d.parts["incoming_batches"] - d.parts["cuda_context"]) / GIB
        assert abs(estimate / drafter[name] - 1) < 0.20, (name, estimate, drafter[name])
        t = plan(shape)["target"]
        estimate = (t.total - t.parts["send_buffers"] - t.parts["cuda_context"]) / GIB
        assert abs(estimate / target[shape.seq_len] - 1) < 0.20, (name, estimate, target[shape.seq_len])


def test_colocated_holds_both_roles_once_without_transport_queues() -> None:
    from dflash_doctor.launch.memory_plan import colocated_estimate, target_estimate

    p = inputs()
    both = colocated_estimate(p)
    target, drafter = target_estimate(p).parts, drafter_estimate(p).parts
    assert plan(p, colocated=True) == {"colocated": both}
    assert both.parts["target_weights"] == target["weights"]
    assert both.parts["cuda_context"] == p.cuda_context_bytes  # one process, one context
    assert "incoming_batches" not in both.parts and "send_buffers" not in both.parts
    assert both.total < target_estimate(p).total + drafter_estimate(p).total - p.cuda_context_bytes
    # b16: the capture transient is smaller than the drafter's training transients, so it adds nothing
    assert both.parts["capture_transient"] == 0
    assert both.parts["activations"] == drafter["activations"]


def test_colocated_estimate_against_the_measured_h200_peak() -> None:
    """bench/kernels/colocated.py at qwen3-8b-b16 on an H200: 38.47 GiB max_memory_allocated (no CUDA context;
    the bench also holds a cloned copy of the captured states). The plan may overestimate, by under 15%."""
    from dflash_doctor.launch.memory_plan import colocated_estimate

    est = colocated_estimate(inputs())
    planned = (est.total - est.parts["cuda_context"]) / GIB
    assert 38.47 <= planned <= 38.47 * 1.15


def test_compiled_layers_on_cuda_count_the_first_layer_input_gradient() -> None:
    """run_layers makes the first layer's input need a gradient when the layers are compiled: backward
    briefly holds a (B, Q, H) fp32 gradient, 128 MiB at qwen3-8b-b16 (Q = 512 anchors x 16)."""
    b16 = drafter_estimate(inputs()).parts
    assert b16["first_layer_input_grad"] == 1 * 512 * 16 * 4096 * 4 == 128 * 1024**2
    b32 = drafter_estimate(inputs(anchors=1024, block_size=32, batch_size=2)).parts
    assert b32["first_layer_input_grad"] == 2 * 1024 * 32 * 4096 * 4
    assert "first_layer_input_grad" not in drafter_estimate(inputs(compiled_layers=False)).parts  # eager
    assert "first_layer_input_grad" not in drafter_estimate(inputs(on_gpu=False)).parts  # CPU: never compiled
    both = plan(inputs(), colocated=True)["colocated"].parts
    assert both["first_layer_input_grad"] == b16["first_layer_input_grad"]


def test_the_plan_follows_the_configs_compile_layers() -> None:
    from dflash_doctor.launch.plan import plan_inputs
    from trainer.runspec.config import load_config
    from trainer.runspec.target_shapes import target_shapes

    cfg = load_config("qwen3-8b-b16")
    shapes = target_shapes(cfg.target.path)
    assert plan_inputs(cfg, shapes, "cuda").compiled_layers
    assert not plan_inputs(cfg, shapes, "cpu").compiled_layers
    eager = load_config("qwen3-8b-b16", ["drafter.compile_layers=false"])
    assert not plan_inputs(eager, shapes, "cuda").compiled_layers


def test_heldout_evaluation_keeps_the_whole_target_and_its_head() -> None:
    """Held-out scoring needs the target's own greedy tokens: every layer, the final norm and the LM head
    stay on the target rank, and one chunk of logits exists while they are taken."""
    plain = plan(inputs())["target"]
    scored = plan(inputs(heldout=True))["target"]
    per_layer = QWEN3_8B.layer_params * 2
    head = QWEN3_8B.vocab * QWEN3_8B.hidden * 2
    assert scored.parts["weights"] - plain.parts["weights"] == 2 * per_layer + head  # layers 34, 35 + head
    assert scored.parts["heldout_logits_chunk"] == 2048 * QWEN3_8B.vocab * 2
    assert "heldout_logits_chunk" not in plain.parts
    tied = ModelShape(**{**QWEN3_8B.__dict__, "tied_embeddings": True})
    tied_scored = plan(inputs(target=tied, heldout=True))["target"]
    assert scored.parts["weights"] - tied_scored.parts["weights"] == head  # a tied head costs nothing


def test_heldout_evaluation_grows_a_colocated_rank_by_the_rest_of_the_target() -> None:
    plain = plan(inputs(), colocated=True)["colocated"]
    scored = plan(inputs(heldout=True), colocated=True)["colocated"]
    extra = scored.total - plain.total
    per_layer = QWEN3_8B.layer_params * 2
    head = QWEN3_8B.vocab * QWEN3_8B.hidden * 2
    assert extra >= 2 * per_layer + head  # never less than the weights it keeps
    assert extra < 2 * per_layer + head + GIB  # the logits chunk is a transient, not a second copy


def test_the_plan_knows_held_out_evaluation_from_the_config() -> None:
    from dflash_doctor.launch.plan import plan_inputs
    from trainer.runspec.config import load_config
    from trainer.runspec.target_shapes import target_shapes

    cfg = load_config("tiny-cpu", ["data.eval_fraction=0.1"])
    plain = load_config("tiny-cpu", ["data.eval_fraction=0.0"])
    shapes = target_shapes(cfg.target.path)
    assert plan_inputs(cfg, shapes, "cuda").heldout is True
    assert plan_inputs(plain, shapes, "cuda").heldout is False


def test_an_overlapped_capture_counts_beside_training() -> None:
    """topology.overlap_capture: the next capture runs while this step trains, so its transient is no longer
    hidden under the training transients, and two captured batches exist at once."""
    plain = plan(inputs(), colocated=True)["colocated"].parts
    beside = plan(inputs(overlap_capture=True), colocated=True)["colocated"].parts
    assert plain["capture_transient"] == 0  # at b16 the capture's transient fits under training's
    assert beside["capture_transient"] == plan(inputs())["target"].parts["layer_transient"]
    assert beside["captured_states"] == 2 * plain["captured_states"]
    on_cpu = plan(inputs(overlap_capture=True, on_gpu=False), colocated=True)["colocated"].parts
    assert on_cpu["captured_states"] == plain["captured_states"]  # CPU runs never overlap
