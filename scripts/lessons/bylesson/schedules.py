"""Lessons 06 to 06c (pipeline parallelism): the measured schedule, the bubble against theory,
throughput and activation memory against the number of micro-batches, read from the 'pipeline' and
'pipe_step' records of _trainup_pipeline.py and _trainup_pipeline_manual.py (logs/README.md).

    from lessons.bylesson import schedules
    schedules.gantt("pp_gpipe_m4", "gantt_gpipe")     # the schedule as it ran, stages x time
    table = schedules.bubble_table(["pp_sweep_gpipe"]) # measured bubble beside (p-1)/(m+p-1)
"""
from pathlib import Path

from trainup import LOG_DIR

from ..log_reader import records as _records
from ..perfmodel import bubble_share as theory  # the formula lesson 11's cost model shares
from ..report import failed, read_run, save

COMPUTE = ("F", "B", "I", "W")  # forward, backward (whole, or to the input / weights in zero-bubble schedules)
COLOURS = {"F": "tab:blue", "B": "tab:orange", "I": "tab:orange", "W": "tab:red", "S": "0.75", "R": "0.9"}
HATCH = {"I": "//"}  # backward to the input only: orange as a whole one, hatched apart
NAMES = {"F": "forward", "B": "backward", "I": "backward (input)", "W": "backward (weights)", "S": "send",
         "R": "wait to receive"}


def traced_code(blocks=4, width=32, stages=2, micro_batch=8):
    """The forward torch's tracer wrote for each stage of a BlockStack cut into `stages` (what
    _trainup_pipeline.py --split traced runs): the generated code, stage by stage."""
    import warnings

    import torch
    from trainup import models
    from trainup.parallel import pipeline
    torch.manual_seed(1)
    model = models.BlockStack((1, 28, 28), 10, blocks, width)
    with warnings.catch_warnings():  # the tracer's own deprecation notes, not the lesson's
        warnings.simplefilter("ignore")
        parts = pipeline.traced(model, stages, torch.zeros(micro_batch, 1, 28, 28))
    return "\n\n".join(f"# stage {i} (holds {', '.join(dict(part.named_children()))})\n"
                       f"{part.code.strip()}" for i, part in enumerate(parts))


def layout(name, log_dir=LOG_DIR):
    """The run's 'pipeline' record: schedule, stages, micro-batches, where each rank sits."""
    return _records(name, "pipeline", log_dir)[-1]


def steps(name, log_dir=LOG_DIR, first=False):
    """One row per measured step and rank: its events, stages, step time and activation peaks.

    The very first training step is left out unless first=True: in it the stages also find out the
    shapes they will receive (a first forward, and messages) and warm up; a sweep already leaves out one
    warm-up step per micro-batch count."""
    import pandas as pd
    t = pd.DataFrame(_records(name, "pipe_step", log_dir))
    later = ~((t["epoch"] == 1) & (t["step"] == 1))
    return t if first or not later.any() else t[later]


def aligned(g):
    """The events of one step's rows (one per rank) on one time axis: each rank's times are from its own
    start after the barrier, which ranks leave a little apart; their start_s (the machine's monotonic
    clock, the same for every process of one machine) puts them on the earliest one's axis."""
    if "start_s" not in g or g["start_s"].isna().any():
        return {r["rank"]: r["events"] for _, r in g.iterrows()}
    origin = g["start_s"].min()
    return {r["rank"]: [[s, k, mb, a + r["start_s"] - origin, b + r["start_s"] - origin] for s, k, mb, a, b in r["events"]]
            for _, r in g.iterrows()}


def peak_activations(name, microbatches=None, log_dir=LOG_DIR):
    """The most activation bytes each stage kept at once (over the measured steps): a Series by stage."""
    import pandas as pd
    t = steps(name, log_dir)
    if microbatches is not None:
        t = t[t["microbatches"] == microbatches]
    rows = [(s, b) for _, r in t.iterrows() for s, b in zip(r["stages"], r["peak_activation_bytes"])]
    return pd.DataFrame(rows, columns=["stage", "bytes"]).groupby("stage")["bytes"].max()


