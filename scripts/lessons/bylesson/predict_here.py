"""Lesson 11: this machine's runs of 2 processes, predicted from its runs of 1 and its runs at a
smaller batch (a reference set that lessons/reference.py made), and the prediction checked
against them.

    an epoch of a rank = its compute + steps x (the communication of one step)

- compute: the 1-process run of the same script, stage and model at the per-rank batch (each
  step then does what a rank of 2 does: the same per-step costs, the optimizer step, the stage's
  own hooks and copies), scaled to the rank's share of the samples; made beside a copy of itself
  (lessons/reference.py's BESIDE), as a rank computes beside the other: the mean of the two;
- communication: measured in steps (step_comm): the same job at 8 samples a rank, on 2
  processes and on 1 (lessons/reference.py's COMM runs, the second made beside a copy as above);
  a step of the first less a step of the second is what the strategy's step communicates, its
  calls made as the step makes them (between computations, through DDP's or FSDP's code) on
  the same bytes;
- beside it, the alpha-beta model alone (sweep_s): what a step runs (lesson 09's shard_comm
  record; for lesson 04's DDP script, its gradients in DDP's buckets), each call costed with the
  alpha and beta fitted to that op's sweep (all_reduce, broadcast, all_gather, reduce_scatter
  timed apart: gloo runs some slower than their ring formula says), one call at a time between
  idle ranks; about_sweep says what each call of a step cost beyond that;
- nothing fitted on the runs predicted; no overlap: see predict_run.
"""
import math
from pathlib import Path

from .. import perfmodel as pm
from .. import reference
from .collectives import op_table, swept_ops
from ..log_reader import read_run
from .predict import fit_alpha_beta
from .zero_stages import LABELS

GOAL = 0.15  # each prediction within 15 % of the measured epoch
SWEEP = "ref_bandwidth"
STAGES = ("none", "optimizer", "gradients", "parameters")
# each predicted run of 2 processes, and the 1-process run at its per-rank batch
PREDICTED = [("ref_ddp_n2", "ref_ddp_n1_b32")] + [
    (f"ref_{stack}_n2_{m}", f"ref_{stack}_n1_b32_{m}") for stack in ("fsdp", "wide")
    for m in STAGES]
FIRST_BUCKET, BUCKET_CAP = 2**20, 25 * 2**20  # DDP's bucket_cap_mb and its smaller first bucket


def read(folder, name):
    run = read_run(Path(folder) / f"{name}.jsonl")
    assert not run["problems"] and (run["summary"] or {}).get("status") == "finished", \
        f"{name}: not a finished run in the schema: {run['problems']}"
    return run


def epoch_s(run):
    """The run's epoch, measured: the median over its epochs after the first (the first warms up,
    and there the sharding script counts one step's collectives and gathers every rank's bytes:
    a step the course disturbs)."""
    import statistics
    timed = [e["wall_s"] for e in run["epochs"][1:]]
    assert timed, f"{run['path'].stem}: one epoch only, none timed"
    return statistics.median(timed)


