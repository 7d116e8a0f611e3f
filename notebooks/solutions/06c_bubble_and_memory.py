"""Solutions to lesson 06c's exercises. Run: python notebooks/solutions/06c_bubble_and_memory.py"""


def bubble(p, m):
    """The idle share of a GPipe or 1F1B step with p stages and m micro-batches: (p-1)/(m+p-1)."""
    return (p - 1) / (m + p - 1)


def microbatches_for(p, target=0.10):
    """Exercise 1: the fewest micro-batches that bring the bubble of p stages down to `target`."""
    m = 1
    while bubble(p, m) > target:
        m += 1
    return m


def activations_held(p, m, schedule):
    """Exercise 2: micro-batches whose activations each stage keeps alive at the step's peak.
    GPipe runs every forward before any backward: m on every stage. 1F1B starts backward as soon
    as the last stage can: stage s (0 first) holds at most p - s of them, and never more than m."""
    if schedule == "gpipe":
        return [m] * p
    if schedule == "1f1b":
        return [min(p - s, m) for s in range(p)]
    raise ValueError(f"unknown schedule {schedule!r}")


def kept_per_microbatch(blocks, width, microbatch, recompute, bytes_per_value=4):
    """Exercise 3: bytes one micro-batch leaves saved for backward in `blocks` of the block stack
    (trainup/models.Block: LayerNorm, Linear, ReLU, a residual add). Without recomputation each
    block keeps its input (LayerNorm saves it), LayerNorm's output (the Linear's input) and ReLU's
    output (`width` values a sample each) and LayerNorm's mean and 1/std (one each); recomputed,
    its input only."""
    per_sample = width if recompute else 3 * width + 2
    return blocks * per_sample * microbatch * bytes_per_value


if __name__ == "__main__":
    for p in (2, 4, 8):
        print(f"{p} stages: {microbatches_for(p)} micro-batches for a bubble of 10% or less")
    print("GPipe", activations_held(4, 8, "gpipe"), "1F1B", activations_held(4, 8, "1f1b"))
    for recompute in (False, True):
        print(f"recompute {recompute}: {kept_per_microbatch(4, 256, 8, recompute)} bytes kept")