def _one_step(t):
    """Per step of pipeline 0: span, busy time per rank, per-stage work per micro-batch."""
    t = t[t["pipeline"] == 0] if "pipeline" in t else t  # one pipeline of a pipeline x data-parallel job
    out = []
    for (_, m, step), g in t.groupby(["epoch", "microbatches", "step"]):
        by_rank = aligned(g)
        events = [e for ev in by_rank.values() for e in ev]
        compute = [e for e in events if e[1] in COMPUTE]
        span = max(e[4] for e in events) - min(e[3] for e in events)
        busy = {rank: sum(e[4] - e[3] for e in ev if e[1] in COMPUTE) for rank, ev in by_rank.items()}
        per_stage = {}
        for s, kind, mb, a, b in compute:
            per_stage[s] = per_stage.get(s, 0.0) + (b - a) / m
        out.append(dict(microbatches=m, step=step, ranks=len(g), span_s=span, busy=busy, work=per_stage,
                        step_s=float(g["step_s"].max())))
    return out




def bubble_table(names, log_dir=LOG_DIR):
    """One row per run and micro-batch count: the measured bubble (median over the measured steps,
    and their lowest and highest), theory, throughput, and two more numbers from the same steps:
    the stages' imbalance (the slowest stage's compute per micro-batch against the mean) and the
    unexplained share, a remainder: 1 - (v*m+p-1) * the slowest stage's compute / the step's span,
    what the stages' compute at the slowest one's pace does not account for (sends, waits, Python,
    noise, and whatever the formula leaves out). It is not measured as a cause."""
    import pandas as pd
    rows = []
    for name in [names] if isinstance(names, str) else names:
        cfg = layout(name, log_dir)
        batch = read_run(Path(log_dir) / f"{name}.jsonl")["config"]["args"]["batch_size"] // cfg["data_parallel"]
        p, v = cfg["pipeline_ranks"], cfg.get("stages_per_rank", 1)
        per_m = {}
        for s in _one_step(steps(name, log_dir)):
            busy = sum(s["busy"].values())
            work = sorted(s["work"].values())
            # equal stages at the slowest one's pace, free sends
            ideal = (v * s["microbatches"] + p - 1) * max(work)
            per_m.setdefault(s["microbatches"], []).append(dict(
                bubble=1 - busy / (s["ranks"] * s["span_s"]),  # processes x span
                imbalance=max(work) / (sum(work) / len(work)) - 1,
                unexplained=max(0.0, 1 - ideal / s["span_s"]),
                samples_per_s=batch / s["step_s"], span_s=s["span_s"]))
        for m, measured in sorted(per_m.items()):
            frame = pd.DataFrame(measured)
            med = frame.median()
            rows.append(dict(run=name, schedule=cfg["schedule"], stages=p, stages_per_rank=v, microbatches=m,
                             measured=med["bubble"], lowest=frame["bubble"].min(),
                             highest=frame["bubble"].max(), bubbles=list(frame["bubble"]),
                             theory=theory(p, m, v), imbalance=med["imbalance"],
                             unexplained=med["unexplained"],
                             samples_per_s=med["samples_per_s"], steps=len(measured)))
    return pd.DataFrame(rows)


def against_theory(r):
    """'above', 'below' or 'spans': where a row's measured steps lie against the formula. A side
    only when at least claims.REPEATS steps were measured and every one of them lies on it."""
    from ..claims import REPEATS
    if r["steps"] >= REPEATS and r["lowest"] > r["theory"]:
        return "above"
    if r["steps"] >= REPEATS and r["highest"] < r["theory"]:
        return "below"
    return "spans"


VERDICT = {"above": "above it in every step", "below": "below it in every step",
           "spans": "the steps do not put it above or below"}


