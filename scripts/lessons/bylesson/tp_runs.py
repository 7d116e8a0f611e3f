"""Lesson 09 (sharding), its tensor-parallel section: what each rank holds, the collectives of one step
against Megatron-LM's count, and throughput, read from the 'tp' and 'tp_comm' records of _trainup_tp.py
(logs/README.md).

    from lessons.bylesson import tp_runs as tpl
    tpl.memory_table(["tp_one", "tp_2", "tp_2x2"])  # bytes per rank, measured beside replicated + sharded/tp
    tpl.comm_table("tp_2")                           # one step's collectives, beside the theory
"""
import math
from pathlib import Path

from trainup import LOG_DIR

from ..log_reader import records
from ..report import read_run, save

FLOAT_BYTES = 4  # fp32 on the CPU; a --precision 64 run (a proof) sends 8 a value


def layout(name, log_dir=LOG_DIR):
    """The run's 'tp' record: tp, dp, the plan, where each rank sits, the bytes each holds."""
    return records(name, "tp", log_dir)[-1]


def label(cfg):
    return "one process" if cfg["tp"] * cfg["dp"] == 1 else (f"tp {cfg['tp']}" if cfg["dp"] == 1
                                                             else f"dp {cfg['dp']} x tp {cfg['tp']}")


def memory_table(names, log_dir=LOG_DIR):
    """One row per run: the bytes of parameters rank 0 holds, measured, beside what the plan says it should
    hold: the layers cut over tp (1/tp of them), everything else whole; under dp, FSDP shards it all once more."""
    import pandas as pd
    rows = []
    for name in names:
        cfg = layout(name, log_dir)
        tp, dp = cfg["tp"], cfg["dp"]
        replicated = cfg["full_param_bytes"] - cfg["full_sharded_bytes"]
        expected = (replicated + cfg["full_sharded_bytes"] / tp) / dp
        rows.append(dict(run=name, layout=label(cfg), tp=tp, dp=dp, processes=tp * dp,
                         model_mb=cfg["full_param_bytes"] / 1e6, held_mb=cfg["param_bytes"][0] / 1e6,
                         expected_mb=expected / 1e6, sharded_held_mb=cfg["sharded_bytes"][0] / 1e6,
                         sharded_full_mb=cfg["full_sharded_bytes"] / 1e6,
                         share_of_model=cfg["param_bytes"][0] / cfg["full_param_bytes"],
                         same_on_every_rank=len(set(cfg["param_bytes"])) == 1))
    return pd.DataFrame(rows)


def about_memory(t):
    """A sentence per run: what rank 0 held, against the model and the plan's expectation."""
    out = []
    for _, r in t.iterrows():
        if r["processes"] == 1:
            out.append(f"{r['layout']}: holds the whole model, {r['held_mb']:.3f} MB of parameters.")
            continue
        match = abs(r["held_mb"] - r["expected_mb"]) <= 0.01 * r["expected_mb"]
        out.append(f"{r['layout']}: each rank holds {r['held_mb']:.3f} MB, {r['share_of_model']:.0%} of the model "
                   f"({r['sharded_held_mb']:.3f} MB of the {r['sharded_full_mb']:.3f} MB of cut layers, the rest whole"
                   + (", then sharded over dp" if r["dp"] > 1 else "") + "); "
                   + ("as the plan says" if match else f"NOT the {r['expected_mb']:.3f} MB the plan says") + ".")
    return out


def memory_plot(t, name):
    """Bytes of parameters one rank holds, per layout: the layers cut over tp and the rest."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    rest = t["held_mb"] - t["sharded_held_mb"]
    ax.bar(t["layout"], t["sharded_held_mb"], label="layers cut over tp (up, down)")
    ax.bar(t["layout"], rest, bottom=t["sharded_held_mb"], label="the rest (stem, head, norms, down's bias)")
    ax.set(title="Parameters one rank holds", ylabel="MB")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize="small")
    save(fig, name)
    return fig


def comm_table(name, log_dir=LOG_DIR, rank=0):
    """One step's collectives on one rank: phase, op, mesh dimension, calls, bytes (summed over the calls)."""
    import pandas as pd
    rec = records(name, "tp_comm", log_dir)[-1]
    rows = rec["collectives"][rank]
    return pd.DataFrame(rows, columns=["phase", "op", "dimension", "calls", "bytes"])


