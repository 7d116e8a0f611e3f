"""Lesson 09a2's prefetch section: FSDP2's all-gathers against the blocks' compute, read from the
profiler traces of _trainup_fsdp.py --shard parameters --profile STEPS, with and without
--prefetch.

    from lessons.bylesson import fsdp_prefetch as pf
    t = pf.overlap_table(["fsdp_prefetch0", "fsdp_prefetch1"])  # per run, rank and pass
    pf.about(t, "fsdp_prefetch0", "fsdp_prefetch1")            # sentences, directions computed
"""
from trainup import LOG_DIR

from . import traces as T
from ..launch import cores

GATHER = "gloo:all_gather"  # the bytes moving, on one of gloo's threads (NCCL: its kernel)
PASSES = ("forward", "backward")


def hidden(trace, phase):
    """(all-gather time in the pass, the part of it during which the main thread computed): ms.
    Compute is the main thread's operators outside FSDP's own ranges (copy-in, waits, copy-out),
    so an all-gather that the main thread waits for is not hidden."""
    ev = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    main = next(e["tid"] for e in ev if e["name"].startswith("ProfilerStep#"))
    window = T.union(T._ranges(e for e in ev if e["name"] == f"phase:{phase}"))
    gathers = T.intersect(T._ranges(e for e in ev if e["name"] == GATHER), window)
    fsdp = T._ranges(e for e in ev if e["tid"] == main and e["name"].startswith("FSDP::"))
    ops = T._ranges(e for e in ev if e["tid"] == main and e.get("cat") == "cpu_op"
                    and not T.is_comm(e))
    compute = T.subtract(T.intersect(ops, window), fsdp)
    return T.length(gathers) / 1e3, T.length(T.intersect(gathers, compute)) / 1e3


def prefetches(trace):
    """FSDP's explicit prefetches in the trace, per recorded step (its "forward_prefetch for"
    ranges): blocks - 1 a step with --prefetch 1, none without."""
    names = [e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"]
    return sum(n.startswith("FSDP::forward_prefetch") for n in names) / len(T.steps(trace))


def overlap_table(names, log_dir=LOG_DIR):
    """One row per run, rank and pass: all-gather ms, ms hidden behind compute, their ratio, the
    step's ms and the prefetches a step."""
    import pandas as pd
    rows = []
    for name in names:
        for rank, path in T.traces(name, log_dir).items():
            trace = T.load(path)
            steps = len(T.steps(trace))
            for phase in PASSES:
                gather, under = hidden(trace, phase)
                rows.append(dict(run=name, rank=rank, phase=phase, gather_ms=gather / steps,
                                 hidden_ms=under / steps, hidden=under / gather if gather else 0.0,
                                 step_ms=T.length(T.steps(trace)) / steps / 1e3,
                                 prefetches=prefetches(trace)))
    return pd.DataFrame(rows)


def about(t, plain, prefetched):
    """Sentences on the two runs: what share of the all-gathers computing hid, each pass, and the
    step's time against the most prefetching could save (the gather time it hid)."""
    mean = t.groupby(["run", "phase"])[["hidden", "gather_ms", "step_ms"]].mean()
    out = []
    for phase in PASSES:
        a, b = mean.loc[(plain, phase)], mean.loc[(prefetched, phase)]
        way = ("more" if b["hidden"] > a["hidden"] else "less" if b["hidden"] < a["hidden"]
               else "as much")
        out.append(f"{phase}: without prefetch {a['hidden']:.0%} of the all-gather time ran while "
                   f"the block computed, with it {b['hidden']:.0%} ({way}); the gathers took "
                   f"{a['gather_ms']:.1f} and {b['gather_ms']:.1f} ms a step.")
    a, b = mean.loc[(plain, "forward"), "step_ms"], mean.loc[(prefetched, "forward"), "step_ms"]
    hid = sum(t[(t["run"] == prefetched) & (t["phase"] == p)]["hidden_ms"].mean() for p in PASSES)
    # a step can gain at most the gather time prefetching hid: a larger difference is the machine's
    why = ("more than prefetching could save, so the difference is the machine's, and these few "
           "steps cannot tell what prefetching saves" if abs(a - b) > hid else
           "within what prefetching could save, but from 3 steps on shared cores the runs cannot "
           "tell it from noise")
    n = int(t["rank"].nunique())
    out.append(f"A recorded step took {a:.1f} ms without prefetch and {b:.1f} ms with it, a "
               f"difference of {abs(a - b):.1f} ms; the gathers prefetching hid took {hid:.1f} ms a "
               f"step: {why}. "
               f"{n} processes on {cores()} core(s): "
               + ("gloo's threads, which move the bytes, take turns with the compute on the same "
                  "cores, so a hidden gather frees little time here" if n >= cores() else
                  "gloo's threads had cores of their own")
               + "; on GPUs NCCL's kernels and copies run beside the compute.")
    return out


def plot(t, name):
    """All-gather ms a step per pass, the part hidden behind compute darker, per run (ranks'
    mean)."""
    import matplotlib.pyplot as plt

    from ..report import save
    mean = (t.groupby(["run", "phase"], sort=False)[["gather_ms", "hidden_ms"]].mean()
            .reset_index())
    fig, ax = plt.subplots(figsize=(7, 3))
    labels = [f"{r.run}\n{r.phase}" for r in mean.itertuples()]
    ax.barh(labels, mean["gather_ms"], color="#9ecae1",
            label="all-gather, nothing computed beside it")
    ax.barh(labels, mean["hidden_ms"], color="#08519c", label="all-gather while a block computed")
    ax.set_xlabel("ms a step (mean over ranks)")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    save(fig, name)
    return fig
