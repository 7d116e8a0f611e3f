"""Lesson 09h: what Float8 training does to a tensor, with torch's own float8 dtypes on a CPU.

    float8.formats()                    # torch.finfo of E4M3 and E5M2 beside bf16, fp16, fp32
    float8.bits(torch.float8_e4m3fn)    # the largest value's bits: sign, exponent, mantissa
    float8.short_run(steps=12)          # lesson 01's CNN from a seed: fc1's weight, grad_outputs
    float8.cast(x, torch.float8_e4m3fn, scale)   # through float8 and back: what was lost
    float8.scales(grad_outputs, dtype)  # dynamic against delayed (amax history) scales, per step

Scaling as torchao's "tensorwise" recipe computes it (torchao/float8/float8_utils.py): scale =
the format's max / the tensor's amax (its largest |x|), the tensor multiplied by it, clamped to the
format's range and cast (to_fp8_saturated); dividing by the scale gives the value back.
"""

import argparse
import math

import torch

from ..report import save

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FORMATS = {
    "float8_e4m3fn": E4M3,
    "float8_e5m2": E5M2,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}
FORMAT_NAMES = {E4M3: "E4M3", E5M2: "E5M2"}
_AS_INT = {8: torch.uint8, 16: torch.int16, 32: torch.int32}


def smallest_subnormal(dtype):
    """The smallest positive value the format holds: its smallest normal times its eps."""
    info = torch.finfo(dtype)
    return info.smallest_normal * info.eps


def formats():
    """One row a format, from torch.finfo: its bits, largest value, smallest normal and
    subnormal, eps (the gap above 1), and how many powers of two lie between its extremes."""
    import pandas as pd

    rows = []
    for name, dtype in FORMATS.items():
        info = torch.finfo(dtype)
        mantissa = round(-math.log2(info.eps))
        rows.append(
            {
                "format": name,
                "bits": info.bits,
                "exponent": info.bits - 1 - mantissa,
                "mantissa": mantissa,
                "max": info.max,
                "smallest_normal": info.smallest_normal,
                "smallest_subnormal": smallest_subnormal(dtype),
                "eps": info.eps,
                "powers_of_2": round(math.log2(info.max / smallest_subnormal(dtype))),
            }
        )
    return pd.DataFrame(rows)


def _readable(v):
    """A power of two below 1 as 2^k, a whole number as itself, any other as d.dd x 10^k."""
    k = math.log2(v)
    if v < 1 and k == int(k):
        return f"2^{int(k)}"
    if v == int(v) and v < 1e6:
        return str(int(v))
    e = math.floor(math.log10(v))
    return f"{v / 10**e:.2f} x 10^{e}"


def shown(table):
    """formats() as a learner reads it: 2^-6 rather than 0.015625."""
    out = table.copy()
    for column in ("max", "smallest_normal", "smallest_subnormal", "eps"):
        out[column] = out[column].map(_readable)
    return out.to_string(index=False)


def bits(dtype, value=None):
    """The bits torch stores for value (default: the format's max), as 'sign exponent mantissa'."""
    info = torch.finfo(dtype)
    value = info.max if value is None else value
    stored = torch.tensor([value], dtype=torch.float32).to(dtype).view(_AS_INT[info.bits])
    word = format(int(stored.item()) & ((1 << info.bits) - 1), f"0{info.bits}b")
    mantissa = round(-math.log2(info.eps))
    return f"{word[0]} {word[1 : info.bits - mantissa]} {word[info.bits - mantissa :]}"


def short_run(steps=12, batch=64, seed=0):
    """Lesson 01's CNN (trainup.models.Net) built with torch.manual_seed(seed), trained `steps`
    steps on the course's digits with the baseline's Adadelta (lr 1.0). Returns fc1's weight after
    the run, its inputs of the last step, and fc1's grad_output (the gradient of its output) at
    every step: the tensors torchao's Float8Linear casts (input and weight to E4M3, grad_output to
    E5M2)."""
    from trainup import data, models

    args = argparse.Namespace(
        dataset="digits", train_size=steps * batch, test_size=batch, batch_size=batch
    )
    train, _ = data.load(args)
    x_all, y_all = train.tensors
    torch.manual_seed(seed)
    model = models.Net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    seen = {"grad_outputs": []}
    model.fc1.register_forward_hook(lambda m, i, o: seen.update(inputs=i[0].detach().clone()))
    model.fc1.register_full_backward_hook(
        lambda m, gi, go: seen["grad_outputs"].append(go[0].detach().clone())
    )
    for step in range(steps):
        x, y = x_all[step * batch : (step + 1) * batch], y_all[step * batch : (step + 1) * batch]
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model.fc1.weight.detach().clone(), seen["inputs"], seen["grad_outputs"]


def amax(x):
    return x.abs().max().item()


def dynamic_scale(x, dtype):
    """torchao's amax_to_scale: the format's max over the tensor's amax (in float64, as torchao
    computes it, then float32)."""
    return float(torch.tensor(torch.finfo(dtype).max / max(amax(x), 1e-12)).float())


def to_float8(x, dtype, scale=1.0):
    """x times scale, clamped to the format's range and cast (torchao's to_fp8_saturated)."""
    top = torch.finfo(dtype).max
    return (x.float() * scale).clamp(-top, top).to(dtype)


