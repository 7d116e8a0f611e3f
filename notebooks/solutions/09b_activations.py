"""Solutions to lesson 09b's exercises. Run: python notebooks/solutions/09b_activations.py"""

from trainup import transformer


def longest_sequence(
    budget_bytes, layers=32, hidden=4096, heads=32, batch=1, bytes_per_value=2, full=False
):
    """Exercise 1: the longest sequence whose activations kept between forward and backward fit the
    budget. Without recomputation every layer keeps activation_bytes (which grows with s and s^2);
    with full recomputation each layer keeps its input alone (s*b*h values), and the peak adds one
    layer's activations while backward recomputes it. Found by bisection on s."""

    def kept(s):
        one = transformer.activation_bytes(s, batch, hidden, heads, bytes_per_value)
        if full:
            return layers * bytes_per_value * s * batch * hidden + one
        return layers * one

    low, high = 0, 1
    while kept(high) <= budget_bytes:
        high *= 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if kept(mid) <= budget_bytes else (low, mid)
    return low


def crossover(hidden=64, heads=4):
    """Exercise 2: a*s*s*b = 16*s*b*h at s = 16*h/a: beyond it the scores hold more than the
    rest."""
    return 16 * hidden // heads


if __name__ == "__main__":
    plain, full = longest_sequence(40e9), longest_sequence(40e9, full=True)
    print(
        f"Exercise 1: 32 layers of h=4096 in 16-bit, batch 1, 40 GB: {plain} tokens keeping every "
        f"activation, {full} keeping each layer's input and recomputing one layer at a time "
        f"({full / plain:.0f}x longer)"
    )
    print(
        f"Exercise 2: for h=64 and 4 heads the scores outweigh the rest beyond s = {crossover()}"
    )
