"""Solutions to lesson 11b's exercises. Run: python notebooks/solutions/11b_simulated_world.py"""

from lessons.bylesson import planner, simulated_world as sw

MODEL = planner.Transformer(layers=2, hidden=4096, heads=32, seq=4096)  # the lesson's


def weights_at(world=8192, model=MODEL):
    """Exercise 1: bytes of fp32 weights a rank holds (its padded shards: every rank allocates
    the first chunk's ceil(rows / world) rows of each parameter), and an even split's."""
    even = sw.planned(model, world)["param"]
    return even + 4 * sw.padding(model, world), even


def bf16_against_fp32(world=64, model=MODEL):
    """Exercise 2: each of the tracker's categories whose largest bytes differ between the fp32
    and the bf16 run: {category: (fp32 bytes, bf16 bytes)}."""
    runs = {p: sw.simulate(model, world, precision=p)["largest"] for p in ("32", "bf16")}
    return {c: (runs["32"][c], runs["bf16"][c]) for c in sw.CATEGORIES
            if runs["32"][c] != runs["bf16"][c]}


if __name__ == "__main__":
    held, even = weights_at()
    print(f"Exercise 1: {held / 1e6:.2f} MB of weights a rank at 8192 ranks, {even / 1e6:.2f} MB "
          f"split evenly ({held / even:.1f} x): most weights have 4096 rows, half a row a rank, "
          f"and each rank still allocates a whole one")
    print("Exercise 2: the largest bytes of each category that changes, fp32 -> bf16:")
    for category, (fp32, bf16) in bf16_against_fp32().items():
        print(f"  {category}: {fp32 / 1e6:.1f} MB -> {bf16 / 1e6:.1f} MB ({bf16 / fp32:.2f} x)")
    print("The shards, gradients and Adam's states stay fp32 (MixedPrecisionPolicy casts the "
          "shards as it gathers them); the gathered layer, its gradients before their "
          "reduction, the activations and temporaries are bf16; the reduce-scatter is fp32 "
          "(reduce_dtype).")
