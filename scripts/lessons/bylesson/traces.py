"""Lessons 08 to 08b (monitoring and profiling): profiler traces read back (08: top operators; 08a, for
DDP: how much of a step is computation, communication and both at once), TensorBoard scalars written and
read back, and the GPU samples of the course's logs beside the training statistics (08b).

    from lessons.bylesson import traces
    traces.top_operators("prof_cpu")       # the operators that took the most time, per step
    traces.key_averages("prof_cpu")        # the profiler's own tables, as the run wrote them
    traces.phase_table(trace)              # each step's phases: data, forward, backward, optimizer
    traces.memory_by_phase(trace)          # bytes allocated and freed in each phase
    traces.split_table("prof_ddp")         # one row per rank: computation, communication, overlap, idle
    traces.to_tensorboard(["prof_ddp"])    # the course's logs as TensorBoard scalars
    traces.scalars(profiling.TB_DIR)       # read back with tensorboard's EventAccumulator

The traces are chrome-trace JSON written by `--profile STEPS` (trainup/profiling.py). HolisticTraceAnalysis
computes the same split from GPU kernels; on a CPU trace there are none, so the split is computed here from
the operators' and collectives' time ranges.
"""
import json
from pathlib import Path

from trainup import LOG_DIR, ROOT
from trainup.profiling import PHASES, trace_dir

from ..report import read_run, save

TB_DIR = LOG_DIR / "tensorboard"
REFERENCE_DIR = ROOT / "logs" / "reference"
# CPU (gloo): c10d::allreduce_ hands a bucket over on the main thread; gloo:all_reduce is the collective
# itself on a pt_gloo_runloop thread, waiting for the other ranks included. GPU: NCCL kernels.
COMM_PREFIXES = ("c10d::", "gloo:", "nccl")
BACKWARD = "autograd::engine::evaluate_function"
PARTS = ("computation only", "overlap", "communication only", "idle")


# --- the traces ---------------------------------------------------------------------------------------

def traces(run, log_dir=LOG_DIR):
    """{rank: trace path}: the newest trace of each rank of a --profile run."""
    found = {}
    for path in sorted(trace_dir(log_dir, run).glob(f"{run}.rank*.pt.trace.json")):
        rank = int(path.name[len(run) + len(".rank"):].split(".")[0])
        found[rank] = path  # names end with a time in ns: sorted, the newest wins
    if not found:
        raise AssertionError(f"{run}: no profiler trace under profiles/{run}/ (was it run with --profile?)")
    return found


def relative(path):
    """A path as a learner types it from the course's folder (unchanged when it lies elsewhere)."""
    path = Path(path)
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def load(path):
    """A trace as a dict (chrome-trace JSON: 'traceEvents')."""
    return json.loads(Path(path).read_text())


def has_gpu_kernels(trace):
    return any(e.get("cat") == "kernel" for e in trace["traceEvents"])


def engine_sentence(trace):
    """Which analysis applies, decided by what the trace holds."""
    if has_gpu_kernels(trace):
        return ("This trace holds GPU kernels: HolisticTraceAnalysis (pip install holistictraceanalysis) computes "
                "the same split from them (TraceAnalysis(trace_dir=...).get_comm_comp_overlap()); below, the "
                "kernels' time ranges, NCCL kernels as communication.")
    return ("This trace holds no GPU kernels, so HolisticTraceAnalysis' overlap and idle-time breakdowns (built "
            "on GPU kernels; NaN on CPU traces) do not apply: the split below is computed from the CPU "
            "operators' and gloo collectives' time ranges.")


def hta_overlap(run, log_dir=LOG_DIR):
    """HolisticTraceAnalysis' computation/communication overlap per rank, for GPU traces, where it is
    installed (pip install holistictraceanalysis); None where it is not."""
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        return None
    return TraceAnalysis(trace_dir=str(trace_dir(log_dir, run))).get_comm_comp_overlap()