def theory(cfg, per_replica_batch, value_bytes=FLOAT_BYTES):
    """Megatron-LM's count for a column- then row-parallel MLP: per block, one all-reduce of the block's
    output in forward and one of its input gradient in backward, each batch x width values, over tp."""
    if cfg["tp"] == 1:
        return dict(calls=0, bytes_per_call=0)
    return dict(calls=cfg["blocks"], bytes_per_call=per_replica_batch * cfg["width"] * value_bytes)


def tp_allreduces(name, log_dir=LOG_DIR):
    """Measured against theory, per phase: [(phase, calls, bytes per call, theory calls, theory bytes)]."""
    cfg = layout(name, log_dir)
    rec = records(name, "tp_comm", log_dir)[-1]
    args = (read_run(Path(log_dir) / f"{name}.jsonl")["config"] or {}).get("args", {})
    want = theory(cfg, rec["per_replica_batch"], 8 if args.get("precision") == "64" else FLOAT_BYTES)
    t = comm_table(name, log_dir)
    out = []
    for phase in ("forward", "backward"):
        g = t[(t["phase"] == phase) & (t["op"] == "all_reduce") & (t["dimension"] == "tp")]
        calls, size = int(g["calls"].sum()), int(g["bytes"].sum())
        out.append((phase, calls, size / calls if calls else 0, want["calls"], want["bytes_per_call"]))
    return out


def about_comm(name, log_dir=LOG_DIR):
    """Sentences computed from one step's collectives: the tp all-reduces against theory, and what data
    parallelism over dp added."""
    cfg = layout(name, log_dir)
    if cfg["tp"] * cfg["dp"] == 1:
        return [f"{label(cfg)}: no collectives ({len(comm_table(name, log_dir))} kinds counted)."]
    out = []
    for phase, calls, per_call, want_calls, want_bytes in tp_allreduces(name, log_dir):
        verdict = "as Megatron-LM counts" if (calls, per_call) == (want_calls, want_bytes) else (
            f"NOT the {want_calls} of {want_bytes:,.0f} bytes Megatron-LM counts")
        out.append(f"{label(cfg)}, {phase}: {calls} all-reduce(s) over tp of {per_call:,.0f} bytes each "
                   f"(one per block, batch x width floats), {verdict}.")
    t = comm_table(name, log_dir)
    dp = t[t["dimension"] == "dp"]
    if len(dp):
        parts = [f"{int(r['calls'])} {r['op'].replace('_', '-')}(s) in {r['phase']} ({r['bytes'] / 1e6:.2f} MB)"
                 for _, r in dp.iterrows()]
        out.append(f"{label(cfg)}: FSDP over dp added " + ", ".join(parts)
                   + ": it gathers each block's parameters before using them and reduce-scatters the gradients.")
    step = t[t["phase"] == "step"]
    if step.empty:
        out.append(f"{label(cfg)}: the optimizer step communicated nothing: each rank updates the slices it holds.")
    else:
        out.append(f"{label(cfg)}: the optimizer step ran {int(step['calls'].sum())} collective(s).")
    return out


