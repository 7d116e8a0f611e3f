"""Solutions to lesson 07c's exercises. Run: python notebooks/solutions/07c_lightning_options.py"""
import torch

REMOVED = {"dp": "Lightning 2 removed strategy 'dp': use strategy='ddp'",
           "horovod": "Lightning 2 removed strategy 'horovod': use strategy='ddp', "
                      "or Horovod without Lightning"}
PRECISION = {16: "16-mixed", "16": "16-mixed", "bf16": "bf16-mixed", 32: "32-true",
             "32": "32-true"}
# the bits stored after the point; the leading 1 is implicit
MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}


def to_lightning2(kwargs):
    """Exercise 1: a Lightning 1.x Trainer keyword dict -> the 2.x one (devices + accelerator,
    precision names)."""
    out = dict(kwargs)
    for old, accelerator in (("gpus", "gpu"), ("num_processes", "cpu"), ("tpu_cores", "tpu")):
        if old in out:
            out["devices"], out["accelerator"] = out.pop(old), accelerator
    if out.get("strategy") in REMOVED:
        raise ValueError(REMOVED[out["strategy"]])
    if "precision" in out:
        out["precision"] = PRECISION.get(out["precision"], out["precision"])
    return out


def spacing_above_one(bits):
    """Exercise 2: the gap between 1 and the next number of a format with `bits` stored
    mantissa bits: the last bit of the mantissa, worth 2**-bits at an exponent of 0."""
    return 2.0 ** -bits


def update_kept(dtype, weight, step):
    """Exercise 2: whether weight + step, both held in dtype, differs from weight (a step
    smaller than half the spacing at the weight rounds back to it)."""
    w = torch.tensor(weight, dtype=dtype)
    return bool(w + torch.tensor(step, dtype=dtype) != w)


if __name__ == "__main__":
    print(to_lightning2(dict(gpus=4, num_nodes=2, strategy="ddp", precision=16)))
    try:
        to_lightning2(dict(gpus=2, strategy="dp"))
    except ValueError as e:
        print(e)
    for dtype, bits in MANTISSA_BITS.items():
        print(f"{dtype}: {bits} mantissa bits, spacing above 1 {spacing_above_one(bits):g} "
              f"(torch.finfo: {torch.finfo(dtype).eps:g}); "
              f"1.0 + 0.001 kept: {update_kept(dtype, 1.0, 1e-3)}")
