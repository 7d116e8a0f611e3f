"""What the notebooks use: run a lesson script, read run logs back into tables, draw plots.

    from lessons import report
    report.run("_trainup_cpu.py", "--threads", "1", name="cpu_t1")
    runs = report.load_runs(["cpu_t1", "cpu_t2"])          # one row per run
    epochs = report.load_epochs(["cpu_t1", "cpu_t2"])      # one row per epoch
    report.plot(epochs, "epoch", "loss", "cpu_loss", title="Training loss")
"""
import os
import re
import shlex
import sys
from pathlib import Path

from trainup import CHECKPOINT_DIR, IMAGE_DIR, LOG_DIR, ROOT  # noqa: F401  report.ROOT
from trainup.meter import steady_rate

from . import jobs
from .log_reader import read_run  # noqa: F401  notebooks say report.read_run
from .placement import placed  # the device of every job, decided in one place

QUICK = os.environ.get("TRAINUP_QUICK", "0") == "1"  # the tests and the course command set it


def _paths(runs, log_dir):
    """Run names, log paths or glob patterns (relative to log_dir) -> log paths."""
    log_dir = Path(log_dir)
    out = []
    for r in [runs] if isinstance(runs, (str, Path)) else runs:
        r = str(r)
        if any(c in r for c in "*?["):
            out += sorted(log_dir.glob(r if r.endswith(".jsonl") else r + ".jsonl"))
        else:
            p = Path(r) if r.endswith(".jsonl") else log_dir / f"{r}.jsonl"
            out.append(p)
    return out


def measured_on(path):
    """'here' for this machine's runs; for a committed reference log, its folder's name (<machine>_<date>)."""
    path = Path(path)
    return path.parent.name if path.parent.parent.name == "reference" else "here"


def load_runs(runs, log_dir=LOG_DIR):
    """A table with one row per run: its configuration, environment and final summary."""
    import pandas as pd
    rows = []
    for path in _paths(runs, log_dir):
        r = read_run(path)
        cfg, env, summary = r["config"] or {}, r["env"] or {}, r["summary"] or {}
        args = cfg.get("args", {})
        rows.append(dict(
            run=cfg.get("run", path.stem), lesson=cfg.get("lesson"), measured_on=measured_on(path),
            dataset=args.get("dataset"), model=args.get("model"), batch_size=args.get("batch_size"),
            threads=env.get("threads"), world_size=env.get("world_size"), backend=env.get("backend"),
            device=env.get("device"), gpus=", ".join(env.get("gpus") or []) or None, host=env.get("host"),
            cpu_count=env.get("cpu_count"), torch=env.get("torch"),
            status=summary.get("status", "unfinished"), epochs=len(r["epochs"]),
            first_loss=r["epochs"][0]["loss"] if r["epochs"] else None,
            loss=summary.get("loss"), test_accuracy=summary.get("test_accuracy"),
            epoch_s=sum(e["wall_s"] for e in r["epochs"]) / max(len(r["epochs"]), 1),
            samples_per_s=steady_rate(r["epochs"]) or summary.get("samples_per_s"),
            peak_mem_mb=summary.get("peak_mem_mb"),
            wall_s=summary.get("wall_s"), problems="; ".join(r["problems"]), path=str(path)))
    return pd.DataFrame(rows)


def load_epochs(runs, log_dir=LOG_DIR):
    """A table with one row per epoch of each run (column 'run' says which)."""
    import pandas as pd
    frames = [pd.DataFrame(read_run(p)["epochs"]) for p in _paths(runs, log_dir)]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def left_here(name, checkpoint=True, quick=None, log_dir=LOG_DIR, checkpoint_dir=CHECKPOINT_DIR):
    """Whether an earlier lesson's run can be read here: its log says it finished, in this mode
    (quick or full, so that a comparison pairs runs of one length), and its checkpoint is there.
    A lesson that compares with another lesson's run reads it where that lesson left it, and makes
    it where it is missing: on Colab, or in a fresh clone, each notebook runs alone."""
    quick = QUICK if quick is None else quick
    path = Path(log_dir) / f"{name}.jsonl"
    if not path.exists() or (checkpoint and not (Path(checkpoint_dir) / f"{name}.pt").exists()):
        return False
    r = read_run(path)
    done = r["summary"] is not None and r["summary"].get("status") == "finished"
    return done and not r["problems"] and bool(r["config"]["args"].get("quick")) == bool(quick)


def check(name, log_dir=LOG_DIR):
    """One sentence that holds whatever the timings: finished, loss fell, log follows the schema."""
    r = read_run(Path(log_dir) / f"{name}.jsonl")
    finished = r["summary"] is not None and r["summary"]["status"] == "finished"
    losses = [e["loss"] for e in r["epochs"]]
    fell = len(losses) >= 2 and losses[-1] < losses[0]
    sweeps = [e for e in r["extra"] if e.get("type") == "sweep"]
    parts = [f"{name}: " + ("finished" if finished else "DID NOT FINISH"),
             f"{len(losses)} epochs",
             "the training loss fell" if fell else "the training loss DID NOT FALL",
             "the log follows the schema" if not r["problems"] else "LOG PROBLEMS: " + "; ".join(r["problems"])]
    if sweeps and not losses:  # a throughput sweep (--sweep) trains no epochs
        parts[1:3] = [f"{len(sweeps)} batch sizes measured"]
    return ", ".join(parts) + "."


