"""Solutions to lesson 07's exercises. Run: python notebooks/solutions/07_lightning.py"""
import math

REMOVED = {"dp": "Lightning 2 removed strategy 'dp': use strategy='ddp'",
           "horovod": "Lightning 2 removed strategy 'horovod': use strategy='ddp', or Horovod without Lightning"}
PRECISION = {16: "16-mixed", "16": "16-mixed", "bf16": "bf16-mixed", 32: "32-true", "32": "32-true"}


def to_lightning2(kwargs):
    """Exercise 1: a Lightning 1.x Trainer keyword dict -> the 2.x one (devices + accelerator, precision names)."""
    out = dict(kwargs)
    for old, accelerator in (("gpus", "gpu"), ("num_processes", "cpu"), ("tpu_cores", "tpu")):
        if old in out:
            out["devices"], out["accelerator"] = out.pop(old), accelerator
    if out.get("strategy") in REMOVED:
        raise ValueError(REMOVED[out["strategy"]])
    if "precision" in out:
        out["precision"] = PRECISION.get(out["precision"], out["precision"])
    return out


def steps_per_epoch(n, global_batch, world):
    """Exercise 2: (samples per rank, optimizer steps per epoch). DistributedSampler pads n up to a multiple of
    world (repeating the first samples), so every rank gets ceil(n / world); each takes global_batch / world."""
    if global_batch % world:
        raise ValueError(f"a global batch of {global_batch} cannot be split evenly over {world} processes")
    per_rank = math.ceil(n / world)
    return per_rank, math.ceil(per_rank / (global_batch // world))


def mean_of_means(rank_means):
    """Exercise 3: all_reduce(AVG) of each rank's epoch mean, as a hand-written sync often does."""
    return sum(rank_means) / len(rank_means)


def job_mean(rank_means, rank_samples):
    """Exercise 3: the whole job's mean loss: every sample weighs the same."""
    return sum(m * n for m, n in zip(rank_means, rank_samples)) / sum(rank_samples)


def lightning_synced(rank_means, rank_samples):
    """Exercise 3: what self.log(..., on_epoch=True, sync_dist=True) reports. Lightning keeps, per rank, the sum of
    value x batch size and the sum of batch sizes, and averages each of them over the ranks before dividing
    (pytorch_lightning/trainer/connectors/logger_connector/result.py, _ResultMetric.compute): the ranks' count
    cancels, and what remains is the job's sample-weighted mean."""
    world = len(rank_means)
    weighted = sum(m * n for m, n in zip(rank_means, rank_samples)) / world
    return weighted / (sum(rank_samples) / world)


def lightning_sync_check(records):
    """Exercise 3, on the 'lightning_sync' records of a run with sync_dist: the largest gap between what was logged
    and the job's loss (float rounding only)."""
    return max(abs(r["logged_loss"] - job_mean(r["rank_loss"], r["rank_samples"])) for r in records)


def padded_shares(n, world):
    """Exercise 4: the indices each rank gets from DistributedSampler(shuffle=False): the list padded to a
    multiple of world by repeating its first indices, then dealt out one by one."""
    total = math.ceil(n / world) * world
    indices = list(range(n))
    indices += (indices * math.ceil(total / n))[:total - n]
    return [indices[rank:total:world] for rank in range(world)]


def overcount(n, world):
    """Exercise 4: how many samples the ranks' summed test counts hold twice."""
    return sum(len(share) for share in padded_shares(n, world)) - n


if __name__ == "__main__":
    print(to_lightning2(dict(gpus=4, num_nodes=2, strategy="ddp", precision=16)))
    try:
        to_lightning2(dict(gpus=2, strategy="dp"))
    except ValueError as e:
        print(e)
    print("world 6, batch 64:", end=" ")
    try:
        steps_per_epoch(4000, 64, 6)
    except ValueError as e:
        print(e)
    for world in (1, 2, 4, 6):
        print(f"world {world}, batch 48: {steps_per_epoch(4000, 48, world)} (samples per rank, steps)")
    means, counts = [2.0, 1.0], [256, 64]  # an uneven split: rank 1 saw fewer samples
    print(f"mean of the ranks' means {mean_of_means(means):.3f}, job mean {job_mean(means, counts):.3f}, "
          f"Lightning's sync_dist {lightning_synced(means, counts):.3f}")
    for world in (2, 4):
        print(f"257 test samples on {world} ranks: {overcount(257, world)} counted twice")
