"""Solutions to lesson 06b's exercises. Run: python notebooks/solutions/06b_pipeline_schedules.py"""
from lessons import report
from lessons.bylesson import schedules, zero_bubble


def one_f_one_b(p, m, rank):
    """Exercise 1: what rank `rank` of p runs in one 1F1B step of m micro-batches, in order.
    Warm-up: the forwards that fill the pipeline below it (p - 1 - rank of them, at most m); then
    one forward and one backward in turn; then the backwards left (the cool-down)."""
    warm = min(p - 1 - rank, m)
    ops = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        ops += [("F", warm + i), ("B", i)]
    return ops + [("B", i) for i in range(m - warm, m)]


def check_order(depths=(1, 2, 3, 4, 8), counts=(1, 2, 4, 5, 8, 16)):
    """one_f_one_b agrees with the order lesson 06b's ideal step is drawn from (schedules.order)."""
    for p in depths:
        for m in counts:
            assert [one_f_one_b(p, m, r) for r in range(p)] == schedules.order("1f1b", p, m), (p, m)
    return True


def check_log(name="pp_1f1b"):
    """one_f_one_b against the order each rank of the run ran its work in (one stage a rank), where
    the run is here: the ranks checked."""
    if not report.left_here(name, checkpoint=False):
        return 0
    ran = zero_bubble.order(name)
    m = schedules.layout(name)["microbatches"]
    for rank, ops in ran.items():
        assert [(kind, mb) for kind, _, mb in ops] == one_f_one_b(len(ran), m, rank), rank
    return len(ran)


def gpipe_step(p, m, f, b):
    """Exercise 2: a GPipe step with equal stages and free sends. The last stage starts its first
    forward after p - 1 forwards and runs m of them; its backwards start then, and the first stage
    runs its last backward p - 1 backwards after the last stage's: (m + p - 1)(f + b)."""
    return (m + p - 1) * (f + b)


def idle_share(p, m, f=1.0, b=2.0):
    """The share of a GPipe step each stage idles: it computes m (f + b) of it."""
    return 1 - m * (f + b) / gpipe_step(p, m, f, b)


def check_gpipe(depths=(1, 2, 3, 4, 8), counts=(1, 2, 4, 7, 16), f=0.5, b=1.25):
    """gpipe_step against schedules.simulate's ideal step, and its idle share against the
    formula."""
    for p in depths:
        for m in counts:
            ideal = schedules.simulate(schedules.order("gpipe", p, m), [f] * p, [b] * p)
            assert abs(schedules.span(ideal) - gpipe_step(p, m, f, b)) < 1e-9, (p, m)
            assert abs(idle_share(p, m, f, b) - schedules.theory(p, m)) < 1e-12, (p, m)
    return True


if __name__ == "__main__":
    print("rank 0 of 2, 4 micro-batches:", one_f_one_b(2, 4, 0))
    print("one_f_one_b agrees with schedules.order:", check_order())
    print(f"and with the order pp_1f1b ran in, on {check_log()} rank(s) (0: no run here yet)")
    print("gpipe_step agrees with schedules.simulate, its idle share with the formula:",
          check_gpipe())
    for p in (2, 4, 8):
        print(f"p = {p}, m = {4 * p}: a step of {gpipe_step(p, 4 * p, 1, 2):g} forward times, "
              f"{idle_share(p, 4 * p):.0%} idle")
