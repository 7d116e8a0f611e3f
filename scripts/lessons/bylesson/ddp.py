"""Lesson 04 (DDP): what each rank did, and how the job scaled.

What each rank of a DDP job did: its shard of the data, and its own numbers before they were summed.

A DDP run's log holds them (logs/README.md): the 'ddp' record says where each rank ran, the 'ranks'
records hold each rank's loss, accuracy, samples and first sample indices per epoch. shards() shows
DistributedSampler alone, without any process group.
"""
from pathlib import Path

from trainup import LOG_DIR

from .. import claims
from ..launch import cores
from ..log_reader import records as _records
from ..report import read_run, save


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


# Throughput, speedup and parallel efficiency of runs with 1, 2, 4... processes, against the ideal.

def scaling_table(runs):
    """From report.load_runs(...): per machine (measured_on) and world size, throughput, speedup over
    one process, the ideal speedup (= processes) and the efficiency (speedup / processes)."""
    # runs may be two tables joined (this machine's and the references'): their indexes repeat
    columns = ["measured_on", "run", "world_size", "batch_size", "samples_per_s"]
    t = runs[columns].reset_index(drop=True)
    t = t.sort_values(["measured_on", "world_size"])
    base = t.groupby("measured_on")["samples_per_s"].transform(
        lambda s: s[t.loc[s.index, "world_size"] == 1].iloc[0] if (t.loc[s.index, "world_size"] == 1).any() else float("nan"))
    t = t.assign(speedup=t["samples_per_s"] / base, ideal=t["world_size"].astype(float))
    return t.assign(efficiency=t["speedup"] / t["world_size"]).reset_index(drop=True)


def scaling_plot(t, name):
    """Three panels: throughput with its ideal line, speedup against ideal, efficiency against 100%."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for where, g in t.groupby("measured_on", sort=False):
        base = g["samples_per_s"].iloc[0] / g["speedup"].iloc[0]
        axes[0].plot(g["world_size"], g["samples_per_s"], "o-", label=f"measured ({where})")
        axes[0].plot(g["world_size"], base * g["world_size"], "k--", alpha=0.5, label="ideal")
        axes[1].plot(g["world_size"], g["speedup"], "o-", label=f"measured ({where})")
        axes[2].plot(g["world_size"], 100 * g["efficiency"], "o-", label=f"measured ({where})")
    axes[1].plot(t["world_size"], t["ideal"], "k--", alpha=0.5, label="ideal")
    axes[2].axhline(100, color="k", ls="--", alpha=0.5, label="ideal")
    for ax, ylabel in zip(axes, ("samples/s (whole job)", "speedup over 1 process", "efficiency (%)")):
        ax.set(xlabel="processes", ylabel=ylabel, xticks=sorted(t["world_size"].unique()))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    save(fig, name)
    return fig


def cores_note(t):
    """Honest sentences about this machine's cores against the processes, worked out, not typed."""
    here, most = cores(), int(t["world_size"].max())
    if most > here:
        note = (f"This machine lets these runs use {here} CPU core(s), fewer than the {most} processes of the "
                f"largest run: from {here + 1} processes on they take turns on the same cores, so that part of "
                f"the curve measures an overloaded machine, not DDP.")
    else:
        note = (f"This machine lets these runs use {here} CPU cores, enough for the {most} processes of the "
                f"largest run: each process could have a core to itself.")
    if claims.others_busy(here):  # other programs', not the runs' own processes
        note += (" Other programs were running too: then more processes also win a larger share of the "
                 "machine, which flatters the speedup.")
    return note


# Lesson 02's resident sweep on an H100: a step of this CNN takes about 2 ms from batch 16 to 512
# (launch-bound), and grows with the batch from about 1024 on (compute-bound).
PER_GPU = 1024
DIGITS_TRAIN = 4000  # the default data set's training samples


def gpu_plan(gpus, per_gpu=PER_GPU, digits=DIGITS_TRAIN):
    """Weak scaling on this machine's GPUs: (process counts, data flags, a sentence). Each GPU keeps
    per_gpu samples a step, so the global batch is per_gpu × N; N GPUs need that many samples. The
    digits hold 4,000: beyond, MNIST (60,000, downloaded once into data/)."""
    sizes = [n for n in (1, 2, 4, 8) if n <= gpus]
    if per_gpu * sizes[-1] <= digits:
        return sizes, [], f"{per_gpu} samples a GPU a step, on the digits"
    return sizes, ["--dataset", "mnist", "--download"], (
        f"{per_gpu} samples a GPU a step: {per_gpu * sizes[-1]:,} a step on {sizes[-1]} GPUs, "
        f"more than the {digits:,} digits, so MNIST (downloaded once into data/)")


def sweep_table(names, log_dir=LOG_DIR):
    """One row per timed 'sweep' record of each run: its world size, global batch and samples/s
    (timed steps after 2 warm-up steps, the GPU synchronised: steady state)."""
    import pandas as pd
    rows = []
    for name in names:
        r = read_run(Path(log_dir) / f"{name}.jsonl")
        world, backend = (r["env"] or {}).get("world_size", 1), (r["env"] or {}).get("backend")
        for s in (e for e in r["extra"] if e.get("type") == "sweep"):
            rows.append(dict(run=name, backend=backend, world_size=world,
                             batch_size=s["batch_size"], per_gpu=s["batch_size"] // world,
                             samples_per_s=s["samples_per_s"], step_ms=1000 * s["step_s"]))
    return pd.DataFrame(rows)


def weak_scaling(t):
    """From sweep_table: per world size, the repeats' median, their range, and the efficiency
    of weak scaling (throughput / (N × one GPU's)); 1.0 would be perfect."""
    g = t.groupby("world_size")["samples_per_s"]
    out = g.agg(["median", "min", "max", "count"]).reset_index()
    one = out.loc[out["world_size"] == 1, "median"]
    base = float(one.iloc[0]) if len(one) else float("nan")
    out["speedup"] = out["median"] / base
    out["efficiency"] = out["speedup"] / out["world_size"]
    return out.rename(columns={"median": "samples_per_s", "count": "repeats"})
