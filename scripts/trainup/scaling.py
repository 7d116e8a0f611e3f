"""Throughput, speedup and parallel efficiency of runs with 1, 2, 4... processes, against the ideal."""
from .launch import cores


def table(runs):
    """From report.load_runs(...): per machine (measured_on) and world size, throughput, speedup over
    one process, the ideal speedup (= processes) and the efficiency (speedup / processes)."""
    t = runs[["measured_on", "run", "world_size", "batch_size", "samples_per_s"]].sort_values(["measured_on", "world_size"])
    base = t.groupby("measured_on")["samples_per_s"].transform(
        lambda s: s[t.loc[s.index, "world_size"] == 1].iloc[0] if (t.loc[s.index, "world_size"] == 1).any() else float("nan"))
    t = t.assign(speedup=t["samples_per_s"] / base, ideal=t["world_size"].astype(float))
    return t.assign(efficiency=t["speedup"] / t["world_size"]).reset_index(drop=True)


def plot(t, name):
    """Three panels: throughput with its ideal line, speedup against ideal, efficiency against 100%."""
    import matplotlib.pyplot as plt
    from .report import save
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
    """One honest sentence about this machine's cores against the processes, worked out, not typed."""
    here, most = cores(), int(t["world_size"].max())
    if most > here:
        return (f"This machine lets these runs use {here} CPU core(s), fewer than the {most} processes of the "
                f"largest run: from {here + 1} processes on they take turns on the same cores, so that part of "
                f"the curve measures an overloaded machine, not DDP.")
    return (f"This machine lets these runs use {here} CPU cores, enough for the {most} processes of the largest "
            f"run: each process could have a core to itself (if nothing else was running).")