def _ranges(events):
    return [(e["ts"], e["ts"] + e["dur"]) for e in events]


def is_comm(event):
    return event["name"].startswith(COMM_PREFIXES) or "nccl" in event["name"].lower()


# On a CUDA trace Kineto writes each record_function range twice: on the CPU thread that opened
# it, and again (category "gpu_user_annotation") on the GPU rows, spanning the kernels it launched.
GPU_ANNOTATION = "gpu_user_annotation"


def _annotations(trace, prefix, gpu=False):
    """The ranges named prefix...: the CPU thread's (gpu=False), or their copies on the GPU rows."""
    return [e for e in trace["traceEvents"] if e.get("ph") == "X"
            and e.get("name", "").startswith(prefix) and (e.get("cat") == GPU_ANNOTATION) == gpu]


def steps(trace, gpu=False):
    """The recorded training steps: ProfilerStep#N ranges (start, end) in microseconds, as the CPU
    thread ran them; gpu=True: the same steps on the GPU rows (from the first kernel a step launched
    to the end of its last; empty on a CPU trace)."""
    return sorted(_ranges(_annotations(trace, "ProfilerStep#", gpu)))


def launches(trace):
    """Per recorded step, (collectives launched inside backward, launched elsewhere): c10d's calls. DDP
    launches each bucket's all-reduce from backward as its last gradient is ready; any other collective
    of a step (a check, a metric) is launched outside it."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    backward = _ranges(e for e in events if e["name"].startswith(BACKWARD))
    calls = [e["ts"] for e in events if e["name"].startswith("c10d::")]
    counts = []
    for start, end in steps(trace):
        mine = [t for t in calls if start <= t < end]
        inside = sum(any(a <= t <= b for a, b in backward) for t in mine)
        counts.append((inside, len(mine) - inside))
    return counts


# --- time ranges as sorted lists of disjoint (start, end) ---------------------------------------------

def union(ranges):
    out = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        elif b > a:
            out.append((a, b))
    return out


def intersect(x, y):
    x, y, out, i, j = union(x), union(y), [], 0, 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if b > a:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(x, y):
    out = []
    for a, b in union(x):
        for c, d in union(y):
            if d <= a or c >= b:
                continue
            if c > a:
                out.append((a, c))
            a = max(a, d)
        if b > a:
            out.append((a, b))
    return out


def length(ranges):
    return sum(b - a for a, b in union(ranges))


# --- computation against communication ----------------------------------------------------------------

def split(trace):
    """Shares of the recorded steps' time (they sum to 1): computation only, overlap (computing while a
    collective is in flight), communication only, idle (neither: Python, data loading, waiting); and
    comm_in_backward, the share of communication time that ran while backward was computing.

    CPU trace: computation is the main thread's operators (its c10d hand-offs excluded), communication the
    collectives on any thread. GPU trace: kernels, NCCL's as communication, inside the steps' ranges
    on the GPU rows (an approximation of HTA's attribution of kernels to steps by launch)."""
    ev = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    window = steps(trace)
    if not window:
        raise AssertionError("the trace has no ProfilerStep#N range: no training step was recorded")
    if has_gpu_kernels(trace):
        # kernels run after the CPU launched them: the steps' windows on the GPU rows hold the
        # kernels each step launched (CPU windows would drop the last step's late kernels and take
        # in the warm-up's); an older trace without them falls back to the CPU windows
        window = steps(trace, gpu=True) or window
        kernels = [e for e in ev if e.get("cat") == "kernel"]
        comm = _ranges(e for e in kernels if is_comm(e))
        comp = _ranges(e for e in kernels if not is_comm(e))
        backward = []  # a kernel does not say which pass launched it
    else:
        main = next(e["tid"] for e in ev if e["name"].startswith("ProfilerStep#")
                    and e.get("cat") != GPU_ANNOTATION)
        ops = [e for e in ev if e.get("cat") in ("cpu_op", "user_annotation")]  # gloo's are annotations
        comm = _ranges(e for e in ops if is_comm(e))
        main_ops = [e for e in ops if e["tid"] == main and e["cat"] == "cpu_op"]
        comp = subtract(_ranges(main_ops), _ranges(e for e in main_ops if is_comm(e)))  # less the hand-offs
        backward = _ranges(e for e in main_ops if e["name"].startswith(BACKWARD))
    comm, comp = intersect(comm, window), intersect(comp, window)
    total, both = length(window), length(intersect(comp, comm))
    busy = length(comp + comm)
    shares = {"computation only": (length(comp) - both) / total, "overlap": both / total,
              "communication only": (length(comm) - both) / total, "idle": (total - busy) / total}
    return dict(shares, steps=len(window), step_ms=total / len(window) / 1e3,
                communication=length(comm) / total, computation=length(comp) / total,
                comm_in_backward=length(intersect(comm, backward)) / length(comm) if comm and backward else None)


def split_table(run, log_dir=LOG_DIR):
    """One row per rank: split() of its trace."""
    import pandas as pd
    rows = [dict(rank=rank, **split(load(path))) for rank, path in traces(run, log_dir).items()]
    return pd.DataFrame(rows)


def about_split(table):
    """Computed sentences: the communication share, what of it overlapped computing, the idle share."""
    out = []
    for _, r in table.iterrows():
        s = (f"Rank {r['rank']:.0f}: a step took {r['step_ms']:.0f} ms on average over {r['steps']:.0f} steps; "
             f"{r['communication']:.0%} of it had a collective in flight and {r['computation']:.0%} computed")
        if r["communication"] > 0:
            hidden = r["overlap"] / r["communication"]
            s += (f"; {hidden:.0%} of the communication overlapped computation"
                  + (f" ({r['comm_in_backward']:.0%} of it ran during backward)" if r["comm_in_backward"] is not None
                     and r["comm_in_backward"] == r["comm_in_backward"] else "")
                  + f", {1 - hidden:.0%} did not")
        out.append(s + f"; {r['idle']:.0%} was neither (Python, data loading, waiting).")
    return out


def split_plot(table, name, title="Where a step's time went, per rank"):
    """Stacked bars: computation only, overlap, communication only, idle, per rank."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 1.7 + 0.5 * len(table)))
    left = [0.0] * len(table)
    for part, colour in zip(PARTS, ("tab:blue", "tab:purple", "tab:red", "0.8")):
        ax.barh([f"rank {r}" for r in table["rank"]], table[part], left=left, color=colour, label=part)
        left = [a + b for a, b in zip(left, table[part])]
    ax.set(xlim=(0, 1), xlabel="share of the recorded steps' time", title=title)
    ax.legend(fontsize="small", ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    save(fig, name)
    return fig


# --- one step, drawn ------------------------------------------------------------------------------

PHASE_COLOURS = {"data": "0.75", "forward": "tab:blue", "backward": "tab:orange",
                 "optimizer": "tab:green"}


def step_timeline(trace, step=-1):
    """One recorded step (the last by default) as ranges in milliseconds from the step's start:
    rows (lane, part, start_ms, end_ms). Lane "main thread": the step's phases (phase:<name>
    ranges, trainup/profiling.py). Lane "collectives": what was in flight, merged: on a CPU trace
    the collectives on the threads that run them (gloo's), on a GPU trace the communication
    kernels. launches: the main thread's c10d calls (DDP handing a bucket over), in ms."""
    import pandas as pd
    start, end = steps(trace)[step]
    ev = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e
          and e.get("cat") != GPU_ANNOTATION]
    main = next(e["tid"] for e in ev if e["name"].startswith("ProfilerStep#"))
    if has_gpu_kernels(trace):
        comm = [e for e in ev if e.get("cat") == "kernel" and is_comm(e)]
    else:
        comm = [e for e in ev if is_comm(e) and e["tid"] != main]
    window = [(start, end)]
    rows = [("main thread", p, a, b) for p, a, b in phase_ranges(trace) if start <= a < end]
    rows += [("collectives", "in flight", a, b) for a, b in intersect(_ranges(comm), window)]
    table = pd.DataFrame(rows, columns=["lane", "part", "start_ms", "end_ms"])
    table[["start_ms", "end_ms"]] = (table[["start_ms", "end_ms"]] - start) / 1e3
    launched = [(e["ts"] - start) / 1e3 for e in ev
                if e["tid"] == main and e["name"].startswith("c10d::") and start <= e["ts"] < end]
    return table, launched, (end - start) / 1e3


