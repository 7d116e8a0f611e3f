"""Tables and plots for the GPU lessons (02 one GPU, 03 DataParallel): runs made here and reference logs.

    paths = gpu.logs("gpu_cpu") + gpu.references("gpu_*")   # here, and measured elsewhere
    gpu.runs(paths)                    # one row per run, with the flags that matter on a GPU
    gpu.sweeps(paths)                  # one row per batch size of each --sweep run
    gpu.plot_utilisation(path, "x")    # GPU utilisation and memory over time, beside throughput

A reference log lives in logs/reference/<machine>_<date>/; its rows say so in 'measured_on'.
"""
from pathlib import Path

from trainup import LOG_DIR

from .. import report

ARGS = ("device", "gpus", "batch_size", "workers", "no_pin_memory", "resident", "precision", "model", "dataset")
NO_GPU = ("No NVIDIA GPU here, so this notebook runs its scripts on the CPU; the GPU runs, the batch sweep "
          "on a GPU and the utilisation plots need one, and come from reference logs when any are committed.")


def has_gpu():
    import torch
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


# What lesson 02b measures on the GPU it finds: DataLoader workers and pinned memory, then fp32 against fp16
# and bf16 on the same resident sweep (bf16 only where the GPU has it: compute capability 8.0 on).
HERE_ON_GPU = {"gpu_here_workers0": ("--workers", 0), "gpu_here_workers2": ("--workers", 2),
               "gpu_here_workers2_nopin": ("--workers", 2, "--no-pin-memory")}
HERE_PRECISIONS = {"gpu_here_sweep_fp32": "32", "gpu_here_sweep_fp16": "16", "gpu_here_sweep_bf16": "bf16"}


