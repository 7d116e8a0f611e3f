"""Solutions to lesson 09c's exercises. Run: python notebooks/solutions/09c_tensor_parallel.py"""


# Tensor parallelism by hand
def block_bytes_per_rank(width, hidden, tp, bytes_per_value=4):
    """Part (a): parameter bytes one rank holds of one FeedForward block (LayerNorm, up: width
    -> hidden, down: hidden -> width) cut over tp processes. `up` is cut by its output features
    (weight and bias), `down` by its input features (weight only: its bias is added once, after
    the all-reduce, so every rank keeps it whole); the LayerNorm is whole on every rank."""
    if hidden % tp:
        raise ValueError(f"hidden {hidden} does not split into {tp} equal slices")
    cut = (width * hidden + hidden + hidden * width) // tp
    whole = 2 * width + width  # LayerNorm weight and bias, down's bias
    return (cut + whole) * bytes_per_value


def allreduce_bytes_per_step(batch, width, blocks, tp, bytes_per_value=4):
    """Part (b): per training step, (calls, bytes per call, bytes each rank sends) of the tp
    all-reduces: one per block in forward (the block's output) and one in backward (its input
    gradient), each batch x width values; a ring all-reduce sends 2(tp-1)/tp of the message
    from every rank."""
    if tp == 1:
        return 0, 0, 0.0
    calls, message = 2 * blocks, batch * width * bytes_per_value
    return calls, message, calls * message * 2 * (tp - 1) / tp


def largest_tp_that_fits(width, hidden, blocks, memory_bytes, bytes_per_value=4, max_tp=64):
    """Part (c): the smallest tp (a divisor of hidden) whose blocks fit in memory_bytes per rank,
    with fp32 weights, their gradients and Adam's two moments (16 bytes a value); None if none
    does."""
    for tp in (t for t in range(1, max_tp + 1) if hidden % t == 0):
        if 4 * blocks * block_bytes_per_rank(width, hidden, tp, bytes_per_value) <= memory_bytes:
            return tp
    return None


if __name__ == "__main__":
    print("one block, width 1024, hidden 4096:",
          {tp: block_bytes_per_rank(1024, 4096, tp) for tp in (1, 2, 4, 8)})
    print("tp all-reduces, batch 64, width 64, 2 blocks, tp 2:",
          allreduce_bytes_per_step(64, 64, 2, 2))
    print("48 blocks of 4096 x 16384 in 16 GB:", largest_tp_that_fits(4096, 16384, 48, 16e9))
