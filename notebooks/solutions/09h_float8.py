"""Solutions to lesson 09h's exercises. Run: python notebooks/solutions/09h_float8.py"""

import torch

from lessons.bylesson import float8


def finite_positive_values(dtype):
    """Exercise 1: every byte viewed as the dtype, the finite values above zero counted."""
    values = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    return int(((values > 0) & values.isfinite()).sum())


def margin_without_saturation(grads=None, dtype=float8.E5M2, most=8):
    """Exercise 2: the smallest margin m (the delayed scale over 2^m, Transformer Engine's
    `margin`) at which no step of the short run's grad_output saturates; with the mean error at
    m and at 0. The delayed scale of a step: the format's max over the largest amax before it."""
    if grads is None:
        grads = float8.short_run(steps=12)[2]
    top = torch.finfo(dtype).max
    amaxes = [float8.amax(g) for g in grads]

    def run(m):
        out = [float8.cast(g, dtype, top / max(amaxes[:step]) / 2**m)
               for step, g in enumerate(grads) if step]
        return max(o["saturated_pct"] for o in out), sum(o["error"] for o in out) / len(out)

    for m in range(most + 1):
        saturated, error = run(m)
        if saturated == 0:
            return m, error, run(0)[1]
    return None


if __name__ == "__main__":
    for name in ("float8_e4m3fn", "float8_e5m2"):
        count = finite_positive_values(float8.FORMATS[name])
        print(f"Exercise 1: {name} holds {count} finite positive values")
    m, error, plain = margin_without_saturation()
    print(f"Exercise 2: margin {m} saturates nothing; mean error {error:.4f} against {plain:.4f} "
          f"at margin 0")