def about_bubble(t):
    """A sentence per row of bubble_table: the measured bubble (its steps' range) against the
    formula, and what else the same steps measured. No cause is given: the formula assumes equal
    stages and free sends, and the unexplained share is a remainder, not a measurement of the
    sends."""
    out = []
    for _, r in t.iterrows():
        where = against_theory(r)
        points = 100 * abs(r["measured"] - r["theory"])
        gap = f", by {points:.0f} points" if where != "spans" else ""
        out.append(f"{r['schedule']}, m = {r['microbatches']}: bubble {r['measured']:.0%} measured "
                   f"({r['lowest']:.0%} to {r['highest']:.0%} over {r['steps']} steps), "
                   f"{r['theory']:.0%} by the formula: {VERDICT[where]}{gap}. Stages unequal by "
                   f"{r['imbalance']:.0%}; {r['unexplained']:.0%} of the step unexplained by "
                   f"their compute.")
    return out


def about_sweep(t):
    """Sentences for each schedule of a sweep: at which micro-batch counts the formula lies within
    the measured steps and where all of them lie above or below it; the lowest bubble, and whether
    it was higher again at the largest m (decided by the steps' spread, claims.step)."""
    from ..claims import step
    out = []
    for schedule, g in t.groupby("schedule", sort=False):
        g = g.sort_values("microbatches")
        sides = {m: against_theory(r) for m, (_, r) in zip(g["microbatches"], g.iterrows())}
        at = {w: ", ".join(str(m) for m, x in sides.items() if x == w) for w in VERDICT}
        words = {"spans": "the formula within the steps' range",
                 "above": "above the formula in every step", "below": "below the formula in every step"}
        s = f"{schedule}: " + "; ".join(f"{words[w]} at m = {at[w]}" for w in words if at[w])
        low = g.loc[g["measured"].idxmin()]
        s += f". Lowest bubble {low['measured']:.0%}, at m = {low['microbatches']}"
        last = g.iloc[-1]
        if last["microbatches"] > low["microbatches"]:
            rose = step(low["bubbles"], last["bubbles"])
            end = f"m = {last['microbatches']} ({last['measured']:.0%})"
            s += {1: f"; higher again at {end} in every step", -1: "",
                  0: f"; the steps at {end} overlap the lowest's",
                  None: "; too few steps to tell whether it rose after"}[rose]
        out.append(s + ".")
    return out


def compare_schedules(t, a, b):
    """Sentences: schedule a's bubble against b's at each micro-batch count both ran; a side only
    where every measured step of one lies beyond every step of the other (claims.step)."""
    from ..claims import step
    x = t[t["schedule"] == a].set_index("microbatches")
    y = t[t["schedule"] == b].set_index("microbatches")
    words = {1: "above", -1: "below", 0: "within the steps' spread of",
             None: "not decidable against"}
    return [f"m = {m}: {a}'s bubble {x.loc[m, 'measured']:.0%} is "
            f"{words[step(y.loc[m, 'bubbles'], x.loc[m, 'bubbles'])]} "
            f"{b}'s {y.loc[m, 'measured']:.0%}"
            for m in sorted(set(x.index) & set(y.index))]


def bubble_plot(t, name):
    """Measured bubble against (p-1)/(v*m+p-1), and throughput, against the micro-batch count."""
    import matplotlib.pyplot as plt
    import pandas as pd
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6))
    for run, g in t.groupby("run", sort=False):
        label = g["schedule"].iloc[0]
        a.plot(g["microbatches"], 100 * g["measured"], "o-", label=f"{label}, measured")
        b.plot(g["microbatches"], g["samples_per_s"], "o-", label=label)
    for v, g in t.groupby(t.get("stages_per_rank", pd.Series(1, index=t.index))):
        g = g.drop_duplicates("microbatches").sort_values("microbatches")
        a.plot(g["microbatches"], 100 * g["theory"], "k--" if v == 1 else "k:",
               label="theory (p-1)/(m+p-1)" if v == 1 else
               f"theory, interleaved: (p-1)/({v}m+p-1) for m >= p, (p-1)/p at m = 1")
    g = t.drop_duplicates("microbatches").sort_values("microbatches")
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(g["microbatches"]), [str(m) for m in g["microbatches"]])
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    a.set(title="The bubble: share of the time a stage is idle", xlabel="micro-batches m", ylabel="% of stage-time")
    b.set(title="Throughput", xlabel="micro-batches m", ylabel="samples/s")
    save(fig, name)
    return fig


