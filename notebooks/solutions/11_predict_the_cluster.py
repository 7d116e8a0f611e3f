"""Solutions to lesson 11's exercises. Run: python notebooks/solutions/11_predict_the_cluster.py"""
import math

from lessons import hardware, report
from lessons.bylesson import collectives, predict


def crossover(p, link):
    """Exercise 1: the ring and the tree cost the same at n bytes where
    2(p-1)a + 2(p-1)/p n/b = 2L(a + n/b), L = ceil(log2 p): n = ab (2(p-1) - 2L) / (2L - 2(p-1)/p).
    Below it the tree's fewer latencies win, above it the ring's fewer bytes."""
    levels = math.ceil(math.log2(p))
    a, b = link.alpha_s, link.beta
    return a * b * (2 * (p - 1) - 2 * levels) / (2 * levels - 2 * (p - 1) / p)


def even_size(p, alpha, beta):
    """Exercise 2: a ring all-reduce's latency term 2(p-1) alpha equals its bytes term
    2(p-1)/p n/beta at n = p alpha beta. Below it latency rules, above it bandwidth; there the
    all-reduce takes twice its latency alone."""
    return p * alpha * beta


if __name__ == "__main__":
    link = hardware.LINKS["ib_hdr"]
    for p in (8, 64, 4096):
        print(f"{p} ranks over {link.name}: the tree wins below {crossover(p, link) / 1e3:.0f} KB")
    print(f"8 ranks over {link.name}: latency and bytes even at "
          f"{even_size(8, link.alpha_s, link.beta) / 1e6:.2f} MB")
    if report.left_here("predict_bandwidth", checkpoint=False):  # the lesson's own sweep
        alpha, beta, _ = predict.fit_alpha_beta(collectives.bandwidth_table("predict_bandwidth"))
        print(f"2 ranks here: even at {even_size(2, alpha, beta) / 1e3:.0f} KB")