def measure_on_this_gpu(quick=report.QUICK):
    """Lesson 02b's GPU measurements on this machine's GPU 0; the run names (workers, then precision sweeps)."""
    import torch
    from trainup import devices
    names = []
    for name, flags in HERE_ON_GPU.items():
        # 2 epochs at least: steady state is the epochs after the first, which starts the workers
        names.append(report.run("_trainup_gpu.py", "--device", "cuda", *flags,
                                "--epochs", 2 if quick else 3,
                                "--no-progress", name=name))
    sizes, steps = ("64,256,1024", 10) if quick else ("64,128,256,512,1024,2048", 50)
    no_bf16 = devices.bf16_sentence(torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
    for name, precision in HERE_PRECISIONS.items():
        if precision == "bf16" and no_bf16:
            print(no_bf16)
            continue
        names.append(report.run("_trainup_gpu.py", "--device", "cuda", "--resident", "--precision", precision,
                                "--sweep", sizes, "--sweep-steps", steps, "--no-progress", name=name))
    return names


def logs(*names, log_dir=LOG_DIR):
    """This machine's logs of these runs (those that exist)."""
    return [p for p in (Path(log_dir) / f"{n}.jsonl" for n in names) if p.exists()]


def references(pattern, log_dir=LOG_DIR):
    """Committed logs measured elsewhere, logs/reference/<machine>_<date>/<pattern>.jsonl; [] when none."""
    return sorted(Path(log_dir).glob(f"reference/*/{pattern}.jsonl"))


def about_references(pattern, log_dir=LOG_DIR):
    """One sentence: which reference logs there are for pattern, or that none have been committed yet."""
    found = references(pattern, log_dir)
    if not found:
        return (f"No reference logs matching {pattern}.jsonl have been committed yet under logs/reference/: "
                f"run tools/gpu_reference_runs.sh on a machine with a GPU to measure them.")
    where = sorted({p.parent.name for p in found})
    return f"{len(found)} reference logs matching {pattern}.jsonl, measured on {', '.join(where)} (not here)."


def _label(row):
    return row["run"] if row["measured_on"] == "here" else f"{row['run']} ({row['measured_on']})"


def runs(paths, log_dir=LOG_DIR):
    """report.load_runs, with the flags of lessons 02 and 03 and a label that says where each run ran."""
    import pandas as pd
    table = report.load_runs([str(p) for p in paths], log_dir)
    if table.empty:
        return table
    table["measured_on"] = [report.measured_on(p) for p in table["path"]]
    args = pd.DataFrame([(report.read_run(p)["config"] or {}).get("args", {}) for p in table["path"]])
    table = table.rename(columns={"gpus": "gpu_names"})
    for key in ARGS:
        if key not in ("batch_size", "model", "dataset"):
            table[key] = args[key] if key in args else None
    table["label"] = table.apply(_label, axis=1)
    table["run_samples_per_s"] = table["samples_per_s"]
    table["samples_per_s"] = [warm_throughput(p) for p in table["path"]]
    return table


def warm_throughput(path):
    """samples/s of a run in steady state: the course's one throughput (trainup.meter.steady_rate),
    its first epoch, which pays for start-up, left out."""
    r = report.read_run(path)
    return report.steady_rate(r["epochs"]) or (r["summary"] or {}).get("samples_per_s")


def first_epochs(table):
    """A sentence per GPU run of table (gpu.runs): its first epoch beside steady state, from its
    log. No direction is claimed: one run's epochs are not repeats of the same thing."""
    said = []
    for _, row in table[table["device"].astype(str).str.startswith("cuda")].iterrows():
        epochs = report.read_run(row["path"])["epochs"]
        if len(epochs) > 1 and epochs[0].get("samples_per_s"):
            first, warm = epochs[0], row["samples_per_s"]
            workers = row.get("workers")
            known = workers is not None and workers == workers  # not None, not NaN
            start = ("" if not known else f"; it started {workers:.0f} DataLoader worker(s)"
                     if workers else "; no DataLoader workers to start")
            said.append(f"{row['label']}: its first epoch took {first['wall_s']:.2f} s "
                        f"({first['samples_per_s']:,.0f} samples/s{start}); steady state "
                        f"{warm:,.0f} samples/s.")
    return said


def samples(path):
    """The 'gpu' records of one log (utilisation and memory over time), as a table; empty when none."""
    import pandas as pd
    table = pd.DataFrame([e for e in report.read_run(path)["extra"] if e.get("type") == "gpu"])
    for column in ("utilization_pct", "memory_used_mb", "memory_total_mb"):  # None (not reported) -> NaN
        if column in table:
            table[column] = pd.to_numeric(table[column], errors="coerce")
    return table


def sweeps(paths):
    """One row per batch size of each sweep, with the mean GPU utilisation while it ran (None without samples)."""
    import pandas as pd
    rows = []
    for path in paths:
        r = report.read_run(path)
        gpu = samples(path)
        args = (r["config"] or {}).get("args", {})
        for s in (e for e in r["extra"] if e.get("type") == "sweep"):
            start = s["time"] - s["step_s"] * s["steps"]  # the record is written when its timed steps end
            during = gpu[(gpu["sampled_at"] >= start) & (gpu["sampled_at"] <= s["time"])] if len(gpu) else gpu
            rows.append(dict(run=r["config"]["run"], measured_on=report.measured_on(path),
                             device=(r["env"] or {}).get("device"), precision=args.get("precision"),
                             resident=args.get("resident"), workers=args.get("workers"),
                             batch_size=s["batch_size"], samples_per_s=s["samples_per_s"],
                             step_ms=s["step_s"] * 1000, peak_mem_mb=s["peak_mem_mb"],
                             gpu_util_pct=during["utilization_pct"].mean() if len(during) else None))
    table = pd.DataFrame(rows)
    if len(table):
        table["label"] = table.apply(_label, axis=1)
    return table


def plot_sweep(table, name, title="Throughput against batch size"):
    """samples/s against batch size (log scale), one line per run, and beside it the mean GPU utilisation
    at each batch size when the runs sampled any; saved to images/<name>.png."""
    import matplotlib.pyplot as plt
    util = table.dropna(subset=["gpu_util_pct"]) if "gpu_util_pct" in table else table.iloc[:0]
    fig, axes = plt.subplots(1, 2 if len(util) else 1, figsize=(11 if len(util) else 6.4, 3.8), squeeze=False)
    panels = [(table, "samples_per_s", "samples/s", title)]
    if len(util):
        panels.append((util, "gpu_util_pct", "GPU utilisation %", "GPU utilisation while it ran"))
    for ax, (data, y, ylabel, text) in zip(axes[0], panels):
        for label, group in data.groupby("label", sort=False):
            ax.plot(group["batch_size"], group[y], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set(title=text, xlabel="batch size", ylabel=ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
    report.save(fig, name)
    return fig


def plot_bars(table, y, name, title, ylabel, x="label"):
    """One bar per run (labelled with where it ran); saved to images/<name>.png."""
    import matplotlib.pyplot as plt
    longest = max((len(str(v)) for v in table[x]), default=0)  # a reference's label names its GPU
    fig, ax = plt.subplots(figsize=(max(6.4, 3.5 + 0.08 * longest), 0.5 + 0.45 * len(table)))
    ax.barh(table[x].astype(str), table[y])
    ax.invert_yaxis()
    ax.set(title=title, xlabel=ylabel)
    ax.grid(alpha=0.3, axis="x")
    report.save(fig, name)
    return fig


def plot_utilisation(path, name, title=None):
    """Top: each GPU's utilisation and memory over the run. Bottom: throughput over the same time
    (each epoch, or each batch size of a sweep, as a bar as wide as it lasted). Saved to images/<name>.png."""
    import matplotlib.pyplot as plt
    r, gpu = report.read_run(path), samples(path)
    if gpu.empty:
        raise ValueError(f"{path} holds no GPU samples (a CPU run, or nvitop could not read the GPU)")
    t0 = (gpu["sampled_at"] - gpu["elapsed_s"]).iloc[0]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    memory = top.twinx()
    for index, g in gpu.groupby("gpu"):
        top.plot(g["elapsed_s"], g["utilization_pct"], label=f"GPU {index} utilisation")
        memory.plot(g["elapsed_s"], g["memory_used_mb"] / 1024, linestyle="--", label=f"GPU {index} memory")
    top.set(ylabel="utilisation %", ylim=(0, 105), title=title or f"{r['config']['run']} ({report.measured_on(path)})")
    memory.set_ylabel("memory used, GiB (dashed)")
    if gpu["memory_total_mb"].notna().any():  # some GPUs (MIG slices) report no total
        memory.set_ylim(0, gpu["memory_total_mb"].max() / 1024 * 1.05)
    top.legend(fontsize="small", loc="lower right")
    top.grid(alpha=0.3)
    spans = [(e["time"] - e["step_s"] * e["steps"], e["step_s"] * e["steps"], e["samples_per_s"], str(e["batch_size"]))
             for e in r["extra"] if e.get("type") == "sweep"]
    # an epoch's record is written after its test pass, so its bar ends a little after its training did
    spans += [(e["time"] - e["wall_s"], e["wall_s"], e["samples_per_s"], f"epoch {e['epoch']}") for e in r["epochs"]]
    for start, width, rate, text in spans:
        bottom.bar(start - t0, rate, width=width, align="edge", color="tab:green", alpha=0.6, edgecolor="black")
        bottom.annotate(text, (start - t0 + width / 2, rate), ha="center", va="bottom", fontsize="x-small")
    bottom.set(xlabel="seconds since the run started training", ylabel="samples/s (sweeps: by batch size)")
    bottom.grid(alpha=0.3)
    report.save(fig, name)
    return fig


def plot_scaling(table, name, title="DataParallel: throughput against GPU count"):
    """samples/s against the number of GPUs, one line per model and machine; saved to images/<name>.png."""
    table = table.assign(series=table["model"] + " (" + table["measured_on"] + ")").sort_values("gpus")
    fig = report.plot(table, "gpus", "samples_per_s", name, hue="series", title=title, xlabel="GPUs",
                      ylabel="samples/s")
    fig.axes[0].set_xticks(sorted(table["gpus"].unique()))
    report.save(fig, name)
    return fig


PHASES = ("scatter_s", "replicate_s", "forward_s", "gather_s", "backward_s")


def phases(paths):
    """The 'dp_phases' records (_trainup_dp.py --phases): milliseconds per phase of one DataParallel step."""
    import pandas as pd
    rows = []
    for path in paths:
        for e in (e for e in report.read_run(path)["extra"] if e.get("type") == "dp_phases"):
            rows.append(dict(run=e["run"], measured_on=report.measured_on(path), gpus=e["gpus"], batch_size=e["batch_size"],
                             **{p[:-2] + "_ms": e[p] * 1000 for p in PHASES}))
    table = pd.DataFrame(rows)
    if len(table):
        table["label"] = table.apply(_label, axis=1)
    return table


def plot_phases(table, name, title="One DataParallel step, phase by phase"):
    """One stacked bar per run: where the time of a step goes; saved to images/<name>.png."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 1.4 + 0.5 * len(table)))
    left = 0
    for phase in PHASES:
        column = phase[:-2] + "_ms"
        ax.barh(table["label"], table[column], left=left, label=phase[:-2])
        left = left + table[column]
    ax.invert_yaxis()
    ax.set(title=title, xlabel="milliseconds per step")
    ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(alpha=0.3, axis="x")
    report.save(fig, name)
    return fig


DP_STEPS = ("1 scatter", "2 replicate", "3 parallel_apply", "4 gather")


def dp_step(batch, gpus):
    """What DataParallel.forward does with a batch of `batch` samples on `gpus` GPUs, step by step
    (torch/nn/parallel/data_parallel.py): the pieces scatter cuts (as torch.chunk does), and the
    GPUs that get a replica: only those with a piece (replicate takes device_ids[:len(inputs)])."""
    import torch
    pieces = [len(p) for p in torch.arange(batch).chunk(gpus)]
    return dict(batch=batch, gpus=gpus, pieces=pieces + [0] * (gpus - len(pieces)),
                replicas=len(pieces))


def plot_dp_step(step, name):
    """dp_step drawn: a row a GPU, a column a step of one forward, in the order DataParallel takes
    them; saved to images/<name>.png."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch
    gpus, pieces = step["gpus"], step["pieces"]
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.75 * gpus))
    colours = dict(piece="C0", model="C1", compute="C2", out="C3", none="0.85")

    def box(col, row, text, kind):
        ax.add_patch(FancyBboxPatch((col * 2.6 + 0.1, -row - 0.35), 2.2, 0.7, fc=colours[kind],
                                    alpha=0.35 if kind != "none" else 1, ec="0.3",
                                    boxstyle="round,pad=0.02"))
        ax.text(col * 2.6 + 1.2, -row, text, ha="center", va="center", fontsize=8)

    for g, n in enumerate(pieces):
        if not n:  # no piece: no replica, no thread, nothing to gather
            for col in range(4):
                box(col, g, "nothing", "none")
            continue
        box(0, g, f"{n} sample{'s' * (n > 1)} copied here", "piece")
        box(1, g, "GPU 0's model" if g == 0 else "a copy of GPU 0's model", "model")
        box(2, g, f"thread {g}: forward on {n}", "compute")
        box(3, g, f"all {step['batch']} outputs, the loss" if g == 0 else "output sent to GPU 0",
            "out")
    ax.set_yticks([-g for g in range(gpus)], [f"GPU {g}" for g in range(gpus)])
    ax.set_xticks([c * 2.6 + 1.2 for c in range(4)], DP_STEPS)
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_xlim(0, 4 * 2.6)
    ax.set_ylim(-gpus + 0.45, 0.55)
    ax.set_xlabel("backward: each replica's gradients are summed into GPU 0's model, where the "
                  "optimizer steps; the next forward copies the model again", fontsize=8)
    ax.set_title(f"One DataParallel forward, one process: a batch of {step['batch']} on {gpus} "
                 f"GPUs, the model copied every step", fontsize=10, pad=22)
    report.save(fig, name)
    return fig