def measured_step(name, microbatches=None, step=None, log_dir=LOG_DIR):
    """One measured step of pipeline 0: {rank: (its stages, its events on the first rank's time axis)},
    and its micro-batch count (a sweep holds several: the largest unless told)."""
    t = steps(name, log_dir)
    t = t[t["pipeline"] == 0] if "pipeline" in t else t
    t = t[t["microbatches"] == (microbatches or t["microbatches"].max())]
    epoch, first = t[["epoch", "step"]].iloc[0]  # the first measured step, unless told
    g = t[(t["epoch"] == epoch) & (t["step"] == (step if step is not None else first))].sort_values("rank")
    placed = aligned(g)
    return {r["rank"]: (list(r["stages"]), placed[r["rank"]]) for _, r in g.iterrows()}, int(g["microbatches"].iloc[0])


def draw_step(ax, ranks, title, legend=True):
    """A step's events drawn as a Gantt chart: a row per rank, forward and backward in two colours (sends
    and waits grey), each bar labelled with its micro-batch (and stage, when a rank holds two)."""
    from matplotlib.patches import Patch
    seen = set()
    span = max(e[4] for _, ev in ranks.values() for e in ev)
    for rank, (stages, events) in ranks.items():
        for s, kind, mb, a, b in events:
            ax.broken_barh([(1000 * a, 1000 * (b - a))], (rank - 0.4, 0.8), facecolors=COLOURS[kind],
                           edgecolor="k" if kind in COMPUTE else "none", linewidth=0.3,
                           hatch=HATCH.get(kind))
            seen.add(kind)
            if kind in COMPUTE and b - a > 0.015 * span:  # labels only where they fit
                ax.text(1000 * (a + b) / 2, rank, f"{mb}" + (f"/s{s}" if len(stages) > 1 else ""), ha="center",
                        va="center", fontsize=6, clip_on=True)
    ax.set_yticks(list(ranks), [f"rank {r} (stage {', '.join(map(str, st))})" for r, (st, _) in ranks.items()])
    ax.set_ylim(max(ranks) + 0.6, min(ranks) - 0.6)  # rank 0 on top
    ax.set_xlabel("ms from the start of the step (the first rank's)")
    ax.set_title(title, loc="left", fontsize="medium")
    handles = [Patch(facecolor=COLOURS[k], hatch=HATCH.get(k), edgecolor="k", linewidth=0.3,
                     label=NAMES[k]) for k in COLOURS if k in seen]
    if legend:
        ax.legend(handles=handles, fontsize="small", loc="lower right", bbox_to_anchor=(1, 1), ncol=len(seen),
                  frameon=False)
    return handles


def gantt(name, image, microbatches=None, step=None, log_dir=LOG_DIR, ax=None, title=None):
    """One measured step drawn as it ran (draw_step)."""
    import matplotlib.pyplot as plt
    ranks, m = measured_step(name, microbatches, step, log_dir)
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(11, 1 + 0.7 * len(ranks)))
    draw_step(ax, ranks, title or f"{layout(name, log_dir)['schedule']}: {m} micro-batch(es), one measured step")
    if image:
        save(fig, image)
    return fig


def order(schedule, p, m):
    """Each rank's forwards and backwards, (kind, micro-batch), in the order a schedule of one stage per
    rank runs them: GPipe (and naive) all forwards, then all backwards; 1F1B p-1-rank forwards to warm
    up, then one forward and one backward in turn, then the backwards left."""
    if schedule in ("naive", "gpipe"):
        return [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for _ in range(p)]
    if schedule != "1f1b":
        raise ValueError(f"the ideal schedule is drawn for naive, gpipe and 1f1b, not {schedule}")
    out = []
    for r in range(p):
        w = min(p - 1 - r, m)
        steady = [op for i in range(m - w) for op in (("F", w + i), ("B", i))]
        out.append([("F", i) for i in range(w)] + steady + [("B", i) for i in range(m - w, m)])
    return out