def about_timeline(rank, table, launched):
    """A sentence of what the drawn step holds, every number from the trace: backward()'s range,
    the all-reduces DDP launched inside it, and how long before backward() returned the first
    collective was already in flight."""
    back = union([(a, b) for _, a, b in table.loc[table["part"] == "backward",
                                                  ["start_ms", "end_ms"]].itertuples()])
    comm = union([(a, b) for _, a, b in table.loc[table["lane"] == "collectives",
                                                  ["start_ms", "end_ms"]].itertuples()])
    if not back or not comm:
        return f"Rank {rank}: the drawn step has no backward range or no collective to compare."
    inside = sum(back[0][0] <= t <= back[-1][1] for t in launched)
    return (f"Rank {rank}: backward() ran from {back[0][0]:.1f} to {back[-1][1]:.1f} ms; DDP "
            f"launched {inside} of {len(launched)} all-reduce(s) inside it, the first collective "
            f"in flight from {comm[0][0]:.1f} ms, {back[-1][1] - comm[0][0]:.1f} ms before "
            f"backward() returned.")


def timeline_plot(by_rank, name, title="One DDP step, per rank: backward and the all-reduce"):
    """Per rank, two lanes over one step: the main thread's phases and the collectives in
    flight; a tick where DDP launched a bucket's all-reduce. by_rank: {rank: step_timeline()}."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.9 * len(by_rank)))
    labels = []
    for i, (rank, (table, launched, _)) in enumerate(sorted(by_rank.items())):
        y_main, y_comm = 2 * i + 1, 2 * i
        for _, r in table.iterrows():
            y = y_main if r["lane"] == "main thread" else y_comm
            colour = PHASE_COLOURS.get(r["part"], "tab:red")
            ax.barh(y, r["end_ms"] - r["start_ms"], left=r["start_ms"], height=0.7, color=colour)
        ax.plot(launched, [y_main + 0.45] * len(launched), "v", color="black", markersize=5)
        labels += [(y_comm, f"rank {rank}: collectives"), (y_main, f"rank {rank}: main thread")]
    ax.set_yticks([y for y, _ in labels], [text for _, text in labels])
    ax.set(xlabel="milliseconds from the step's start", title=title)
    handles = [Patch(color=c, label=p) for p, c in PHASE_COLOURS.items()]
    handles += [Patch(color="tab:red", label="all-reduce in flight"),
                plt.Line2D([], [], marker="v", color="black", linestyle="", label="bucket launched")]
    ax.legend(handles=handles, fontsize="small", ncol=3, loc="upper center",
              bbox_to_anchor=(0.5, -0.35))
    save(fig, name)
    return fig


# --- top operators --------------------------------------------------------------------------------------

def self_times(events):
    """(event, self time): its duration less that of the operators directly inside it (on its thread)."""
    out = []
    by_thread = {}
    for e in events:
        by_thread.setdefault((e["pid"], e["tid"]), []).append(e)
    for evs in by_thread.values():
        stack = []  # [event, children's time]
        for e in sorted(evs, key=lambda e: (e["ts"], -e["dur"])):
            while stack and e["ts"] >= stack[-1][0]["ts"] + stack[-1][0]["dur"]:
                out.append((stack[-1][0], stack[-1][0]["dur"] - stack[-1][1]))
                stack.pop()
            if stack:
                stack[-1][1] += e["dur"]
            stack.append([e, 0.0])
        out += [(ev, ev["dur"] - inner) for ev, inner in stack]
    return out


def top_operators(run, rank=0, n=10, log_dir=LOG_DIR):
    """The n operators with the most self time over the recorded steps: calls, self and total ms per step,
    and self time as a share of a step. gloo's collectives run on their own threads, at the same time as the
    main thread's operators (so the shares can add up past 100 %), and count their waiting."""
    import pandas as pd
    trace = load(traces(run, log_dir)[rank])
    window = steps(trace)
    on_gpu = steps(trace, gpu=True) or window  # kernels run in the steps' ranges on the GPU rows

    def recorded(e):
        return any(a <= e["ts"] < b for a, b in (on_gpu if e.get("cat") == "kernel" else window))
    inside = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e
              and e.get("cat") != GPU_ANNOTATION
              and (e.get("cat") in ("cpu_op", "kernel") or is_comm(e)) and recorded(e)]
    t = pd.DataFrame([dict(operator=e["name"], self_us=s, total_us=e["dur"]) for e, s in self_times(inside)])
    per_step = length(window) / len(window)
    g = t.groupby("operator").agg(calls=("self_us", "size"), self_us=("self_us", "sum"), total_us=("total_us", "sum"))
    g = g.sort_values("self_us", ascending=False).head(n).reset_index()
    return pd.DataFrame(dict(operator=g["operator"], calls_per_step=g["calls"] / len(window),
                             self_ms_per_step=g["self_us"] / len(window) / 1e3,
                             total_ms_per_step=g["total_us"] / len(window) / 1e3,
                             self_share=g["self_us"] / len(window) / per_step))


