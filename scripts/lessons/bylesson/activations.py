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

from .. import checks
from ..report import save

SHAPE = dict(layers=2, hidden=64, heads=4)  # small enough for seconds on a laptop's CPU


def held(mode, layers, hidden, heads, seq, batch, dtype=torch.float32, fused=False):
    """Bytes of activations alive at the end of the forward pass (MemTracker's ACT), then backward
    runs. fused: attention by F.scaled_dot_product_attention."""
    from torch.distributed._tools.mem_tracker import MemTracker

    model = transformer.recompute(transformer.stack(layers, hidden, heads, dtype=dtype), mode)
    for m in model.modules():
        if isinstance(m, transformer.Attention):
            m.fused = fused
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


def step_seconds(mode, layers, hidden, heads, seq, batch, repeats=5, every=False):
    """The median seconds of a forward and backward pass (one warm-up first): this machine's;
    every=True: each of the timed passes."""
    model = transformer.recompute(transformer.stack(layers, hidden, heads), mode)
    x = torch.randn(batch, seq, hidden, generator=torch.Generator().manual_seed(1))
    times = []
    for i in range(repeats + 1):
        tick = time.perf_counter()
        model(x).square().mean().backward()
        if i:
            times.append(time.perf_counter() - tick)
    return times if every else statistics.median(times)


def recompute_table(seq=128, batch=8, shape=SHAPE, timed=True):
    """Each mode: bytes kept after forward (measured, and the formula's), and seconds per step."""
    import pandas as pd

    rows = []
    for mode in transformer.RECOMPUTE:
        times = step_seconds(mode, seq=seq, batch=batch, every=True, **shape) if timed else None
        rows.append(
            dict(
                recompute=mode,
                held_kb=held(mode, seq=seq, batch=batch, **shape) / 1024,
                formula_kb=formula(mode, seq=seq, batch=batch, **shape) / 1024,
                step_s=statistics.median(times) if timed else None,
                step_runs=times,
                flops_extra=extra_flops(mode, shape["hidden"], seq),
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


def extra_flops(mode, hidden, seq):
    """The share of a step's FLOPs a mode adds by running forward work again (per token and
    layer, a forward is 24 h^2 in the matrix products and 4 s h in the scores and their mixing; a
    step three forwards): full one forward, +1/3; selective the scores, 4 s h."""
    forward = 24 * hidden * hidden + 4 * seq * hidden
    again = {"none": 0, "selective": 4 * seq * hidden}.get(mode, forward)
    return again / (3 * forward)


def about_recompute(df):
    """Computed sentence: what each mode saved, what its FLOPs add, and what the timed passes
    decide about its cost here (lessons/claims.py: five passes each, their ranges)."""
    from .. import claims
    none = df.set_index("recompute").loc["none"]
    parts = []
    for _, r in df.iloc[1:].iterrows():
        saved = 1 - r["held_kb"] / none["held_kb"]
        ratio = statistics.median(r["step_runs"]) / statistics.median(none["step_runs"])
        way = claims.step(none["step_runs"], r["step_runs"])  # +1: its passes all took longer
        timed = {1: f"its passes all took longer than keeping everything's ({ratio:.2f}× the "
                    f"time)",
                 -1: f"its passes all took less time than keeping everything's ({ratio:.2f}×)",
                 0: f"its passes and keeping everything's overlap ({ratio:.2f}× the time): "
                    f"not told apart"}.get(way, f"{ratio:.2f}× the time, too few passes to tell")
        parts.append(
            f"{r['recompute']} recomputation kept {r['held_kb']:.0f} KB instead of "
            f"{none['held_kb']:.0f} ({saved:.0%} less), its FLOPs {r['flops_extra']:+.0%} a step; "
            f"timed here, {timed}"
        )
    return ("; ".join(parts) + ". At this size (h = 64 on a CPU) a step is mostly overhead, not "
            "FLOPs: the FLOPs say what a large model pays.")


def fused_table(seqs=(32, 64, 128), batch=8, shape=SHAPE):
    """The same layers with attention written out and fused (F.scaled_dot_product_attention):
    bytes kept after forward, measured, beside the formula without the scores (selective's)."""
    import pandas as pd

    rows = []
    for seq in seqs:
        written = held("none", seq=seq, batch=batch, **shape)
        fused = held("none", seq=seq, batch=batch, fused=True, **shape)
        rows.append(dict(seq=seq, written_kb=written / 1024, fused_kb=fused / 1024,
                         no_scores_formula_kb=formula("selective", seq=seq, batch=batch,
                                                      **shape) / 1024))
    df = pd.DataFrame(rows)
    df["fused_vs_formula"] = df["fused_kb"] / df["no_scores_formula_kb"]
    return df


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
    ax.set_xlim(left=0)  # from 0: the differences at their true size
    ax.set_ylim(bottom=0)
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
    1/(4 hidden))."""
    off = df[(df["measured_vs_formula"] - 1).abs() > within]
    checks.holds(
        off.empty, f"measured activation bytes within {within:.0%} of the formula:\n{off}"
    )
    return df