def run(script, *args, name, quick=None, timeout=900, env=None):
    """Run scripts/<script> from the course's top folder, as a learner would in a terminal.

    Its output goes to logs/<name>.stdout (the script writes it); this prints the command and one
    checked sentence, and raises with the end of the output if the script fails.
    """
    quick = QUICK if quick is None else quick
    if "--resume" not in map(str, args):
        forget(name)  # a cell's run starts from nothing, the first time the cell runs as the tenth
    cmd = [sys.executable, f"scripts/{script}", *placed(script, args), "--run-name", name] + ["--quick"] * quick
    print("$ python", shlex.join(cmd[1:]))
    proc = jobs.run(cmd, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    if proc.returncode != 0:
        raise failed(script, proc.stderr, proc.returncode)
    print(check(name, LOG_DIR))
    from . import checks
    checks.finished(name, LOG_DIR)  # a run that exits 0 but did not finish or broke the schema fails the cell
    return name


# A script's own sentence for bad input or a refused run ("error: ..."; under torchrun with --tee or a
# rank prefix, "[rank0]: error: ..."), which launchers print 20-40 lines of their own after.
COURSE_ERROR = re.compile(r"^(?:\[rank\d+\]:\s*)?error: (.*)$", re.M)


def failed(what, output, code):
    """The error a cell raises for a job that failed: the course's sentence first, then the end of what the
    launcher printed (torchrun's ChildFailedError, horovodrun's RuntimeError), for whoever wants it."""
    found = COURSE_ERROR.search(output)
    head = f"{what} exited with status {code}" + (f": {found.group(1)}" if found else "")
    return RuntimeError(f"{head}\n--- the end of its output ---\n{output[-3000:]}")


def forget(name):
    """Delete a run's log, output and checkpoint: the next run of that name starts from nothing."""
    for path in (LOG_DIR / f"{name}.jsonl", LOG_DIR / f"{name}.stdout", CHECKPOINT_DIR / f"{name}.pt"):
        path.unlink(missing_ok=True)


def plot(df, x, y, name, hue="run", kind="line", title=None, xlabel=None, ylabel=None, ax=None, **kw):
    """One line per value of hue (or bars), saved to images/<name>.png.

    Returns the figure, closed: a notebook shows it once, as the cell's value (not again at cell end).
    """
    import matplotlib.pyplot as plt
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(6.4, 3.6))
    if kind == "bar":
        ax.bar(df[x].astype(str), df[y], **kw)
    else:
        for key, group in df.groupby(hue, sort=False):
            ax.plot(group[x], group[y], marker="o", label=str(key), **kw)
        ax.legend(fontsize="small")
    ax.set(title=title or f"{y} by {x}", xlabel=xlabel or x, ylabel=ylabel or y)
    if kind != "bar" and df[x].dtype.kind in "iu":  # epochs, process counts: whole numbers on the axis
        from matplotlib.ticker import MaxNLocator
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    save(fig, name)
    return fig


DPI = 150  # sharp on a high-density laptop screen, small enough for a notebook's stored output


def readable(fig):
    """What every figure of the course gets before it is shown: each axes' legend outside its data
    (right of it), one entry per label (a line drawn in each panel is named once), and log axes
    ticked in plain numbers (0.5, 4, 300), not 4x10^0."""
    from matplotlib.ticker import FuncFormatter, NullFormatter
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    inside = [ax for ax in fig.axes
              if ax.get_legend() is not None and ax.get_legend().get_bbox_to_anchor() == ax.bbox]
    for ax in inside:
        handles, labels = ax.get_legend_handles_labels()
        named = dict(zip(labels, handles))  # the last of a label's lines keeps its name
        box = ax.get_position()
        right = [o for o in fig.axes if o is not ax and o.get_position().x0 >= box.x1
                 and o.get_position().y0 < box.y1 and o.get_position().y1 > box.y0]
        if not right:  # the rightmost panel of its row: beside it
            ax.legend(named.values(), named.keys(), fontsize="small", loc="upper left",
                      bbox_to_anchor=(1.01, 1), borderaxespad=0, frameon=False)
        elif any(set(named) <= set(o.get_legend_handles_labels()[1]) for o in right
                 if o.get_legend() is not None):
            ax.get_legend().remove()  # a panel to its right names the same lines
        else:  # under it, where the next panel is not
            ax.legend(named.values(), named.keys(), fontsize="small", loc="upper center",
                      bbox_to_anchor=(0.5, -0.18), ncol=2, frameon=False)
        for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
            if scale == "log":
                axis.set_major_formatter(plain)
                axis.set_minor_formatter(NullFormatter() if len(axis.get_majorticklocs()) > 2
                                         else plain)
    return fig


def save(fig, name):
    """Made readable (readable()), saved to images/<name>.png and closed (so notebooks show it once,
    as the cell's value)."""
    import matplotlib.pyplot as plt
    IMAGE_DIR.mkdir(parents=True, exist_ok=True)
    readable(fig)
    fig.tight_layout()
    fig.savefig(IMAGE_DIR / f"{name}.png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return IMAGE_DIR / f"{name}.png"
