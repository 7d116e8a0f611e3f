"""Lesson 09b: a transformer layer's activations, measured by PyTorch's MemTracker, against the
formula; activation checkpointing (selective and full) keeps less and leaves the gradients as they
were."""

import pytest
import torch

from lessons import checks
from lessons.bylesson import activations
from trainup import transformer


def test_measured_bytes_are_the_formulas_within_10_percent_at_every_length():
    df = activations.check_formula(activations.table(seqs=(16, 64), batch=4))
    assert ((df["measured_vs_formula"] - 1).abs() < 0.01).all(), df  # LayerNorm's statistics: 1/h


def test_the_formula_counts_what_the_layer_keeps_by_hand():
    # s=2, b=1, h=8, a=2: 16*2*1*8 values and 2*2*2*1 for the scores, 4 bytes each
    assert transformer.activation_bytes(2, 1, 8, 2) == 4 * (256 + 8)
    assert activations.formula("full", layers=3, hidden=8, heads=2, seq=2, batch=1) == 3 * 4 * 16
    assert activations.formula("selective", layers=1, hidden=8, heads=2, seq=2, batch=1) == 4 * 256


def test_recomputation_keeps_less_and_its_formula_holds():
    df = activations.recompute_table(seq=64, batch=4, timed=False).set_index("recompute")
    assert df.loc["full", "held_kb"] < df.loc["selective", "held_kb"] < df.loc["none", "held_kb"]
    assert ((df["held_kb"] / df["formula_kb"] - 1).abs() < 0.10).all(), df
    # FSDP's checkpoint_wrapper around each layer keeps what full recomputation keeps
    assert df.loc["wrapped", "held_kb"] == df.loc["full", "held_kb"]


def test_the_wrapper_wraps_every_layer_and_nothing_else():
    model = transformer.recompute(transformer.stack(3, 8, 2), "wrapped")
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    assert [type(m) for m in model] == [CheckpointWrapper] * 3
    assert all(type(m._checkpoint_wrapped_module) is transformer.Layer for m in model)


def test_recomputation_leaves_the_gradients_as_they_were():
    assert all(d <= checks.FLOAT64_ATOL for d in activations.largest_gradient_difference().values())


def test_a_layer_that_would_not_train_the_same_is_caught():
    """The proof can fail: a layer whose recomputed pass differs (another seed's weights) moves the
    gradients far above the tolerance."""
    shape = dict(activations.SHAPE)
    a, b = (
        transformer.stack(seed=0, dtype=torch.float64, **shape),
        transformer.stack(seed=1, dtype=torch.float64, **shape),
    )
    x = torch.randn(2, 8, shape["hidden"], dtype=torch.float64)
    ga = torch.autograd.grad(a(x).square().mean(), list(a.parameters()))
    gb = torch.autograd.grad(b(x).square().mean(), list(b.parameters()))
    assert max(float((p - q).abs().max()) for p, q in zip(ga, gb)) > 1e3 * checks.FLOAT64_ATOL


def test_bad_shapes_and_modes_are_one_sentence():
    with pytest.raises(ValueError, match="split evenly"):
        transformer.Layer(10, 4)
    with pytest.raises(ValueError, match="recompute must be one of"):
        transformer.recompute(transformer.stack(1, 8, 2), "half")


def test_fused_attention_keeps_no_scores():
    """F.scaled_dot_product_attention keeps what selective recomputation keeps (no a s^2 b
    scores), plus a log-sum-exp and LayerNorm's statistics: within 2 % of that formula."""
    t = activations.fused_table(seqs=(32, 64))
    assert (t["fused_kb"] < t["written_kb"]).all()
    assert ((t["fused_vs_formula"] - 1).abs() < 0.02).all()


def test_the_recompute_sentence_says_the_flops_and_what_the_passes_decide():
    import pandas as pd

    rows = [
        dict(recompute="none", held_kb=100.0, step_runs=[1.0, 1.1, 1.2], flops_extra=0.0),
        dict(
            recompute="selective",
            held_kb=70.0,
            step_runs=[1.05, 1.15, 1.25],
            flops_extra=activations.extra_flops("selective", 64, 128),
        ),
        dict(
            recompute="full",
            held_kb=5.0,
            step_runs=[1.5, 1.6, 1.7],
            flops_extra=activations.extra_flops("full", 64, 128),
        ),
    ]
    said = activations.about_recompute(pd.DataFrame(rows))
    assert activations.extra_flops("full", 64, 128) == pytest.approx(1 / 3)
    assert "its FLOPs +8% a step; timed here, its passes and keeping everything's overlap" in said
    assert "its FLOPs +33% a step; timed here, its passes all took longer" in said