# --- the profiler's own tables, the step's phases, memory ----------------------------------------

def key_averages(run, rank=0, log_dir=LOG_DIR):
    """{title: table}: the key_averages tables a --profile run wrote beside its trace
    (trainup/profiling.py, one per '## <title>' line of <run>.rank<R>.key_averages.txt)."""
    path = trace_dir(log_dir, run) / f"{run}.rank{rank}.key_averages.txt"
    if not path.exists():
        raise AssertionError(f"{run}: no {path.name} under profiles/{run}/ "
                             "(was it run with --profile?)")
    parts = path.read_text().split("## ")[1:]
    return {title: table for title, _, table in (p.partition("\n") for p in parts)}


def table_rows(table):
    """A key_averages table as a DataFrame of its text cells, one column per header (Name,
    Self CPU, CPU Mem, ..., # of Calls as an int): columns lie where the rule line has dashes."""
    import re
    import pandas as pd
    lines = table.splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("---")]
    spans = [m.span() for m in re.finditer(r"-+", lines[rules[0]])]
    cells = [[line[a:b].strip() for a, b in spans] for line in lines[rules[0] + 1:rules[2]]]
    t = pd.DataFrame(cells[2:], columns=cells[0])
    return t.assign(**{"# of Calls": t["# of Calls"].astype(int)})


