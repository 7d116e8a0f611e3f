"""Lessons 05 and 05b (Horovod): horovodrun jobs, Horovod against DDP, fusion, the timeline.

    from lessons.bylesson import horovod
    ok, sentence = horovod.available()                  # built and importable? one sentence either way
    horovod.run("--device", "cpu", name="hvd_n2", np=2)  # horovodrun -np 2 -H localhost:2 --gloo ...
    horovod.timeline_table("images/hvd_timeline.json")  # what each tensor went through, and when

horovodrun is started as this Python's `horovodrun` (the .venv's, beside sys.executable), and the
training processes it starts are this Python too, whatever PATH holds.
"""
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from trainup import LOG_DIR

from .. import jobs
from ..placement import placed
from ..report import QUICK, check, failed, load_runs, read_run, save

SCRIPT = "scripts/_trainup_horovod.py"
HOROVODRUN = [sys.executable, "-c", "from horovod.runner.launch import run_commandline; run_commandline()"]
INSTALL = "tools/build_horovod.sh"  # builds Horovod 0.28.1 from source against this torch (a few minutes)


def available():
    """(True, what was built) when horovod.torch imports in this Python; (False, one sentence) when not."""
    probe = ("import horovod, horovod.torch as hvd; "
             "print(f'Horovod {horovod.__version__}: gloo {hvd.gloo_built()}, MPI {hvd.mpi_built()}, "
             "NCCL {bool(hvd.nccl_built())}')")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    if proc.returncode == 0:
        return True, proc.stdout.strip()
    reason = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return False, (f"Horovod is not installed in this Python ({reason}), so this lesson's jobs are skipped: "
                   f"run `{INSTALL}` (or `bash run_tests.sh`, which does it) and run the notebook again.")


def environment(extra=None):
    # one thread per process, output as it comes; Horovod's own variables (fusion, cycle, timeline) in extra
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(extra or {})}


def command(*args, name, np=2, quick=None, timeline=None, fusion_mb=None, cycle_ms=None):
    """horovodrun's command line: np processes on this machine over gloo, running the lesson's script."""
    quick = QUICK if quick is None else quick
    flags = ["-np", np, "-H", f"localhost:{np}", "--gloo"]
    if timeline:
        flags += ["--timeline-filename", timeline, "--timeline-mark-cycles"]
    if fusion_mb is not None:
        flags += ["--fusion-threshold-mb", fusion_mb]
    if cycle_ms is not None:
        flags += ["--cycle-time-ms", cycle_ms]
    part = [SCRIPT, *placed(SCRIPT, args, np), "--run-name", name, "--no-progress"] + ["--quick"] * quick
    return [str(f) for f in flags], [str(a) for a in part]


def run(*args, name, np=2, quick=None, timeline=None, fusion_mb=None, cycle_ms=None, timeout=900, env=None):
    """One horovodrun job on this machine; prints the command and one checked sentence (report.check)."""
    flags, part = command(*args, name=name, np=np, quick=quick, timeline=timeline, fusion_mb=fusion_mb,
                          cycle_ms=cycle_ms)
    print("$ OMP_NUM_THREADS=1 " + shlex.join(["horovodrun", *flags, "python", *part]))
    proc = jobs.run(HOROVODRUN + flags + [sys.executable] + part, timeout=timeout, env=environment(env))
    if proc.returncode != 0:
        raise failed("horovodrun", proc.stdout + proc.stderr, proc.returncode)
    print(check(name))
    return name


# --- Gradient accumulation: backward_passes_per_step -------------------------------------------

def gradient_allreduces(t):
    """How many times Horovod all-reduced each gradient, from a timeline_events() table: {name: n}
    (DistributedOptimizer names them allreduce.<parameter>; allreduce.meter is the metrics',
    allreduce.stop the stop's flag at each epoch's end: preempt.Stopper.after_epoch)."""
    done = t[(t.phase == "ALLREDUCE") & t.tensor.str.startswith("allreduce.")
             & ~t.tensor.isin(["allreduce.meter", "allreduce.stop"])]
    return {k.removeprefix("allreduce."): int(n) for k, n in done.tensor.value_counts().items()}


