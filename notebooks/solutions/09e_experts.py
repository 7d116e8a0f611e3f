"""Solutions to lesson 09e's exercises. Run: python notebooks/solutions/09e_experts.py"""

from trainup.parallel import experts as moe


def expert_parameters_used(experts=64, top_k=2, width=4096, hidden=14336):
    """Exercise 1: a token passes through top_k experts of 2 x width x hidden parameters each
    (fc1 and fc2, biases left out): (the parameters it uses, their share of the layer's experts)."""
    one = 2 * width * hidden
    return top_k * one, top_k / experts


def kept_at_most(tokens=4096, experts=64, top_k=2, factor=1.25):
    """Exercise 2: an expert's capacity on one rank (trainup/parallel/experts.capacity, the
    lesson's rule),
    and the assignments a rank can keep in one layer: every expert full, but never more than the
    tokens x top_k it made."""
    limit = moe.capacity(tokens, experts, top_k, factor)
    return limit, min(experts * limit, tokens * top_k)


if __name__ == "__main__":
    used, share = expert_parameters_used()
    print(f"Exercise 1: {used / 1e6:.0f} M expert parameters a token, {share:.1%} of the layer's")
    limit, kept = kept_at_most()
    print(f"Exercise 2: capacity {limit} a rank; at most {kept} assignments kept: every one of "
          f"the 8192 made, the factor 1.25 leaving room for an uneven router")