def phase_ranges(trace):
    """The phase ranges (phase:data, phase:forward, ...) of the trace: (phase, start, end)."""
    return sorted(((e["name"][len("phase:"):], e["ts"], e["ts"] + e["dur"])
                   for e in _annotations(trace, "phase:")),  # the CPU's, not their GPU-row copies
                  key=lambda r: r[1])


def phase_table(trace):
    """One row per recorded step: how many ranges of each phase it holds, and their milliseconds;
    'other' is the rest of the step (zero_grad, the loss's metrics, the profiler's own step)."""
    import pandas as pd
    ranges, rows = phase_ranges(trace), []
    for n, (start, end) in enumerate(steps(trace), 1):
        mine = [(p, a, b) for p, a, b in ranges if start <= a < end]
        row = dict(step=n, **{f"{p}_ranges": sum(q == p for q, _, _ in mine) for p in PHASES})
        row.update({f"{p}_ms": sum(b - a for q, a, b in mine if q == p) / 1e3 for p in PHASES})
        row["other_ms"] = (end - start) / 1e3 - sum(row[f"{p}_ms"] for p in PHASES)
        rows.append(row)
    return pd.DataFrame(rows)


def memory_by_phase(trace):
    """Per phase, over the recorded steps: bytes allocated and freed ('[memory]' events, which
    profile_memory records, any thread of the process) while its ranges were open, and the
    difference."""
    import pandas as pd
    ranges = phase_ranges(trace)
    totals = {p: [0, 0] for p in PHASES}
    for e in trace["traceEvents"]:
        if e.get("name") == "[memory]":
            for p, a, b in ranges:
                if a <= e["ts"] < b:
                    totals[p][e["args"]["Bytes"] < 0] += abs(e["args"]["Bytes"])
    mb = 2**20
    return pd.DataFrame([dict(phase=p, allocated_mb=a / mb, freed_mb=f / mb, kept_mb=(a - f) / mb)
                         for p, (a, f) in totals.items()])


