"""Solutions to lesson 07's exercises. Run: python notebooks/solutions/07_lightning.py"""
import math


def steps_per_epoch(n, global_batch, world):
    """Exercise 1: (samples per rank, optimizer steps per epoch). DistributedSampler pads n up
    to a multiple of world (repeating the first samples), so every rank gets ceil(n / world);
    each takes global_batch / world."""
    if global_batch % world:
        raise ValueError(f"a global batch of {global_batch} cannot be split evenly over {world} "
                         "processes")
    per_rank = math.ceil(n / world)
    return per_rank, math.ceil(per_rank / (global_batch // world))


def padded_shares(n, world):
    """Exercise 2: the indices each rank gets from DistributedSampler(shuffle=False): the list
    padded to a multiple of world by repeating its first indices, then dealt out one by one."""
    total = math.ceil(n / world) * world
    indices = list(range(n))
    indices += (indices * math.ceil(total / n))[:total - n]
    return [indices[rank:total:world] for rank in range(world)]


def overcount(n, world):
    """Exercise 2: how many samples the ranks' summed test counts hold twice."""
    return sum(len(share) for share in padded_shares(n, world)) - n


if __name__ == "__main__":
    print("world 6, batch 64:", end=" ")
    try:
        steps_per_epoch(4000, 64, 6)
    except ValueError as e:
        print(e)
    for world in (1, 2, 4, 6):
        print(f"world {world}, batch 48: {steps_per_epoch(4000, 48, world)} "
              "(samples per rank, steps)")
    for world in (2, 4):
        print(f"257 test samples on {world} ranks: {overcount(257, world)} counted twice")