def saturates_above(dtype):
    """Where saturating starts to lose anything: above the max by half the gap below it, values
    round to the max anyway (to the nearest value; E5M2 casts beyond it to inf, unclamped)."""
    info = torch.finfo(dtype)
    return info.max + 2 ** math.floor(math.log2(info.max)) * info.eps / 2


def cast(x, dtype, scale=1.0):
    """x through float8 with this scale and back: the share of its nonzero values that saturated
    (clamped to the max from beyond saturates_above), that came back zero (flushed), that landed
    among the subnormals (fewer mantissa bits); the relative error ||x - back|| / ||x||."""
    x = x.float()
    scaled = x * scale
    back = to_float8(x, dtype, scale).float() / scale
    nonzero = x != 0
    n = max(int(nonzero.sum()), 1)
    info = torch.finfo(dtype)
    tiny = (scaled.abs() < info.smallest_normal) & nonzero & (back != 0)
    return {
        "scale": scale,
        "saturated_pct": 100 * int((scaled.abs() > saturates_above(dtype)).sum()) / n,
        "flushed_pct": 100 * int((nonzero & (back == 0)).sum()) / n,
        "subnormal_pct": 100 * int(tiny.sum()) / n,
        "error": ((x - back).norm() / x.norm()).item(),
    }


def table(tensors):
    """cast() of each (name, tensor, dtype) as it is and with its dynamic scale, one row each."""
    import pandas as pd

    rows = []
    for name, x, dtype in tensors:
        for how, scale in (("none", 1.0), ("amax", dynamic_scale(x, dtype))):
            rows.append({"tensor": name, "format": FORMAT_NAMES[dtype], "scaling": how,
                         "amax": amax(x), **cast(x, dtype, scale)})
    return pd.DataFrame(rows)


def scales(xs, dtype, history=16):
    """Per step, from the second: the dynamic scale (this step's amax) against the delayed one
    (Transformer Engine's DelayedScaling with its "max" algorithm: the largest amax of the
    `history` steps before, so the scale is known before the step's tensor is), and what each
    loses of that step's tensor; new_high: the step's amax exceeds every amax before it."""
    import pandas as pd

    amaxes = [amax(x) for x in xs]
    top = torch.finfo(dtype).max
    rows = []
    for step in range(1, len(xs)):
        dynamic = cast(xs[step], dtype, dynamic_scale(xs[step], dtype))
        delayed = cast(xs[step], dtype, top / max(amaxes[max(0, step - history) : step]))
        rows.append({
            "step": step,
            "amax": amaxes[step],
            "new_high": amaxes[step] > max(amaxes[:step]),
            "delayed_over_dynamic": delayed["scale"] / dynamic["scale"],
            "dynamic_error": dynamic["error"],
            "delayed_error": delayed["error"],
            "dynamic_saturated_pct": dynamic["saturated_pct"],
            "delayed_saturated_pct": delayed["saturated_pct"],
        })
    return pd.DataFrame(rows)


def scaled_mm_on_cpu(seed=0):
    """torch._scaled_mm of two float8 matrices on this CPU, against the float32 product of their
    upcast, scaled values: (the largest difference, whether the two are bitwise equal)."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(32, 64, generator=g), torch.randn(16, 64, generator=g)
    sa, sb = dynamic_scale(a, E4M3), dynamic_scale(b, E4M3)
    a8, b8 = to_float8(a, E4M3, sa), to_float8(b, E4M3, sb).t()
    inv_a, inv_b = torch.tensor(1 / sa), torch.tensor(1 / sb)
    out = torch._scaled_mm(a8, b8, scale_a=inv_a, scale_b=inv_b, out_dtype=torch.float32)
    upcast = (a8.float() * inv_a) @ (b8.float() * inv_b)
    return (out - upcast).abs().max().item(), torch.equal(out, upcast)


def _range(ax, dtype, row, color, label):
    """The format's range as a band at the top of the axis: normals dark, subnormals light."""
    info = torch.finfo(dtype)
    band = dict(ymin=row, ymax=row + 0.07, color=color, lw=0)
    ax.axvspan(smallest_subnormal(dtype), info.smallest_normal, alpha=0.3, **band)
    ax.axvspan(info.smallest_normal, info.max, alpha=0.7, label=label, **band)


def plot(tensors, name="float8_ranges"):
    """A histogram of |x| (its nonzero values, log axis) per tensor, as it is and times its
    dynamic scale for its format, under the E4M3 and E5M2 ranges."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, len(tensors), figsize=(5 * len(tensors), 3.8), squeeze=False)
    edges = np.logspace(-12, 6, 109)  # six bins a power of ten
    for ax, (title, (x, dtype)) in zip(axes[0], tensors.items()):
        x = x.float().abs()
        x = x[x > 0]
        scale = dynamic_scale(x, dtype)
        ax.hist(x.numpy(), bins=edges, histtype="step", lw=1.5, color="grey", label="as it is")
        ax.hist((x * scale).numpy(), bins=edges, histtype="step", lw=1.5, color="black",
                label="times its scale")
        _range(ax, E4M3, 0.9, "tab:orange", "E4M3's range")
        _range(ax, E5M2, 0.82, "tab:blue", "E5M2's range")
        ax.set_xscale("log")
        ax.set_xlim(edges[0], edges[-1])
        ax.set_ylim(top=ax.get_ylim()[1] * 1.35)
        ax.set(xlabel="|x| of its nonzero values", ylabel="values",
               title=f"{title}: scale {scale:.3g}")
        ax.legend()
    save(fig, name)
    return fig
