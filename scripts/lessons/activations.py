"""Lesson 09b: the memory a transformer layer keeps for backward, measured, and what recomputing
saves.

    activations.held("none", layers=2, hidden=64, heads=4, seq=32, batch=8)  # kept after forward
    activations.table(seqs=(32, 64, 128))      # measured against transformer.activation_bytes
    activations.recompute_table()              # none / selective / full / wrapped: bytes, seconds
    activations.largest_gradient_difference()  # each mode's gradients against none's, float64

The bytes are measured by PyTorch's own MemTracker (torch.distributed._tools.mem_tracker, which
counts every live tensor by what it is: parameter, gradient, optimizer state, activation), at the
end of the forward pass, when a layer's activations are all held. They depend on shapes alone, so
they are the same on any machine; the seconds are this machine's.
"""

import statistics
import time

import torch

from trainup import transformer

from . import checks
from .report import save

SHAPE = dict(layers=2, hidden=64, heads=4)  # small enough for seconds on a laptop's CPU


def held(mode, layers, hidden, heads, seq, batch, dtype=torch.float32):
    """Bytes of activations alive at the end of the forward pass (MemTracker's ACT), then backward
    runs."""
    from torch.distributed._tools.mem_tracker import MemTracker

    model = transformer.recompute(transformer.stack(layers, hidden, heads, dtype=dtype), mode)
    x = torch.randn(batch, seq, hidden, dtype=dtype, generator=torch.Generator().manual_seed(1))
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        y = model(x)
        now = next(iter(tracker.get_tracker_snapshot("current").values()))
        y.square().mean().backward()
    return next(v for k, v in now.items() if str(k).endswith("ACT"))


def formula(mode, layers, hidden, heads, seq, batch, bytes_per_value=4):
    """What each mode keeps, from trainup.transformer.activation_bytes: everything (none); all but
    the softmax's heads x seq x seq values (selective); each layer's input alone (full)."""
    every = transformer.activation_bytes(seq, batch, hidden, heads, bytes_per_value)
    softmax = bytes_per_value * heads * seq * seq * batch
    one = {
        "none": every,
        "selective": every - softmax,
        "full": bytes_per_value * seq * batch * hidden,
    }[mode if mode != "wrapped" else "full"]  # the same tensors kept, by a wrapper
    return layers * one


def table(seqs=(32, 64, 128), batch=8, mode="none", shape=SHAPE):
    """Measured against the formula for a few sequence lengths: the seq^2 term shows as seq
    grows."""
    import pandas as pd

    rows = []
    for seq in seqs:
        measured = held(mode, seq=seq, batch=batch, **shape)
        expected = formula(mode, seq=seq, batch=batch, **shape)
        rows.append(
            dict(
                seq=seq,
                batch=batch,
                measured_kb=measured / 1024,
                formula_kb=expected / 1024,
                measured_vs_formula=measured / expected,
            )
        )
    return pd.DataFrame(rows)


def step_seconds(mode, layers, hidden, heads, seq, batch, repeats=5):
    """The median seconds of a forward and backward pass (one warm-up first): this machine's."""
    model = transformer.recompute(transformer.stack(layers, hidden, heads), mode)
    x = torch.randn(batch, seq, hidden, generator=torch.Generator().manual_seed(1))
    times = []
    for i in range(repeats + 1):
        tick = time.perf_counter()
        model(x).square().mean().backward()
        if i:
            times.append(time.perf_counter() - tick)
    return statistics.median(times)


def recompute_table(seq=128, batch=8, shape=SHAPE, timed=True):
    """Each mode: bytes kept after forward (measured, and the formula's), and seconds per step."""
    import pandas as pd

    rows = []
    for mode in transformer.RECOMPUTE:
        rows.append(
            dict(
                recompute=mode,
                held_kb=held(mode, seq=seq, batch=batch, **shape) / 1024,
                formula_kb=formula(mode, seq=seq, batch=batch, **shape) / 1024,
                step_s=step_seconds(mode, seq=seq, batch=batch, **shape) if timed else None,
            )
        )
    df = pd.DataFrame(rows)
    df["held_vs_none"] = df["held_kb"] / df["held_kb"][0]
    return df


def largest_gradient_difference(seq=32, batch=4, shape=SHAPE):
    """{mode: the largest difference of its gradients from no recomputation}, in float64:
    recomputing runs the same operations again, so the gradients agree to float64's noise
    (checks.FLOAT64_ATOL)."""

    def grads(mode):
        model = transformer.recompute(transformer.stack(dtype=torch.float64, **shape), mode)
        x = torch.randn(
            batch,
            seq,
            shape["hidden"],
            dtype=torch.float64,
            generator=torch.Generator().manual_seed(1),
        )
        model(x).square().mean().backward()
        return [p.grad for p in model.parameters()]

    plain = grads("none")
    return {
        mode: max(float((a - b).abs().max()) for a, b in zip(plain, grads(mode)))
        for mode in transformer.RECOMPUTE[1:]
    }


def about_recompute(df):
    """Computed sentence: what each mode saved and what it cost here."""
    none = df.set_index("recompute").loc["none"]
    parts = []
    for _, r in df.iloc[1:].iterrows():
        saved = 1 - r["held_kb"] / none["held_kb"]
        cost = r["step_s"] / none["step_s"] - 1
        parts.append(
            f"{r['recompute']} recomputation kept {r['held_kb']:.0f} KB instead of "
            f"{none['held_kb']:.0f} ({saved:.0%} less) for a step {cost:+.0%} as long"
        )
    return "; ".join(parts) + " (times measured on this machine)."


def plot(df, name="activations_recompute"):
    """Memory kept against the time of a step, one point per mode."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4))
    ax.scatter(df["step_s"] * 1000, df["held_kb"])
    for _, r in df.iterrows():
        ax.annotate(
            r["recompute"],
            (r["step_s"] * 1000, r["held_kb"]),
            textcoords="offset points",
            xytext=(6, 4),
        )
    ax.set(
        xlabel="forward + backward (ms, this machine)",
        ylabel="activations kept (KB)",
        title="Activation checkpointing: memory against recompute",
    )
    ax.grid(alpha=0.3)
    save(fig, name)
    return fig


def check_formula(df, within=0.10):
    """Every measured row within `within` of the formula (LayerNorm's statistics are the gap:
    1/hidden)."""
    off = df[(df["measured_vs_formula"] - 1).abs() > within]
    checks.holds(
        off.empty, f"measured activation bytes within {within:.0%} of the formula:\n{off}"
    )
    return df