# --- TensorBoard ------------------------------------------------------------------------------------------

def to_tensorboard(runs, tb_dir=TB_DIR, log_dir=LOG_DIR):
    """Write runs' logs as TensorBoard scalars (one TensorBoard run each, under tb_dir/<run>), with the tags
    a run writes live (trainup.scalars): the epoch records as train/* and test/*, the GPU samples
    (trainup.gpumon) as gpu<N>/* by elapsed tenth of a second. For a log from before the live scalars."""
    import shutil
    from torch.utils.tensorboard import SummaryWriter
    from trainup.scalars import tags_of
    for name in runs:
        run = read_run(Path(log_dir) / f"{name}.jsonl")
        shutil.rmtree(Path(tb_dir) / name, ignore_errors=True)  # a rerun replaces the run, not adds to it
        with SummaryWriter(str(Path(tb_dir) / name)) as w:
            for record in [dict(e, type="epoch") for e in run["epochs"]] + run["extra"]:
                for tag, value, step in tags_of(record["type"], record):
                    w.add_scalar(tag, value, step)
    return Path(tb_dir)


def scalars(tb_dir=TB_DIR):
    """Every scalar of every TensorBoard run under tb_dir, read back with tensorboard's EventAccumulator:
    one row per (run, tag, step, value); run is the folder of the event file, relative to tb_dir."""
    import pandas as pd
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    rows = []
    for folder in sorted({p.parent for p in Path(tb_dir).rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep every point
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            rows += [dict(run=str(folder.relative_to(tb_dir)), tag=tag, step=s.step, value=s.value)
                     for s in acc.Scalars(tag)]
    return pd.DataFrame(rows, columns=["run", "tag", "step", "value"])


def device_tags(table):
    """The device statistics among a run's tags: GPU utilisation and memory where a GPU logged them (nvitop's
    callback, DeviceStatsMonitor on CUDA, trainup.gpumon), else DeviceStatsMonitor's CPU load per step."""
    tags = sorted(set(table["tag"]))
    gpu = [t for t in tags if "utilization" in t.lower() or ("gpu" in t.lower() and "mem" in t.lower())]
    return gpu[:2] or [t for t in tags if t.endswith("on_train_batch_end/cpu_percent")]


def scalars_plot(table, tags, name, title="Read back from TensorBoard's event files"):
    """One panel per tag, one line per run."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(tags), figsize=(3.4 * len(tags), 3.2), squeeze=False)
    for ax, tag in zip(axes[0], tags):
        for run, g in table[table["tag"] == tag].groupby("run"):
            ax.plot(g["step"], g["value"], marker="o", label=run)
        source, _, short = tag.rpartition("/")  # DeviceStatsMonitor.on_train_batch_end/cpu_percent
        ax.set(title=short + (f"\n({source.split('.')[0]})" if source else ""), xlabel="step")
        ax.grid(alpha=0.3)
    if table["run"].nunique() > 1:
        axes[0][0].legend(fontsize="small")
    fig.suptitle(title)
    save(fig, name)
    return fig


# --- GPU statistics beside training statistics -----------------------------------------------------------

def gpu_runs(log_dir=LOG_DIR, reference_dir=REFERENCE_DIR):
    """Logs holding GPU samples ('gpu' records): this machine's, then committed reference runs."""
    paths = sorted(Path(log_dir).glob("*.jsonl")) + sorted(Path(reference_dir).glob("*/*.jsonl"))
    return [p for p in paths if any(r["type"] == "gpu" for r in read_run(p)["extra"])]


def find_tensorboard():
    """Point %tensorboard at this Python's tensorboard: the notebook magic starts `tensorboard` from PATH,
    which a JupyterLab started as .venv/bin/jupyter does not have (Colab's has it)."""
    import os
    import shutil
    import sys
    beside = Path(sys.executable).with_name("tensorboard")
    if not shutil.which("tensorboard") and beside.exists():
        os.environ["TENSORBOARD_BINARY"] = str(beside)


def serving(tb_dir=TB_DIR):
    """The TensorBoard servers (tensorboard.manager's records) serving tb_dir now."""
    from tensorboard import manager
    return [i for i in manager.get_all() if Path(i.logdir).resolve() == Path(tb_dir).resolve()]


def stop_tensorboard(tb_dir=TB_DIR):
    """Stop the TensorBoard servers %tensorboard started for tb_dir (a re-run of the notebook starts one
    again); asserts one was serving it. The sentence says nothing of ports or times, which vary."""
    import os
    import signal
    mine = serving(tb_dir)
    assert mine, f"no TensorBoard server was serving {relative(tb_dir)}"
    for info in mine:
        try:
            os.kill(info.pid, signal.SIGTERM)
        except ProcessLookupError:  # already gone
            pass
    return f"A TensorBoard server served {relative(tb_dir)} in this notebook; it is stopped now."


def gpu_note(log_dir=LOG_DIR, reference_dir=REFERENCE_DIR):
    """One sentence: where the GPU statistics below come from, or why there are none."""
    import torch
    runs = gpu_runs(log_dir, reference_dir)
    here = "this machine has a GPU" if torch.cuda.is_available() else "this machine has no GPU"
    ref = Path(reference_dir)
    held = sorted(p.name for p in ref.iterdir() if p.is_dir()) if ref.exists() else []
    refs = (f"logs/reference holds {len(held)} reference folder(s) ({', '.join(held)})" if held
            else "logs/reference holds no reference run yet (no GPU was lent when the course was built)")
    if not runs:
        return f"No GPU statistics to draw: {here}, no log here has GPU samples, and {refs}."
    return f"GPU statistics from {len(runs)} log(s) with GPU samples ({here}; {refs}): " + \
        ", ".join(p.stem for p in runs) + "."


def gpu_beside_training(path, name):
    """A run's GPU utilisation and memory over time beside its training loss by epoch."""
    import matplotlib.pyplot as plt
    import pandas as pd
    run = read_run(path)
    g = pd.DataFrame([r for r in run["extra"] if r["type"] == "gpu"])
    e = pd.DataFrame(run["epochs"])
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.2))
    axes[0].plot(e["epoch"], e["loss"], marker="o")
    axes[0].set(title="training loss", xlabel="epoch")
    for ax, key, label in ((axes[1], "utilization_pct", "GPU utilisation (%)"),
                           (axes[2], "memory_used_mb", "GPU memory used (MB)")):
        for gpu, s in g.groupby("gpu"):
            ax.plot(s["elapsed_s"], s[key], label=f"GPU {gpu}")
        ax.set(title=label, xlabel="seconds into the run")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(f"{Path(path).stem}")
    save(fig, name)
    return fig