def simulate(ops, forward, backward):
    """The ideal step: every op starts as soon as its rank is free and its input is there (sends cost
    nothing). ops: each rank's order; forward[r], backward[r]: one micro-batch's compute on rank r.
    {rank: ([rank], events)} as measured_step gives them."""
    p, done, free, at = len(ops), {}, [0.0] * len(ops), [0] * len(ops)
    events = {r: ([r], []) for r in range(p)}
    while any(at[r] < len(ops[r]) for r in range(p)):
        moved = False
        for r in range(p):
            if at[r] == len(ops[r]):
                continue
            kind, mb = ops[r][at[r]]
            needs = ([("F", r - 1, mb)] if r else []) if kind == "F" else \
                [("F", r, mb)] + ([("B", r + 1, mb)] if r < p - 1 else [])
            if all(n in done for n in needs):
                start = max([free[r]] + [done[n] for n in needs])
                free[r] = done[(kind, r, mb)] = start + (forward[r] if kind == "F" else backward[r])
                events[r][1].append([r, kind, mb, start, free[r]])
                at[r] += 1
                moved = True
        if not moved:
            raise ValueError("this order waits for itself")
    return events


def ideal_step(name, microbatches=None, log_dir=LOG_DIR):
    """The measured step's ideal: the same schedule, each stage's median measured forward and backward
    per micro-batch (this run's own medians: unequal stages stay unequal, so its bubble is the
    formula only where the stages are equal), equal for every micro-batch, and free sends."""
    import statistics
    ranks, m = measured_step(name, microbatches, log_dir=log_dir)
    cost = {k: [statistics.median(b - a for _, kind, _, a, b in ranks[r][1] if kind == k) for r in sorted(ranks)]
            for k in "FB"}
    return simulate(order(layout(name, log_dir)["schedule"], len(ranks), m), cost["F"], cost["B"]), m


def span(ranks):
    events = [e for _, ev in ranks.values() for e in ev]
    return max(e[4] for e in events) - min(e[3] for e in events)


