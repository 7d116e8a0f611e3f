"""Solutions to lesson 09f's exercises. Run: python notebooks/solutions/09f_compile.py"""

import math

from trainup.parallel import compiled

# the float64 CNN's parameters, from its output backwards (the order backward makes gradients)
CNN_BACKWARDS = {"fc2": 1_290, "fc1": 1_179_776, "conv2": 18_496, "conv1": 320}


def buckets(cap_mb, sizes=CNN_BACKWARDS, element_bytes=8):
    """Exercise 1: DDPOptimizer's buckets (torch/_dynamo/backends/distributed.py): parameters
    counted backwards; before each one, a bucket that holds the cap or more (the first: 1 MiB or
    more) is closed and a new one started. One compiled graph per bucket."""
    cap, out = cap_mb * 2**20, [[]]
    held = 0
    for name, count in sizes.items():
        limit = compiled.FIRST_BUCKET_BYTES if len(out) == 1 else cap
        if held >= limit:
            out.append([])
            held = 0
        out[-1].append(name)
        held += count * element_bytes
    return out


def steps_to_pay(first_step_s=150.0, compiled_step_s=0.70, eager_step_s=0.75):
    """Exercise 2: the first step costs first_step_s - eager_step_s more than an eager one; every
    later step saves eager_step_s - compiled_step_s. Whole steps until the savings cover it."""
    return 1 + math.ceil((first_step_s - eager_step_s) / (eager_step_s - compiled_step_s))


if __name__ == "__main__":
    for cap in (1, 25):
        print(f"Exercise 1: --bucket-cap-mb {cap}: {buckets(cap)}, {len(buckets(cap))} graphs")
    print("  the first bucket closes at 1 MiB whatever the cap: fc2 and fc1 fill it")
    print(f"Exercise 2: compiling has paid after {steps_to_pay()} steps")
