"""Solutions to lesson 09d's exercises. Run: python notebooks/solutions/09d_context_parallel.py"""

from trainup.parallel import context_parallel as cp


def bytes_per_step(attention, world, batch=64, rows=28, width=16, layers=2, bytes_per_value=8):
    """Exercise 1: what one process sends for attention in one training step, forward and
    backward together (context_parallel.expected_bytes: the formula the runs are checked
    against). Per layer, with B one process's block of keys: ring (6 cp - 4) B, Ulysses
    8 (cp - 1) / cp B."""
    sent = cp.expected_bytes(attention, world, batch, rows, width, layers, bytes_per_value)
    return sent["forward"] + sent["backward"]


def smallest_cp_where_ulysses_sends_under_a_third(rows=840):
    """Exercise 1: the smallest cp whose Ulysses bytes are under a third of the ring's; 8 (cp-1)/cp
    < (6 cp - 4) / 3 holds from cp = 4 (a sequence of 840 tokens cuts into 2 to 8 blocks)."""
    for world in range(2, 9):
        if rows % world == 0 and (3 * bytes_per_step("ulysses", world, rows=rows)
                                  < bytes_per_step("ring", world, rows=rows)):
            return world
    return None


def imbalance(world, rows=28, zigzag=False):
    """Exercise 2: the most loaded process's query-key pairs over the least loaded's, causal."""
    pairs = cp.visible_scores(world, rows, causal=True, zigzag=zigzag)
    return max(pairs) / min(pairs)


if __name__ == "__main__":
    print(f"Exercise 1: Ulysses sends under a third of the ring's bytes from cp = "
          f"{smallest_cp_where_ulysses_sends_under_a_third()}")
    for world in (2, 4, 7):
        print(f"Exercise 2: cp {world}: contiguous {imbalance(world):.2f} x, zig-zag "
              f"{imbalance(world, zigzag=True):.2f} x")