def rank_share(run):
    """(samples a rank trains in an epoch, steps it takes): DistributedSampler pads the data to a
    multiple of the ranks; the last batch may be short."""
    world = run["env"]["world_size"]
    per_rank = math.ceil(run["epochs"][-1]["samples"] / world)
    return per_rank, math.ceil(per_rank / (run["config"]["args"]["batch_size"] // world))


def ddp_buckets(sizes, first=FIRST_BUCKET, cap=BUCKET_CAP):
    """Bytes of each of DDP's gradient buckets: parameters in reverse order (backward computes
    the last first), a bucket closed once it holds cap bytes (the first: 1 MiB, so an all-reduce
    starts early)."""
    buckets, current, limit = [], 0, first
    for n in reversed(sizes):
        current += n
        if current >= limit:
            buckets.append(current)
            current, limit = 0, cap
    return buckets + ([current] if current else [])


def ddp_ops(run):
    """One step's collectives of lesson 04's DDP script: its model's gradients (float32, built as
    the script builds it), all-reduced bucket by bucket."""
    from types import SimpleNamespace

    from trainup import models
    args = run["config"]["args"]
    shape = SimpleNamespace(shape=tuple(args["image_shape"]), num_classes=args["num_classes"])
    model = models.build(SimpleNamespace(**args), shape)
    sizes = ddp_buckets([p.numel() * 4 for p in model.parameters()])
    return {"all_reduce": {"calls": len(sizes), "bytes": sum(sizes)}}


def step_ops(run):
    """What one step communicates: the sharding script counted it (shard_comm); the DDP script's
    gradients otherwise."""
    counted = [r["ops"] for r in run["extra"] if r.get("type") == "shard_comm"]
    return counted[-1] if counted else ddp_ops(run)


def step_comm(folder, name):
    """Seconds of one step's communication as the run's job makes it: a step of its COMM pair's
    2-process run less one of its 1-process run (lessons/reference.py), both at 8 samples a rank
    (the same compute), the latter the mean with its copy made beside it where the set has it;
    None where the set has no such pair."""
    pair = reference.comm(name)
    if not pair or not all((Path(folder) / f"{n}.jsonl").exists() for n in pair):
        return None
    two = read(folder, pair[0])
    ones = [read(folder, n) for n in (pair[1], reference.beside(pair[1]))
            if (Path(folder) / f"{n}.jsonl").exists()]
    step = [epoch_s(r) / rank_share(r)[1] for r in ones]
    return epoch_s(two) / rank_share(two)[1] - sum(step) / len(step)


def predict_run(folder, name, one, alpha, beta):
    """One 2-process run against its prediction: a row of the table."""
    run, alone = read(folder, name), read(folder, one)
    per_rank, steps = rank_share(run)
    # the 1-process run did every sample at the per-rank batch: a rank does its share of them.
    # With the copy made beside it, the two's mean (a set made before BESIDE has the one alone).
    pair = [alone] + [read(folder, b) for b in [reference.beside(one)]
                      if b and (Path(folder) / f"{b}.jsonl").exists()]
    compute = sum(epoch_s(r) / r["epochs"][-1]["samples"] for r in pair) / len(pair) * per_rank
    # the same run made alone, where the set has it: what the prediction would be from that
    solo = [read(folder, a) for a in [reference.alone(one)]
            if a and (Path(folder) / f"{a}.jsonl").exists()]
    compute_alone = (epoch_s(solo[0]) / solo[0]["epochs"][-1]["samples"] * per_rank if solo
                     else math.nan)
    ops = step_ops(run)
    world = run["env"]["world_size"]
    swept = steps * pm.collectives(ops, world, alpha, beta)  # the sweep's alpha and beta alone
    # the part of it the calls' latencies make, the bytes left out: alpha's share
    latency = steps * pm.collectives({op: dict(c, bytes=0) for op, c in ops.items()}, world,
                                     alpha, beta)
    per_step = step_comm(folder, name)  # measured in steps, where the set has the COMM pair
    comm = swept if per_step is None else steps * per_step
    calls = sum(c.get("calls", 0) for c in ops.values())
    buckets = ops.get("all_reduce", {}).get("calls", 1)
    # No communication hidden: both cores compute (a rank each, one thread each), gloo moves CPU
    # memory with those same cores, and most collectives here wait for each call (ZeRO-1's
    # broadcasts, the by-hand ZeRO-2's reduce-scatters). `overlapped` is what DDP's bucket overlap
    # (perfmodel.exposed) would predict instead; the measured runs decide (about_overlap).
    predicted = compute + comm
    overlapped = compute + steps * pm.exposed(comm / steps, 2 / 3 * compute / steps, buckets)
    shard = run["config"]["args"].get("shard", "none")
    measured = epoch_s(run)
    timed = [e["wall_s"] for e in run["epochs"][1:]]
    return dict(run=name, strategy=LABELS[shard], processes=world, steps=steps,
                width=run["config"]["args"].get("width"), calls_per_step=calls,
                alpha_share=latency / swept if swept else 0.0,
                measured_s=measured, spread=(max(timed) - min(timed)) / measured,
                compute_s=compute, comm_s=comm, comm_from="sweep" if per_step is None else "steps",
                predicted_s=predicted, error=predicted / measured - 1,
                sweep_comm_s=swept, sweep_s=compute + swept,
                sweep_error=(compute + swept) / measured - 1,
                overlapped_s=overlapped, overlapped_error=overlapped / measured - 1,
                compute_alone_s=compute_alone,
                alone_error=(compute_alone + comm) / measured - 1)


def predictions(folder, pairs=PREDICTED, sweep=SWEEP):
    """Every predicted run of a reference folder: measured and predicted epoch (seconds), the
    compute and communication parts, the error; and {op: (alpha, beta)} fitted to each op of the
    folder's sweep (an op it did not time is priced as all_reduce: perfmodel.collectives)."""
    import pandas as pd
    fits = {op: fit_alpha_beta(op_table(sweep, op, folder), op)[:2]
            for op in swept_ops(sweep, folder)}
    alpha = {op: a for op, (a, _) in fits.items()}
    beta = {op: b for op, (_, b) in fits.items()}
    rows = [predict_run(folder, name, one, alpha, beta) for name, one in pairs
            if (Path(folder) / f"{name}.jsonl").exists()]
    return pd.DataFrame(rows), fits


def fits_table(fits):
    """Each op's alpha (us) and beta (GB/s), as the sweep gave them."""
    import pandas as pd
    return pd.DataFrame([dict(op=op, alpha_us=a * 1e6, beta_gbps=b / 1e9)
                         for op, (a, b) in fits.items()])


def within(table, goal=GOAL):
    return table["error"].abs() <= goal


def about_misses(table, fits, goal=GOAL):
    """One sentence per run outside the goal, worked out from it: how much of each step the model
    missed, and that per collective call against all_reduce's alpha (a cost per call that the
    sweep, one call at a time, does not show); or, where it predicted too much, whether its compute
    alone (the 1-process run) already took longer than the measured step."""
    alpha = fits["all_reduce"][0]
    out = []
    for r in table[~within(table, goal)].itertuples():
        gap = (r.measured_s - r.predicted_s) / r.steps
        head = f"{r.run} ({r.strategy}): {r.error:+.0%}"
        if gap > 0 and r.calls_per_step:
            out.append(f"{head}; the model missed {gap * 1e3:.2f} ms a step, "
                       f"{gap / r.calls_per_step * 1e6:,.0f} us for each of its "
                       f"{r.calls_per_step} collective calls, against all_reduce's alpha "
                       f"{alpha * 1e6:,.0f} us.")
        elif gap > 0:
            out.append(f"{head}; the model missed {gap * 1e3:.2f} ms a step, no collective in it.")
        elif r.compute_s > r.measured_s:
            out.append(f"{head}; its compute alone, from the 1-process run, is "
                       f"{r.compute_s / r.steps * 1e3:.2f} ms a step against "
                       f"{r.measured_s / r.steps * 1e3:.2f} ms measured: that run computed slower "
                       f"than a rank of this one.")
        else:
            out.append(f"{head}; the model added {-gap * 1e3:.2f} ms a step: its "
                       f"{r.calls_per_step} collective calls cost less than alpha and beta say.")
    return out


def about_sweep(table, fits, goal=GOAL):
    """The alpha-beta model alone, against the runs: its errors, and per run outside the goal what
    each collective call of a step cost beyond what the sweep (one call at a time, between idle
    ranks) says, against all_reduce's alpha. Only the runs whose communication was measured in
    steps."""
    steps = table[table.comm_from == "steps"]
    if not len(steps):
        return []
    alpha = fits["all_reduce"][0]
    errors = steps.sweep_error
    out = [f"From the sweep alone (alpha and beta) the errors are {errors.min():+.0%} to "
           f"{errors.max():+.0%}, {int((errors.abs() <= goal).sum())} of {len(steps)} within "
           f"{goal:.0%}; with the communication measured in steps, "
           f"{int(within(steps, goal).sum())}."]
    for r in steps[errors.abs() > goal].itertuples():
        extra = (r.comm_s - r.sweep_comm_s) / r.steps / r.calls_per_step
        out.append(f"{r.run} ({r.strategy}): {r.sweep_error:+.0%} from the sweep; a step's "
                   f"{r.calls_per_step} collective calls took {r.comm_s / r.steps * 1e3:.2f} ms, "
                   f"the sweep says {r.sweep_comm_s / r.steps * 1e3:.2f}: {extra * 1e6:+,.0f} us "
                   f"each, against all_reduce's alpha {alpha * 1e6:,.0f} us.")
    return out


def about_regimes(table, goal=GOAL, error="sweep_error"):
    """Where the alpha-beta model holds, worked out from the table: the runs whose predicted
    communication is mostly the calls' latencies (alpha's share above half) against those where
    it is mostly bytes, each group's errors (the column error) and how many are within the goal."""
    out = []
    for name, part in (("mostly latency", table[table.alpha_share > 0.5]),
                       ("mostly bytes", table[table.alpha_share <= 0.5])):
        if len(part):
            e = part[error]
            out.append(f"{len(part)} run(s) whose predicted communication is {name} (alpha's "
                       f"share {part.alpha_share.min():.0%} to {part.alpha_share.max():.0%}): "
                       f"errors {e.min():+.0%} to {e.max():+.0%}, "
                       f"{int((e.abs() <= goal).sum())} within {goal:.0%}.")
    return " ".join(out)


def about_noise(table, goal=GOAL):
    """How far apart the run's own timed epochs are (max - min, over their median: spread),
    against the errors: a miss within that spread is not told apart from the machine's noise."""
    missed = table[~within(table, goal)]
    beyond = int((missed["error"].abs() > missed["spread"]).sum())
    head = (f"Each run's own timed epochs spread by {table.spread.min():.0%} to "
            f"{table.spread.max():.0%} of their median (the same job, epoch after epoch); ")
    if not len(missed):
        return head + f"no run is outside {goal:.0%}."
    return head + (f"{beyond} of the {len(missed)} run(s) outside {goal:.0%} missed by more "
                   f"than their own spread.")


def about_beside(table, goal=GOAL):
    """What computing beside another process costs, from the runs made both ways, and what the
    prediction would be with each rank's compute measured alone."""
    both = table[table["compute_alone_s"].notna()]
    if not len(both):
        return "The set has no 1-process run made alone: nothing to compare."
    slower = both["compute_s"] / both["compute_alone_s"] - 1
    groups = [("lesson 04's CNN", slower[both.width.isna()])] + [
        (f"the stack {int(w)} wide", slower[both.width == w])
        for w in sorted(both.width.dropna().unique())]
    per = "; ".join(f"{label} {s.min():+.0%} to {s.max():+.0%}" for label, s in groups if len(s))
    met = int((both["alone_error"].abs() <= goal).sum())
    return (f"Beside a copy of itself, a 1-process run computed {slower.min():+.0%} to "
            f"{slower.max():+.0%} against the same run alone ({per}). From the runs alone the "
            f"errors would be {both.alone_error.min():+.0%} to {both.alone_error.max():+.0%}, "
            f"{met} of {len(both)} within {goal:.0%}, against {int(within(both, goal).sum())} "
            f"from the runs made beside.")


def about_overlap(table):
    """Which of the two, no overlap or DDP's bucket overlap, the measured runs side with."""
    plain, hidden = table["error"].abs().mean(), table["overlapped_error"].abs().mean()
    better = "without overlap" if plain <= hidden else "with DDP's bucket overlap"
    return (f"Mean error {plain:.1%} with no communication hidden, {hidden:.1%} had DDP's buckets "
            f"overlapped backward: these runs are predicted better {better}.")


def about_headline(table, goal=GOAL):
    """What is predicted and what is fitted, counted from the table: the alpha-beta model from the
    sweep (and the 1-process runs) is the prediction one could make before the 2-process runs;
    the calibrated one took each step's communication from the same job's 2-process runs at 8
    samples a rank, so it extrapolates in batch size only."""
    sweep, steps = table["sweep_error"], table["error"]
    out = (f"Before any 2-process run (the alpha-beta model from the sweep, compute from the "
           f"1-process runs): {int((sweep.abs() <= goal).sum())} of {len(table)} within "
           f"{goal:.0%}, errors {sweep.min():+.0%} to {sweep.max():+.0%}.")
    if (table["comm_from"] == "steps").any():
        out += (f" Calibrated on the same jobs' 2-process runs at 8 samples a rank (their step's "
                f"communication): {int((steps.abs() <= goal).sum())} of {len(table)} within "
                f"{goal:.0%}, errors {steps.min():+.0%} to {steps.max():+.0%}: a test that this "
                f"communication does not grow with the batch, not a prediction made before "
                f"running the job on 2 processes.")
    return out


def about_choice(chosen_on, judged_on, names=("the earlier set", "this set"), goal=GOAL):
    """The model's two variants (no overlap against DDP's bucket overlap; compute beside a copy
    against alone), each chosen on one reference set and judged on another: sentences counted
    from both sets' tables."""
    def overlap(t):
        return t["error"].abs().mean(), t["overlapped_error"].abs().mean()
    (a, b), (c, d) = overlap(chosen_on), overlap(judged_on)
    pick = "no overlap" if a <= b else "DDP's bucket overlap"
    holds = (c <= d) == (a <= b)
    out = [f"Overlap: on {names[0]} the mean error was {a:.1%} with no communication hidden and "
           f"{b:.1%} with DDP's buckets overlapped, so {pick} is chosen there; on {names[1]}, "
           f"which the choice never saw, {c:.1%} against {d:.1%}: "
           + ("the choice holds." if holds else "the choice does not hold.")]
    both = [t[t["compute_alone_s"].notna()] for t in (chosen_on, judged_on)]
    if all(len(t) for t in both):
        beside, alone = [[int((t[col].abs() <= goal).sum()) for t in both]
                         for col in ("error", "alone_error")]
        out.append(f"Compute beside a copy or alone: {beside[0]} against {alone[0]} runs within "
                   f"{goal:.0%} on {names[0]}, {beside[1]} against {alone[1]} on {names[1]}"
                   + ("; the two sets disagree on which is better, so the choice of 'beside' "
                      "rests on the runs it predicts." if (beside[0] - alone[0]) *
                      (beside[1] - alone[1]) <= 0 else "; both sets agree."))
    return " ".join(out)