def ideal_beside(names, image, log_dir=LOG_DIR):
    """Each run's measured step (left) beside its ideal (right: same compute, free sends), one time axis."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(names), 2, figsize=(12, 1.9 * len(names) + 0.4), sharex=True, squeeze=False)
    for name, (left, right) in zip(names, axes):
        measured, m = measured_step(name, log_dir=log_dir)
        ideal, _ = ideal_step(name, log_dir=log_dir)
        schedule = layout(name, log_dir)["schedule"]
        handles = draw_step(left, measured, f"{schedule}, {m} micro-batches: measured", legend=False)
        draw_step(right, ideal, f"{schedule}: ideal (the same compute, sends free)", legend=False)
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize="small", frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / fig.get_figheight()))
    save(fig, image)
    return fig


def about_ideal(names, log_dir=LOG_DIR):
    """A sentence per run: its measured step against its ideal, and the share of the step the ideal
    does not account for: a remainder (sends, waits, and any micro-batch slower than its stage's
    median), not a measurement of the sends."""
    out = []
    for name in names:
        measured, m = measured_step(name, log_dir=log_dir)
        ideal, _ = ideal_step(name, log_dir=log_dir)
        a, b = span(measured), span(ideal)
        out.append(f"{layout(name, log_dir)['schedule']}, {m} micro-batches: the step took {1000 * a:.1f} ms, "
                   f"its ideal (this run's median compute, sends free) {1000 * b:.1f} ms; "
                   + (f"{1 - b / a:.0%} of the step is not in the ideal (sends, waits, and "
                      f"micro-batches slower than their median: a remainder, not measured apart)"
                      if a > b else "it ran no slower than its ideal"))
    return out


def manual_waits(name, log_dir=LOG_DIR):
    """Per rank, over the manual run's steps (the first left out: warm-up): the share of the step spent
    computing, sending and waiting to receive."""
    import pandas as pd
    t = steps(name, log_dir)
    rows = []
    for rank, g in t.groupby("rank"):
        total = g["step_s"].sum()
        share = {NAMES[k]: sum(e[4] - e[3] for ev in g["events"] for e in ev if e[1] == k) / total for k in "FBSR"}
        rows.append(dict(rank=rank, **share))
    return pd.DataFrame(rows).set_index("rank")


def memory_table(gpipe, one_f_one_b, log_dir=LOG_DIR):
    """Activation peaks per stage and micro-batch count for two sweeps, with what each schedule keeps
    alive in theory (GPipe: all m micro-batches; 1F1B: at most p - stage) in units of one micro-batch."""
    import pandas as pd
    rows = []
    p = layout(gpipe, log_dir)["pipeline_ranks"]
    for m in sorted(set(steps(gpipe, log_dir)["microbatches"]) & set(steps(one_f_one_b, log_dir)["microbatches"])):
        g, o = peak_activations(gpipe, m, log_dir), peak_activations(one_f_one_b, m, log_dir)
        for stage in g.index:
            one_mb = g[stage] / m  # GPipe holds all m: one micro-batch's activations
            rows.append(dict(microbatches=m, stage=stage, gpipe_mb=g[stage] / 2**20, one_f_one_b_mb=o[stage] / 2**20,
                             gpipe_alive=g[stage] / one_mb, one_f_one_b_alive=o[stage] / one_mb,
                             one_f_one_b_theory=min(m, p - stage)))
    return pd.DataFrame(rows)


def memory_plot(t, name):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for stage, g in t.groupby("stage"):
        ax.plot(g["microbatches"], g["gpipe_mb"], "o-", label=f"GPipe, stage {stage}")
        ax.plot(g["microbatches"], g["one_f_one_b_mb"], "s--", label=f"1F1B, stage {stage}")
    ax.set_xscale("log", base=2)
    ax.set(title="Peak activation memory per stage (same batch)", xlabel="micro-batches m", ylabel="MiB saved for backward")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    save(fig, name)
    return fig


def about_memory(t):
    """Sentences computed from memory_table: 1F1B against GPipe at the largest micro-batch count."""
    m = t["microbatches"].max()
    out = []
    for _, r in t[t["microbatches"] == m].iterrows():
        out.append(f"stage {int(r['stage'])}, {m} micro-batches: GPipe kept {r['gpipe_mb']:.2f} MiB of activations "
                   f"({r['gpipe_alive']:.1f} micro-batches), 1F1B {r['one_f_one_b_mb']:.2f} MiB "
                   f"({r['one_f_one_b_alive']:.1f}; at most {int(r['one_f_one_b_theory'])} in theory): "
                   + ("1F1B lower" if r["one_f_one_b_mb"] < r["gpipe_mb"] else "1F1B NOT lower"))
    return out


def runnable(names):
    """The schedules of `names` that this torch runs on CPU processes over gloo, in their order
    (trainup.parallel.pipeline.runs_over_gloo): on a torch older than pipeline.V_OVER_GLOO the V-shaped ones
    are left out, and one printed sentence says which and why; on a newer one nothing is printed."""
    import torch
    from trainup.parallel import pipeline
    kept = [s for s in names if pipeline.runs_over_gloo(s)]
    left = [s for s in names if s not in kept]
    if left:
        newer = ".".join(map(str, pipeline.V_OVER_GLOO))
        one = len(left) == 1
        print(f"This is torch {torch.__version__}, and {' and '.join(left)} "
              f"{'needs' if one else 'need'} torch {newer} or newer over gloo (its pipelining "
              "first sends to a V stage's neighbour on the same rank, which gloo refuses), so "
              f"this lesson leaves {'it' if one else 'them'} out.")
    return kept


def run_names(name, schedules):
    """The runs a job of these schedules writes, as the script names them (pipeline_runs)."""
    from trainup.parallel.pipeline_runs import run_name
    return [run_name(name, s, schedules) for s in schedules]


def run(script, *args, name, nproc=2, quick=None, timeout=900, schedules=None):
    """A torchrun job of a pipeline script (launch.run's command), then one sentence checked from its log.

    With schedules=[...], ONE job runs each in turn (--schedule a,b,...: one start-up, not one per schedule),
    each its own run <name>_<schedule> (one schedule: <name>); a sentence for each, and their names
    are returned."""
    from .. import jobs
    from ..launch import command, environment
    if schedules:
        args = ("--schedule", ",".join(schedules), *args)
    argv, printed = command(script, args, name, nproc, quick)
    print(printed)
    proc = jobs.run(argv, timeout=timeout, env=environment())
    if proc.returncode != 0:
        raise failed("torchrun", proc.stdout[-1000:] + proc.stderr, proc.returncode)
    names = run_names(name, schedules) if schedules else [name]
    for n in names:
        print(check(n))
    return names if schedules else name


def check(name, log_dir=LOG_DIR):
    """Finished, the log follows the schema, and what was measured: epochs (loss fell?) or micro-batch counts."""
    r = read_run(Path(log_dir) / f"{name}.jsonl")
    if r["problems"] or not r["summary"] or r["summary"]["status"] != "finished":
        raise AssertionError(f"{name}: did not finish, or its log breaks the schema: {r['problems']}")
    t = steps(name, log_dir)
    losses = [e["loss"] for e in r["epochs"]] or [x for x in (r["summary"].get("first_loss"),
                                                             r["summary"].get("last_loss")) if x is not None]
    parts = [f"{name}: finished", f"{len(t)} stage-steps timed"]
    if len(set(t["microbatches"])) > 1:
        parts.append(f"micro-batch counts {', '.join(map(str, sorted(set(t['microbatches']))))}")
    if len(losses) >= 2:
        parts.append("the training loss fell" if losses[-1] < losses[0] else "the training loss DID NOT FALL")
    return ", ".join(parts + ["the log follows the schema"]) + "."


def gantt_grid(names, image, log_dir=LOG_DIR, **kw):
    """Several runs' measured steps, one panel each, on a common time axis."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 1.6 * len(names) + 0.6), sharex=True, squeeze=False)
    for name, ax in zip(names, axes[:, 0]):
        gantt(name, None, log_dir=log_dir, ax=ax, **kw)
    save(fig, image)
    return fig


GPU_SWEEP = "pp_sweep_gpu"  # the sweep with one stage per GPU; tools/gpu_reference_runs.sh writes it too


def gpu_sweep_size(quick):
    """The GPU sweep's blocks: 4 (quick: 2) times the CPU sweep's widest, so that even at m = 16 a
    micro-batch's matrix products are long next to a kernel launch and a NCCL send."""
    return ["--blocks", 8, "--width", 2048 if quick else 4096]


def sweep_on_gpus(batch, size, gpus=None, quick=None):
    """The bubble sweep again with one stage per GPU (activations sent over NCCL; each micro-batch
    timed with CUDA events, nothing made to wait), where this machine has 2 GPUs or more: 8
    or 4 stages where it has as many, else 2; blocks sized for GPUs (gpu_sweep_size; `size`, the CPU
    sweep's, is not used). Bubble tables of this run, else of the reference runs committed
    (after one sentence saying what the run needs); {} where there are neither."""
    from . import gpu
    from ..placement import gpu_count
    from ..report import QUICK
    gpus = gpu_count() if gpus is None else gpus
    if gpus >= 2:
        p = 8 if gpus >= 8 else 4 if gpus >= 4 else 2  # 8 blocks: a whole number a stage
        names = run("_trainup_pipeline.py", "--device", "cuda", "--stages", p,
                    "--sweep", "1,2,4,8,16", "--sweep-steps", 3, "--batch-size", batch,
                    *gpu_sweep_size(QUICK if quick is None else quick), name=GPU_SWEEP,
                    schedules=["gpipe", "1f1b"], quick=quick, nproc=p)
        return {"here": bubble_table(names)}
    print(f"This machine has {gpus} GPU(s), and one stage per GPU needs 2, so the sweep ran on CPU processes "
          f"only. " + gpu.about_references(f"{GPU_SWEEP}_gpipe"))
    found = gpu.references(f"{GPU_SWEEP}_gpipe")
    return {p.parent.name: bubble_table([f"{GPU_SWEEP}_gpipe", f"{GPU_SWEEP}_1f1b"], p.parent) for p in found}


def plot_cut(name, image, log_dir=LOG_DIR):
    """The run's cut, from its 'pipeline' record: the model's layers left to right (stem, blocks,
    head), each stage's blocks on the rank that holds it, and the batch cut into micro-batches that
    flow through the stages; saved to images/<image>.png."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle
    cfg = layout(name, log_dir)
    where = {s: p["rank"] for p in cfg["placement"] if p["pipeline"] == 0 for s in p["stages"]}
    n, m = cfg["stages"], cfg["microbatches"]
    layers = 2 + cfg["blocks"]  # the stem, the blocks, the head (with the loss)
    fig, ax = plt.subplots(figsize=(10, 2.9))
    for s, (first, end) in enumerate(cfg["stage_blocks"]):
        a = first + (s > 0)  # slots: the stem is slot 0, block i slot i + 1, the head the last
        b = end + 1 + (s == n - 1)
        ax.add_patch(Rectangle((a + 0.05, -0.15), b - a - 0.1, 1.3, fc=f"C{where[s]}", alpha=0.18,
                               ec=f"C{where[s]}"))
        ax.text((a + b) / 2, 1.25, f"stage {s} on rank {where[s]}", ha="center", fontsize=9)
        if s < n - 1:
            ax.add_patch(FancyArrowPatch((b - 0.6, 1.0), (b + 0.6, 1.0), arrowstyle="-|>",
                                         mutation_scale=14, color="0.2", lw=1.5, zorder=5))
            ax.add_patch(FancyArrowPatch((b + 0.6, 0.0), (b - 0.6, 0.0), arrowstyle="-|>",
                                         mutation_scale=14, color="C3", lw=1.5, zorder=5))
    names = ["stem"] + [f"block {i}" for i in range(cfg["blocks"])] + ["head, loss"]
    for i, label in enumerate(names):
        ax.add_patch(Rectangle((i + 0.15, 0.1), 0.7, 0.8, fc="white", ec="0.4"))
        ax.text(i + 0.5, 0.5, label, ha="center", va="center", fontsize=7, rotation=90)
    size = cfg["microbatch_size"]
    for k in range(m):  # the micro-batches wait at the first stage's door, in order
        ax.add_patch(Rectangle((-1.1 - 0.45 * k, 0.25), 0.35, 0.5, fc="C2", alpha=0.5, ec="C2"))
        ax.text(-0.93 - 0.45 * k, 0.5, str(k), ha="center", va="center", fontsize=8)
    ax.add_patch(FancyArrowPatch((-0.65, 0.5), (0.1, 0.5), arrowstyle="-|>", mutation_scale=14,
                                 color="C2", lw=1.5))
    ax.text(-0.75 - 0.225 * m, -0.05, f"{m} micro-batches\nof {size} samples", ha="center",
            va="top", fontsize=8)
    ax.text(layers / 2, -0.35, "black arrow: a micro-batch's activations sent forward;  red: the "
            "gradient of that input sent back", ha="center", va="top", fontsize=8)
    ax.set_xlim(-1.3 - 0.45 * m, layers + 0.2)
    ax.set_ylim(-0.75, 1.55)
    ax.axis("off")
    per = cfg["stages_per_rank"]
    ax.set_title(f"{name}: {cfg['blocks']} blocks cut into {n} stages on {cfg['pipeline_ranks']} "
                 f"ranks ({per} each); each batch cut into {m} micro-batches", fontsize=10)
    save(fig, image)
    return fig