def accumulation(name, timeline, log_dir=LOG_DIR):
    """A run's backward passes and optimizer steps on each rank, worked out from its log (samples a
    rank saw each epoch, its batch, --accumulate), beside the all-reduces of each gradient that
    Horovod's timeline recorded: one dict."""
    run = read_run(Path(log_dir) / f"{name}.jsonl")
    k = run["config"]["args"].get("accumulate") or 1
    batch = next(r for r in run["extra"] if r["type"] == "ddp")["per_rank_batch"]
    seen = [r["samples"][0] for r in run["extra"] if r["type"] == "ranks"]  # rank 0's, each epoch
    counts = gradient_allreduces(timeline_events(timeline))
    micro = batch // k
    return dict(accumulate=k, micro_batch=micro, backward_passes=sum(-(-n // micro) for n in seen),
                steps=sum(-(-n // batch) for n in seen), allreduces=counts)  # -(-a // b): ceil


# --- Uneven inputs: hvd.join() ----------------------------------------------------------------

def uneven_join(batches=(3, 5)):
    """Run by join_run() under horovodrun: rank r trains a small linear model on batches[r] batches
    (a shard shorter than the others'), then calls hvd.join(). Without it the ranks still training
    would wait in their next all-reduce for a rank that never comes (until gloo's timeout kills the
    job); a joined rank instead answers every all-reduce of the others with zeros until all have
    joined, and join() returns the rank that joined last. Prints one JSON line per rank: its steps,
    the last to join, for each step the ratio of the averaged gradient to its own (after the other
    rank joined: 1/size, as Horovod's Average divides by all ranks, joined ones too), and its
    weights before and after a broadcast from the last to join (the only rank that took every
    step)."""
    import torch
    import horovod.torch as hvd
    hvd.init()
    rank = hvd.rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, bias=False).double()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), op=hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gen = torch.Generator().manual_seed(rank)  # each rank its own data
    ratios = []
    for _ in range(batches[rank % len(batches)]):
        optimizer.zero_grad()
        loss = model(torch.randn(8, 4, generator=gen, dtype=torch.float64)).pow(2).mean()
        # this rank's own gradient, computed apart: backward's hook starts the all-reduce of .grad
        # in place at once, so a copy of .grad taken after backward may already be the average
        own = torch.autograd.grad(loss, model.weight, retain_graph=True)[0]
        loss.backward()
        optimizer.synchronize()
        ratios.append((model.weight.grad / own).mean().item())
        with optimizer.skip_synchronize():
            optimizer.step()
    last = hvd.join()  # out of batches: stand in for the others' all-reduces until all joined
    before = model.weight.detach().flatten().tolist()
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)  # as the rank that did all
    print("JOIN " + json.dumps(dict(rank=rank, size=hvd.size(), steps=len(ratios),
                                    last_joined=last, ratios=ratios, before=before,
                                    after=model.weight.detach().flatten().tolist())), flush=True)
    hvd.shutdown()


def join_run(np=2, timeout=300):
    """uneven_join() under horovodrun on this machine: the ranks' JSON records, by rank."""
    cmd = [*HOROVODRUN, "-np", str(np), "-H", f"localhost:{np}", "--gloo", sys.executable, "-c",
           "from lessons.bylesson import horovod; horovod.uneven_join()"]
    print("$ horovodrun -np 2 -H localhost:2 --gloo python -c "
          "'from lessons.bylesson import horovod; horovod.uneven_join()'")
    proc = jobs.run(cmd, timeout=timeout, env=environment())
    if proc.returncode != 0:
        raise failed("horovodrun (join)", proc.stdout + proc.stderr, proc.returncode)
    records = [json.loads(line.split("JOIN ", 1)[1]) for line in proc.stdout.splitlines()
               if "JOIN {" in line]
    return sorted(records, key=lambda r: r["rank"])


# --- Horovod against DDP ----------------------------------------------------------------------------

def sweeps(runs, log_dir=LOG_DIR):
    """The 'sweep' records of these runs (throughput at each global batch size), one row each."""
    import pandas as pd
    rows = []
    for name in runs:
        r = read_run(Path(log_dir) / f"{name}.jsonl")
        for s in (e for e in r["extra"] if e["type"] == "sweep"):
            rows.append(dict(run=name, engine=r["config"]["lesson"], world_size=r["env"]["world_size"],
                             backend=r["env"]["backend"], batch_size=s["batch_size"], steps=s["steps"],
                             samples_per_s=s["samples_per_s"], step_ms=1000 * s["step_s"]))
    return pd.DataFrame(rows)


def versus(table, a="horovod", b="ddp"):
    """One sentence comparing two engines' throughput at each batch size, from a sweeps() table:
    each run one value, so a direction only where the runs decide it (claims.compare: 3 runs an
    engine or more, their ranges apart); with fewer, the ratio and that the runs cannot tell."""
    from .. import claims
    parts = []
    for batch, g in table.groupby("batch_size"):
        ra, rb = (list(g.loc[g.engine == e, "samples_per_s"]) for e in (a, b))
        parts.append(f"at global batch {batch}, {a} ran {claims.compare(ra, rb, b)}")
    return "; ".join(parts) + "."


def versus_plot(table, name="horovod_vs_ddp"):
    """Throughput against global batch size, one line per engine."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for engine, g in table.groupby("engine", sort=False):
        g = g.groupby("batch_size", as_index=False)["samples_per_s"].mean()
        ax.plot(g.batch_size, g.samples_per_s, marker="o", label=engine)
    ax.set(title="The same job under Horovod and DDP (2 processes, gloo, CPU)", xlabel="global batch size",
           ylabel="samples/s (whole job)", xscale="log", xticks=sorted(table.batch_size.unique()))
    ax.set_xticklabels([str(b) for b in sorted(table.batch_size.unique())])
    # from 0: heights compare as throughputs do (a cut axis magnifies gaps); room above the top
    ax.set_ylim(0, 1.1 * table.samples_per_s.max())
    ax.minorticks_off()  # the log axis's minor labels (6x10^1, 2x10^2) overprint the batch sizes
    ax.legend(), ax.grid(alpha=0.3)
    save(fig, name)
    return fig


# --- Tensor fusion and the cycle time ---------------------------------------------------------------

def fusion_table(runs, log_dir=LOG_DIR):
    """Throughput of runs that differ only by HOROVOD_FUSION_THRESHOLD / HOROVOD_CYCLE_TIME ({name: (mb, ms)})."""
    import pandas as pd
    t = sweeps(list(runs), log_dir)
    settings = pd.DataFrame([dict(run=n, fusion_mb=mb, cycle_ms=ms) for n, (mb, ms) in runs.items()])
    return settings.merge(t[["run", "batch_size", "samples_per_s", "step_ms"]], on="run")


def fusion_sentence(table):
    """What each knob did to a step, from fusion_table() (repeated runs of a setting share its row
    group): fusion on against off at each cycle time, and the 20 ms cycle against 1 ms at each
    fusion setting, beside half the cycles' difference (the wait a tensor ready just after the
    background thread's last look has, on average: HOROVOD_CYCLE_TIME's cost model); a pair with
    a setting that did not run is left out. A side only where the runs decide it (claims.step: 3
    runs a setting or more, their ranges apart)."""
    import statistics

    from ..claims import step
    runs = table.groupby(["fusion_mb", "cycle_ms"])["step_ms"].apply(list)
    said = {1: "longer in every run", -1: "shorter in every run", 0: "within the runs' spread",
            None: "too few runs: the runs cannot tell"}

    def pair(x, y):
        a, b = runs[x], runs[y]
        ma, mb = statistics.median(a), statistics.median(b)
        return f"{mb:.1f} against {ma:.1f} ms a step ({mb - ma:+.1f} ms, {said[step(a, b)]})"
    fusions, cycles = sorted({f for f, _ in runs.index}), sorted({c for _, c in runs.index})
    out = []
    if len(fusions) == 2:
        off, on = fusions
        out += [f"Fusion {on:g} MB against off, cycle {c:g} ms: {pair((off, c), (on, c))}."
                for c in cycles if {(off, c), (on, c)} <= set(runs.index)]
    if len(cycles) == 2:
        short, long_ = cycles
        out += [f"Cycle {long_:g} ms against {short:g} ms, fusion {f:g} MB: "
                f"{pair((f, short), (f, long_))}; "
                f"half the cycles' difference is {(long_ - short) / 2:.1f} ms." for f in fusions
                if {(f, short), (f, long_)} <= set(runs.index)]
    return "\n".join(out)


# --- The timeline -----------------------------------------------------------------------------------

CYCLES = "(cycle starts)"  # the timeline's CYCLE_START markers (--timeline-mark-cycles) belong to no tensor


def timeline_events(path):
    """Horovod's timeline (chrome-trace JSON, written by the coordinator) as a table of phases:
    tensor, phase, start and end in ms from the first event, depth and leaf. Spans nest on a
    tensor's row: ALLREDUCE holds WAIT_FOR_DATA, MEMCPY_IN_FUSION_BUFFER, GLOO_ALLREDUCE... (depth
    1 inside a depth-0 span); leaf is True for a span with none inside it. Instant events (each
    rank's 'ready' during negotiation) are kept with end == start, their phase named after the
    rank."""
    import pandas as pd
    text = Path(path).read_text().strip()
    if not text.endswith("]"):  # Horovod leaves the JSON array open while it runs; it may end with a comma
        text = text.rstrip(",") + "]"
    events = json.loads(text)
    names = {e["pid"]: e["args"].get("name", "") for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    open_, rows = {}, []
    for e in events:
        tensor = names.get(e.get("pid"), CYCLES if "pid" not in e else str(e["pid"]))  # markers have no tensor
        stack = open_.setdefault((e.get("pid"), e.get("tid", 0)), [])  # the row's open spans
        if e.get("ph") == "B":
            if stack:
                stack[-1]["leaf"] = False  # its parent holds a span: not a leaf
            stack.append(dict(phase=e["name"], start_us=e["ts"], depth=len(stack), leaf=True))
        elif e.get("ph") == "E" and stack:
            rows.append(dict(stack.pop(), tensor=tensor, end_us=e["ts"]))
        elif e.get("ph") in ("i", "I", "X") and "ts" in e:
            rows.append(dict(tensor=tensor, phase=e["name"], start_us=e["ts"],
                             end_us=e["ts"] + e.get("dur", 0), depth=len(stack), leaf=True))
    t = pd.DataFrame(rows)
    t0 = t.start_us.min()
    t["start_ms"], t["end_ms"] = (t.start_us - t0) / 1000, (t.end_us - t0) / 1000
    return t.drop(columns=["start_us", "end_us"]).sort_values("start_ms", ignore_index=True)


def step_window(t, steps=2, skip=3):
    """The part of a timeline_events() table that covers `steps` training steps, after `skip` warm-up ones:
    from one negotiation of the most frequent gradient to the one `steps` later."""
    neg = t[t.phase.str.startswith("NEGOTIATE")]
    tensor = neg.tensor.value_counts().index[0]
    starts = sorted(neg[neg.tensor == tensor].start_ms)
    skip = min(skip, max(len(starts) - steps - 1, 0))
    lo, hi = starts[skip], starts[min(skip + steps, len(starts) - 1)]
    return t[(t.start_ms >= lo) & (t.start_ms < hi)]


def timeline_plot(t, name="horovod_timeline"):
    """One row per tensor: its phases as bars (negotiation, then the all-reduce and what it did inside), and,
    where the timeline has them (a tensor's first negotiation), numbered marks when each rank was ready."""
    import matplotlib.pyplot as plt
    t = t[t.tensor != CYCLES]
    t0 = t.start_ms.min()
    t = t.assign(start_ms=t.start_ms - t0, end_ms=t.end_ms - t0)  # ms from the window's start
    tensors = list(dict.fromkeys(t.sort_values("start_ms").tensor))
    phases = [p for p in dict.fromkeys(t.phase) if not p.isdigit()]
    colours = dict(zip(phases, plt.cm.tab10.colors))
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(tensors) + 1.6))
    for row, tensor in enumerate(tensors):
        g = t[t.tensor == tensor]
        for p in phases:
            bars = g[g.phase == p]
            top = p.startswith(("NEGOTIATE", "ALLREDUCE", "ALLGATHER", "BROADCAST"))  # outer phases: wide bars
            h = 0.7 if top else 0.35
            ax.broken_barh(list(zip(bars.start_ms, bars.end_ms - bars.start_ms)), (row - h / 2, h),
                           color=colours[p], alpha=0.5 if top else 0.95, label=p if len(bars) else None)
        for rank, marks in g[g.phase.str.isdigit()].groupby("phase"):
            ax.scatter(marks.start_ms, [row] * len(marks), marker=f"${rank}$", color="black", s=90, zorder=3)
    handles, labels = ax.get_legend_handles_labels()
    keep = dict(zip(labels, handles))
    ax.legend(keep.values(), keep.keys(), fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set(yticks=range(len(tensors)), yticklabels=[n.split(".", 1)[-1][:40] for n in tensors], xlabel="ms",
           title="Horovod timeline, written by rank 0: what each gradient went through")
    ax.invert_yaxis(), ax.grid(alpha=0.3, axis="x")
    save(fig, name)
    return fig


WAITING = ("NEGOTIATE_", "WAIT_FOR_")  # phases that wait for other ranks or for data: no work


def wall_ms(spans):
    """The time covered by any of these spans, each instant once (the length of their union)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(zip(spans.start_ms, spans.end_ms)):
        total += max(0.0, stop - max(start, end))
        end = max(end, stop)
    return total


def timeline_summary(t, spans="leaf"):
    """Time in each phase over the table given, counting ONE level of the nesting, so that no time
    counts twice: spans="leaf" (the default) the innermost spans, where the time went
    (NEGOTIATE_ALLREDUCE, then the phases inside ALLREDUCE: WAIT_FOR_*, MEMCPY_*, GLOO_ALLREDUCE),
    "top" the outermost (NEGOTIATE_ALLREDUCE and ALLREDUCE, each holding its inner phases).
    tensor_ms sums over the tensors' rows: a fused all-reduce is drawn on the row of every tensor
    it carried, so it counts once per tensor; wall_ms counts each instant once (the union of the
    phase's spans). kind: 'waiting' (negotiation, waits) or 'work'."""
    if spans not in ("leaf", "top"):
        raise ValueError(f"spans is 'leaf' or 'top', not {spans!r}")
    level = t.leaf if spans == "leaf" else t.depth == 0
    s = t[level & ~t.phase.str.isdigit() & (t.tensor != CYCLES)]
    rows = [dict(phase=phase, kind="waiting" if phase.startswith(WAITING) else "work",
                 count=len(g), tensor_ms=(g.end_ms - g.start_ms).sum(), wall_ms=wall_ms(g))
            for phase, g in s.groupby("phase")]
    import pandas as pd
    return pd.DataFrame(rows, columns=["phase", "kind", "count", "tensor_ms", "wall_ms"]) \
        .sort_values("tensor_ms", ascending=False, ignore_index=True)


# --- The learning rate, and what Lightning 2.x offers ---------------------------------------------

def learning_rates(runs, checkpoint_dir=None):
    """Each run's processes, --lr and the rate its optimizer ended with (from its checkpoint): a table."""
    import pandas as pd
    import torch
    from trainup import CHECKPOINT_DIR
    rows = []
    for name in runs:
        state = torch.load(Path(checkpoint_dir or CHECKPOINT_DIR) / f"{name}.pt", map_location="cpu", weights_only=True)
        run = load_runs([name]).iloc[0]
        args = read_run(Path(run.path))["config"]["args"]
        rows.append(dict(run=name, processes=run.world_size, lr_flag=args["lr"], gamma=args["gamma"], epochs=run.epochs,
                         final_lr=state["optimizer"]["param_groups"][0]["lr"]))
    t = pd.DataFrame(rows)
    t["lr_flag_x_decay"] = t.lr_flag * t.gamma ** t.epochs  # what StepLR alone makes of --lr
    return t


def lightning_strategies():
    """The strategy names Lightning's installed version accepts, and whether 'horovod' is among them."""
    import pytorch_lightning as pl
    from pytorch_lightning.strategies import StrategyRegistry
    names = sorted(StrategyRegistry.available_strategies())
    return pl.__version__, names, "horovod" in names
