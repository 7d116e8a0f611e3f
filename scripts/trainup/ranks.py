"""What each rank of a DDP job did: its shard of the data, and its own numbers before they were summed.

A DDP run's log holds them (logs/README.md): the 'ddp' record says where each rank ran, the 'ranks'
records hold each rank's loss, accuracy, samples and first sample indices per epoch. shards() shows
DistributedSampler alone, without any process group.
"""
from pathlib import Path

from . import LOG_DIR
from .report import read_run


def shards(n, world, epochs=(1, 2), seed=0, set_epoch=True):
    """DistributedSampler's indices for each epoch and rank, over a data set of n samples: a table."""
    import pandas as pd
    from torch.utils.data import DistributedSampler
    rows = []
    for epoch in epochs:
        for rank in range(world):
            sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed)
            if set_epoch:
                sampler.set_epoch(epoch)
            rows.append(dict(epoch=epoch, rank=rank, indices=list(sampler)))
    return pd.DataFrame(rows)


def about_shards(table, n):
    """Sentences that hold for a shards() table, worked out from it."""
    out = []
    for epoch, group in table.groupby("epoch"):
        seen = [i for idx in group["indices"] for i in idx]
        repeats = len(seen) - len(set(seen))
        out.append(f"epoch {epoch}: {len(group)} shards of {len(group['indices'].iloc[0])}, together "
                   + ("every sample once" if repeats == 0 and len(set(seen)) == n else
                      f"all {len(set(seen))} samples, {repeats} of them twice (padding, so every rank takes "
                      f"as many steps)" if len(set(seen)) == n else "NOT every sample"))
    orders = [tuple(map(tuple, g["indices"])) for _, g in table.groupby("epoch")]
    out.append("every epoch the same order" if len(set(orders)) == 1 else "a new order every epoch")
    return "; ".join(out) + "."


def _records(name, kind, log_dir=LOG_DIR):
    return [r for r in read_run(Path(log_dir) / f"{name}.jsonl")["extra"] if r["type"] == kind]


def placement(name, log_dir=LOG_DIR):
    """Where each rank ran (from the 'ddp' record): rank, local rank, node rank, device."""
    import pandas as pd
    ddp = _records(name, "ddp", log_dir)[-1]
    return pd.DataFrame(ddp["ranks"])[["rank", "local_rank", "node_rank", "device"]]


def per_rank(name, log_dir=LOG_DIR):
    """One row per epoch and rank: that rank's own loss, accuracy, samples and first sample indices."""
    import pandas as pd
    rows = []
    for rec in _records(name, "ranks", log_dir):
        for i, rank in enumerate(rec["rank"]):
            rows.append(dict(epoch=rec["epoch"], rank=rank, loss=rec["loss"][i], accuracy=rec["accuracy"][i],
                             samples=rec["samples"][i], first_indices=rec["first_indices"][i]))
    return pd.DataFrame(rows).drop_duplicates(["epoch", "rank"], keep="last")


def rank0_against_job(name, log_dir=LOG_DIR):
    """Per epoch: what rank 0 alone would have logged, next to the job's (summed) numbers."""
    import pandas as pd
    ranks = per_rank(name, log_dir)
    job = pd.DataFrame(read_run(Path(log_dir) / f"{name}.jsonl")["epochs"])
    r0 = ranks[ranks["rank"] == 0].set_index("epoch")
    weighted = (ranks["loss"] * ranks["samples"]).groupby(ranks["epoch"]).sum() / ranks.groupby("epoch")["samples"].sum()
    return pd.DataFrame({"rank 0 loss": r0["loss"], "job loss": job.set_index("epoch")["loss"],
                         "mean of the ranks (by samples)": weighted, "rank 0 samples": r0["samples"],
                         "job samples": job.set_index("epoch")["samples"]})


def same_order_every_epoch(name, log_dir=LOG_DIR):
    """For each rank: did every epoch begin with the same sample indices?"""
    ranks = per_rank(name, log_dir)
    return {rank: g["first_indices"].map(tuple).nunique() == 1 for rank, g in ranks.groupby("rank")}