def comm_plot(names, name, log_dir=LOG_DIR):
    """Bytes moved by one step's collectives on rank 0, per layout, by operation and mesh dimension."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    kinds = {}
    for run in names:
        t = comm_table(run, log_dir)
        for (op, dim), g in t.groupby(["op", "dimension"]):
            kinds.setdefault(f"{op} over {dim}", {})[label(layout(run, log_dir))] = g["bytes"].sum() / 1e6
    labels = [label(layout(run, log_dir)) for run in names]
    bottom = [0.0] * len(labels)
    for kind, by_label in kinds.items():
        values = [by_label.get(lab, 0.0) for lab in labels]
        ax.bar(labels, values, bottom=bottom, label=kind)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set(title="Bytes of collectives in one training step (rank 0)", ylabel="MB")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize="small")
    save(fig, name)
    return fig


def throughput(names, log_dir=LOG_DIR):
    """Samples per second of each run in steady state, over its epochs after the first (the first
    also warms up and counts the collectives): report.steady_rate."""
    from ..log_reader import read_run
    from ..report import steady_rate
    return {n: float(steady_rate(read_run(Path(log_dir) / f"{n}.jsonl")["epochs"])) for n in names}


def when_tp_pays(one, name, log_dir=LOG_DIR, alpha_beta=None):
    """Why run `name` is slower (or faster) than one process `one`, from their steady-state steps:
    the tp run's step against 1/tp of one process's compute (its best case: a perfect cut), the
    difference spread over the tp all-reduces one step runs (tp_comm), each against the compute
    it lets a process skip. alpha_beta (seconds, bytes/s: lesson 11's fit of an all-reduce sweep)
    splits the difference into what the all-reduces themselves cost by the alpha-beta model and
    the rest. dict of the numbers and `sentence`."""
    cfg, rec = layout(name, log_dir), records(name, "tp_comm", log_dir)[-1]
    batch = rec["per_replica_batch"] * cfg["dp"]  # samples a step, the same in both runs
    rate = throughput([one, name], log_dir)
    one_s, tp_s = batch / rate[one], batch / rate[name]
    share = one_s / cfg["tp"]  # what each process would compute if cutting cost nothing
    t = comm_table(name, log_dir)
    ar = t[(t["op"] == "all_reduce") & (t["dimension"] == "tp")]
    calls, size = int(ar["calls"].sum()), int(ar["bytes"].sum())
    extra, saved = tp_s - share, one_s - share
    ratio = extra / saved
    verdict = (f"in this pair of single runs {label(cfg)} was slower than one process" if ratio > 1
               else f"in this pair of single runs {label(cfg)} was faster than one process")
    collective = math.nan
    split = ""
    if alpha_beta:
        from ..perfmodel import ring_all_reduce
        collective = calls * ring_all_reduce(size / calls, cfg["tp"], *alpha_beta)
        split = (f" By lesson 11's alpha-beta model the all-reduces themselves take "
                 f"{collective * 1e3:.2f} ms of it ({collective / calls * 1e3:.3f} ms each); the "
                 f"other {(extra - collective) * 1e3:.2f} ms is everything else: DTensor's dispatch "
                 f"and redistributions around them, and the processes' turns on the cores.")
    sentence = (
        f"One process computes a step of {batch} samples in {one_s * 1e3:.2f} ms; cut "
        f"{cfg['tp']} ways, at best {share * 1e3:.2f} ms a process. {label(cfg)} took "
        f"{tp_s * 1e3:.2f} ms a step: {extra * 1e3:.2f} ms more, around its {calls} all-reduces "
        f"of activations a step ({size / calls:,.0f} bytes each), {extra / calls * 1e3:.3f} ms "
        f"an all-reduce, {ratio:.1f}× the {saved / calls * 1e3:.3f} ms of compute each lets a "
        f"process skip: {verdict}.{split} "
        f"Tensor parallelism pays when an all-reduce costs less than the compute it saves: a "
        f"block's products grow with batch × width × hidden ({batch} × {cfg['width']} × "
        f"{cfg['hidden']} here), its all-reduce with batch × width only, so wide layers on fast "
        f"links (NVLink) turn the ratio. (Steps from the steady-state rate: the step tp_comm "
        f"timed, the first, took {rec['step_s'] * 1e3:.1f} ms, first calls allocating and "
        f"DTensor working out its layouts.)")
    return dict(one_step_s=one_s, tp_step_s=tp_s, share_s=share, extra_s=extra, calls=calls,
                ratio=ratio, collective_s=collective, sentence=sentence)


def processes_note(processes, cores):
    """Whether a job's processes had a core each: the sentence computed from the cores this machine gives."""
    if processes <= cores:
        return f"{processes} processes ran on {cores} core(s), one each."
    return (f"{processes} processes ran on {cores} core(s), {processes / cores:.0f} per core: they took turns, so "
            f"this run shows the layout and its correctness, not its speed; the model is kept tiny for that reason.")


def plot_cuts(name, image, log_dir=LOG_DIR):
    """The run's plan drawn for one MLP block, from its 'tp' record: a row a rank of one tp group,
    X (every rank the same) times its columns of A (up, colwise: weight Shard(0) of the Linear's
    out x in, so Y = XA's columns), relu, times its rows of B (down, rowwise: Shard(1)) gives a
    partial sum; one all-reduce adds them. Saved to images/<image>.png."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    cfg = layout(name, log_dir)
    tp, width, hidden = cfg["tp"], cfg["width"], cfg["hidden"]
    assert cfg["plan"] == {"up": "colwise", "down": "rowwise"}, cfg["plan"]
    unit = 1.6 / max(width, hidden)  # the matrices drawn to scale
    w, h, rows = width * unit, hidden * unit, 0.5  # X's rows: a batch, drawn at one height
    fig, ax = plt.subplots(figsize=(10, 1.2 + 1.4 * tp))

    def matrix(x, y, cols, height, part=None, parts=1, by="columns", colour="0.6", text=""):
        ax.add_patch(Rectangle((x, y - height / 2), cols, height, fc="white", ec="0.4"))
        if part is None:
            ax.add_patch(Rectangle((x, y - height / 2), cols, height, fc=colour, alpha=0.35))
        elif by == "columns":
            ax.add_patch(Rectangle((x + part * cols / parts, y - height / 2), cols / parts, height,
                                   fc=colour, alpha=0.6))
        else:
            ax.add_patch(Rectangle((x, y + height / 2 - (part + 1) * height / parts), cols,
                                   height / parts, fc=colour, alpha=0.6))
        ax.text(x + cols / 2, y - height / 2 - 0.08, text, ha="center", va="top", fontsize=7)

    step = 2.1 * max(w, h, 0.8)
    for r in range(tp):
        y, c = -r * 2.4, f"C{r}"
        matrix(0, y, w, rows, text=f"X: batch x {width}\n(every rank)")
        ax.text(w + 0.15, y, "x", ha="center", va="center")
        matrix(w + 0.3, y, h, w, part=r, parts=tp, colour=c,
               text=f"A (up, ColwiseParallel)\n{width} x {hidden}: its columns")
        x = w + 0.3 + h + step * 0.25
        ax.text(x, y, "relu ->", ha="left", va="center", fontsize=8)
        x += 0.6
        matrix(x, y, h, rows, part=r, parts=tp, colour=c,
               text=f"Y's columns\nbatch x {hidden // tp}")
        ax.text(x + h + 0.15, y, "x", ha="center", va="center")
        x += h + 0.3
        matrix(x, y, w, h, part=r, parts=tp, by="rows", colour=c,
               text=f"B (down, RowwiseParallel)\n{hidden} x {width}: its rows")
        x += w + 0.2
        ax.text(x, y, "=", ha="left", va="center")
        x += 0.3
        matrix(x, y, w, rows, colour=c, text=f"a partial sum\nbatch x {width}")
        ax.text(x + w + 0.1, y, f"rank {r}", ha="left", va="center", fontsize=9, color=c)
    right = x + w + 0.9
    ax.annotate("", xy=(right, -(tp - 1) * 2.4), xytext=(right, 0),
                arrowprops=dict(arrowstyle="<->", color="0.2"))
    ax.text(right + 0.1, -(tp - 1) * 1.2, "one all-reduce:\nZ = the sum,\nthen down's bias",
            va="center", fontsize=8)
    ax.set_xlim(-0.2, right + 1.6)
    ax.set_ylim(-(tp - 1) * 2.4 - 1.5, 1.0)
    ax.axis("off")
    ax.set_title(f"{name}: one MLP block on tp = {tp} ranks, Y = XA with A cut by columns, then "
                 f"B by rows: one all-reduce in forward", fontsize=10)
    save(fig, image)
    return fig
