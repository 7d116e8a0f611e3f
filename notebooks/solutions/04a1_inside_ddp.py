"""Solutions to lesson 04a1's exercises. Run: python notebooks/solutions/04a1_inside_ddp.py"""
from lessons import report
from lessons.bylesson import collectives

CNN_GRADIENT_BYTES = 4687.8 * 1024  # the course's CNN: its gradients, the buckets' sum in 04a1


def ring_bytes(size_bytes, world):
    """Exercise 1: what each rank sends in a ring all-reduce. A reduce-scatter (world - 1 steps,
    each passing on one chunk of size/world bytes, summed on the way), then an all-gather
    (world - 1 more steps, each passing on a finished chunk): 2 (world - 1) / world of the size."""
    return 2 * (world - 1) * size_bytes / world


def busbw(size_bytes, time_s, world):
    """Exercise 1: nccl-tests' bus bandwidth in GB/s: the bytes one rank's link carried, over
    the time."""
    return ring_bytes(size_bytes, world) / time_s / 1e9


def check_formula(sizes=(1024, 4 * 2**20, 64 * 2**20), worlds=(2, 4, 8, 1024), time_s=1e-3):
    """busbw agrees with the course's collectives.bus_bandwidth (bytes/s), every size and world."""
    for size in sizes:
        for world in worlds:
            course = collectives.bus_bandwidth(size, time_s, world) / 1e9
            assert abs(busbw(size, time_s, world) - course) <= 1e-12 * course, (size, world)
    return True


def check_log(name="inside_bandwidth"):
    """busbw against each row the run logged (collectives.bandwidth_table); the rows checked."""
    table = collectives.bandwidth_table(name)
    for _, row in table.iterrows():
        mine = busbw(row["size_bytes"], row["time_s"], row["world_size"])
        assert abs(mine - row["busbw_gbps"]) <= 1e-9 * max(1.0, mine), row
    return len(table)


def cnn_allreduce_ms(world=8, bus_gbps=25.0, size_bytes=CNN_GRADIENT_BYTES):
    """Exercise 1: the CNN's gradients all-reduced over `world` ranks at a bus bandwidth of
    bus_gbps, latency aside: the bytes each link carries over its speed."""
    return ring_bytes(size_bytes, world) / (bus_gbps * 1e9) * 1e3


if __name__ == "__main__":
    print("busbw agrees with collectives.bus_bandwidth:", check_formula())
    if report.left_here("inside_bandwidth", checkpoint=False):
        print(f"and with the {check_log()} rows of the log of inside_bandwidth")
    print(f"the CNN's {CNN_GRADIENT_BYTES / 1e6:.1f} MB of gradients over 8 ranks at 25 GB/s: "
          f"{cnn_allreduce_ms():.3f} ms, latency aside")
