"""Lesson 10: the scaling report over every run the course made, in one table and its figures.

    cd scripts && python -m lessons.bylesson.scaling_report        # the table, figures in images/

    from lessons.bylesson import scaling_report as sr
    runs = sr.load(LOG_DIR)                  # every log in logs/ and logs/reference/*/, one row per run
    table = sr.performance(runs)             # throughput, speedup, efficiency, memory, loss, accuracy

STRATEGIES is the registry: one declaration per strategy (which runs are its runs, which single-process run
it must equal, what it needs), read from the course's manifest (lessons/manifest.py), where a lesson adds
its strategy, in its script's entry. The proof that each strategy
trains the same model as one process (float64 runs, one tolerance, the noise floor measured here),
and the recommendation, are lesson 10a's: lessons/bylesson/equivalence.py, `python -m
lessons.bylesson.equivalence`.

Logs of every committed version of the schema are read (git log -p scripts/trainup/metrics.py). It has
been version 1 all along, but what a version-1 log holds grew; what this reader adapts to:
- 39a402e (first): only config, env, epoch, summary; no 'ddp' record, so the per-device batch is worked
  out from the global batch and world size; checkpoints without 'scaler' (only 'model' is read here).
- Lesson records were added later (sweep, gpu, dp_phases, ddp, ranks, accumulate, pipeline, pipe_step...,
  pipe_step's start_s in a06d52c): records this reader does not use are kept aside and not checked, so a
  log written by a newer lesson (a record type or a schema version this copy does not know) still reads.
- Since 9f2f82f check_record rejects unknown types and wrong JSON types, since 3e950ed non-finite numbers:
  applied to the four core records only; a core record that breaks them drops the run, with the reason.
- A sweep run's summary has loss and samples_per_s null (no epochs): not a training run, not in the table.
- A resumed run appends a config and env, then its epochs: the last of each is kept.
"""
import argparse
import sys
from pathlib import Path

from trainup import CHECKPOINT_DIR, IMAGE_DIR, LOG_DIR
from trainup.schema import SCHEMA_VERSION

from .. import checks
# the registry's names that notebooks, solutions and tests say sr.X for
from ..manifest import (ABOVE_1, ONE_DEVICE, PIPELINES, TRANSFORMERS, Strategy,  # noqa: F401
                        strategies)
from ..log_reader import read_run
from ..report import measured_on, save, steady_rate

CORE = ("config", "env", "epoch", "summary")
# A script without the flag trains this way (the same data order every epoch with --no-set-epoch; Horovod's
# --fp16-allreduce rounds the gradients): a run with another value has no baseline, not a failure.
DEFAULTS = dict(optimizer="adadelta", precision="32", no_set_epoch=False, fp16_allreduce=False, monitor=False,
                profile=None)
# What makes a throughput comparable: the same work per step (the model by its architecture and size),
# on the same kind of machine, set up the same way: threads per process (on a CPU), precision, and no
# instrument in one run only (--monitor and --profile add work to every step).
# Every flag that changes the work is matched: the strategy's own flags (--shard: ZeRO-2's hooks are
# not DDP's all-reduce, even on one process; --accumulate), the data's size, and the device.
# The experts' capacity bounds what they compute, and compiled kernels are not eager ones. A layout
# degree (--tp, --pp, the processes --cp stands for) is not work: a one-device run has 1 of each.
SAME_WORK = ("dataset", "model", "batch_size", "image_shape", "num_classes", "blocks", "width",
             "hidden", "heads", "train_size", "shard", "accumulate", "sequence_parallel",
             "capacity_factor", "compile", "compile_mode")
SAME_SETUP = ("precision", "monitor", "profile")
# A flag left out means the script's default: a script without --accumulate takes whole batches.
WORK_DEFAULTS = dict(accumulate=1, compile=False, compile_mode="default")
# Above this efficiency the "one device" did other work than the run, whatever the flags say (a loaded
# machine, another data path): N devices more than N times as fast as one would need a cache or memory
# effect the course does not measure. Such a row is shown without speedup, never recommended.
COMPARABLE_EFFICIENCY = 1.0
# Lesson records whose fields say how a run was laid out (a flag's default is worked out in the script).
LAYOUT_RECORDS = {"tp": ("tp", "dp")}
FLOAT64 = ("64", "64-true", "double")  # --precision's spellings of float64 (Lightning's too)


# ---------------------------------------------------------------------------------------------- registry

# The registry is the manifest's (lessons/manifest.py): each script's entry declares its strategies,
# which runs are theirs and which one-process run each must equal; this is them in course order.
STRATEGIES = strategies()


# ----------------------------------------------------------------------------------------------- helpers

def described(conditions):
    """A registry row's conditions as a learner reads them: 'script _trainup_gpu.py or
    _trainup_compile.py, devices 1, compile off' (a flag left out, None, is its default: off)."""
    def value(v):
        if callable(v):
            return "above 1" if v is ABOVE_1 else "as required"
        if isinstance(v, tuple):
            named = [value(x) for x in v if x is not None]
            return " or ".join(dict.fromkeys(named))
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else str(v)
    return ", ".join(f"{k} {value(v)}" for k, v in conditions.items())


def fits(want, value):
    """One condition of the registry: equal to a value, in a tuple, or true for a function."""
    if callable(want):
        return bool(want(value))
    if isinstance(want, tuple):
        return value in want
    return value == want


def same(a, b, keys):
    """Two runs' facts agree on every key."""
    return all(a.get(k) == b.get(k) for k in keys)


def checkpoint_of(run, checkpoint_dir=CHECKPOINT_DIR):
    """The run's checkpoint file if it is on this machine (references keep none: it is local)."""
    if run["facts"]["measured_on"] != "here":
        return None
    named = Path(checkpoint_dir) / f"{run['name']}.pt"
    for p in ((run["summary"] or {}).get("checkpoint"), named):
        if p and Path(p).is_file():
            return Path(p)
    return None


# ----------------------------------------------------------------------------------------------- reading

def read_log(path):
    """One log: its core records checked against the schema, the lesson records kept aside unchecked
    (a newer course's are read by their core records); a missing record is said by load()."""
    return read_run(path, checked=CORE, required=())


def log_paths(log_dir=LOG_DIR):
    """This machine's logs (logs/*.jsonl) and the committed references (logs/reference/<machine>_<date>/)."""
    log_dir = Path(log_dir)
    return sorted(log_dir.glob("*.jsonl")) + sorted(log_dir.glob("reference/*/*.jsonl"))


def _devices(script, args, env):
    """Devices (or processes) that trained together: ranks, DataParallel's GPUs, Hogwild's processes."""
    n = env.get("world_size") or 1
    if script == "_trainup_dp.py" and str(env.get("device", "")).startswith("cuda"):
        n = args.get("gpus") or len(env.get("gpus") or []) or 1
    return max(n, args.get("num_processes") or 1)




def architecture(script, args):
    """The model a run trained, by what it is: the block-stack scripts ignore --model (tp's default 'cnn'
    names nothing it trained)."""
    if script == "_trainup_tp.py":
        return f"feed-forward {args.get('blocks')}x{args.get('width')}, hidden {args.get('hidden')}"
    if script in TRANSFORMERS:  # a causal mask, or experts in place of the MLPs: another model
        experts = script == "_trainup_experts.py"
        return (f"{'MoE ' * experts}transformer {args.get('blocks')}x{args.get('width')}, "
                f"{args.get('heads')} heads, "
                + (f"{args.get('experts')} experts top-{args.get('top_k')}, " if experts else "")
                + f"hidden {args.get('hidden')}{', causal' * bool(args.get('causal'))}")
    if script.startswith("_trainup_pipeline") or args.get("model") == "blocks":
        return f"blocks {args.get('blocks')}x{args.get('width')}"
    return args.get("model")


def facts(run):
    """What the registry and the matching look at: the script, where and on what it ran, and its flags."""
    cfg, env = run["config"] or {}, run["env"] or {}
    args = {**DEFAULTS, **(cfg.get("args") or {})}
    script = cfg.get("script", "")
    devices = _devices(script, args, env)
    device = str(env.get("device", "cpu")).split(":")[0]
    gpus = env.get("gpus") or []
    hardware = f"{gpus[0]}" if device == "cuda" and gpus else f"CPU, {env.get('cpu_count', '?')} cores"
    layout = {k: rec[k] for rec in run["extra"] if isinstance(rec, dict) for k in LAYOUT_RECORDS.get(rec.get("type"), ())
              if k in rec}
    # an elastic job logs a 'ddp' record at each start: one whose world size changed (lesson 04c)
    sizes = {rec.get("world_size") for rec in run["extra"]
             if isinstance(rec, dict) and rec.get("type") == "ddp"}
    return {**args, **layout, "model": architecture(script, args), "script": script,
            "world_size": env.get("world_size", 1), "devices": devices, "device": device,
            "threads": env.get("threads"), "elastic": len(sizes) > 1,
            "hardware": hardware, "measured_on": measured_on(run["path"]), "time": cfg.get("time", 0),
            "schema_version": cfg.get("schema_version")}


def classify(f, strategies=None):
    """The first registry row whose `where` holds for these facts, or None."""
    for s in strategies or STRATEGIES:
        if all(fits(v, f.get(k)) for k, v in s.where.items()):
            return s
    return None


def load(log_dir=LOG_DIR):
    """Every finished training run (at least one epoch) in logs/ and logs/reference/: a list of dicts with
    the run's records, its facts and its strategy; and the runs left out, with why."""
    runs, left_out = [], []
    for path in log_paths(log_dir):
        r = read_log(path)
        why = ("; ".join(r["problems"][:2]) if r["problems"] else
               "no config" if r["config"] is None else
               "did not finish" if (r["summary"] or {}).get("status") != "finished" else
               "no epoch (a sweep or a demonstration, not a training run)" if not r["epochs"] else None)
        if why:
            left_out.append((path.stem, why))
            continue
        r["facts"] = facts(r)
        r["name"] = path.stem
        r["strategy"] = classify(r["facts"])
        runs.append(r)
    return runs, left_out


def what_is_missing(runs, left_out=(), command="lessons.bylesson.scaling_report"):
    """None when there are local training runs; else one sentence saying what is missing and how to
    make it, then to run the command (python -m command) again."""
    here = [r for r in runs if r["facts"]["measured_on"] == "here"]
    if here:
        return None
    refs = sorted({r["facts"]["measured_on"] for r in runs})
    have = (f"logs/ holds only reference runs ({', '.join(refs)}), no run of this machine" if refs else
            "logs/ holds no finished training run" + (f" ({len(left_out)} other log(s))" if left_out else ""))
    return (f"{have}: run `bash run_course.sh` (every lesson, quick mode) or the lesson notebooks, then "
            f"`python -m {command}` from scripts/ again.")


def about_schema(runs):
    """A sentence naming the runs whose log a newer schema version wrote (read by their core records), or None."""
    newer = sorted(r["name"] for r in runs if (r["facts"]["schema_version"] or 0) > SCHEMA_VERSION)
    if not newer:
        return None
    return (f"{len(newer)} log(s) come from a schema newer than this reader's version {SCHEMA_VERSION} "
            f"({', '.join(newer[:5])}{', ...' if len(newer) > 5 else ''}): read by their config, env, epoch and "
            f"summary records; their lesson records are not shown.")


# ----------------------------------------------------------------------------------------- the big table

def single_device_match(run, runs, scaling="strong", quiet=True):
    """The one-device run to measure speedup against: same machine, device kind, work per step and set-up
    (threads per process on a CPU), and not run on a busy machine (busy; quiet=False: busy or not); the
    same script if there is one, else any one-device run; the one made nearest in time.
    Strong scaling: the same global batch (the devices share the work); weak scaling: one device's batch is
    the run's per-device batch (each device does what one did). A one-device run is its own: speedup 1."""
    f = run["facts"]
    if f["devices"] == 1:
        return run if scaling == "strong" else None
    setup = SAME_SETUP + (("threads",) if f["device"] == "cpu" else ())
    work = SAME_WORK if scaling == "strong" else tuple(k for k in SAME_WORK if k != "batch_size")
    per_device = (f.get("batch_size") or 0) // f["devices"]
    pool = [r for r in runs if r["facts"]["devices"] == 1 and not (quiet and busy(r))
            and same(r["facts"], f, ("measured_on", "device")) and same_work(r["facts"], f, work)
            and same(r["facts"], f, setup) and same_script(r, run)
            and (scaling == "strong" or r["facts"].get("batch_size") == per_device)]
    return nearest([r for r in pool if r["facts"]["script"] == f["script"]], f) or nearest(pool, f)


def same_work(a, b, keys=SAME_WORK):
    """The same value of every work flag in both runs' facts (a flag a script lacks: its default)."""
    def value(f, k):
        v = f.get(k)
        return WORK_DEFAULTS.get(k) if v is None else v
    return all(value(a, k) == value(b, k) for k in keys)


def same_script(base, run):
    """The one-device run is the run's own script, or the one-process run the registry says the run's
    strategy must equal (DDP's: the one-device script); never another strategy's one-process run."""
    if base["facts"]["script"] == run["facts"]["script"]:
        return True
    declared = run["strategy"].baseline if run.get("strategy") else None
    return bool(declared) and all(fits(v, base["facts"].get(k)) for k, v in declared.items())


# Why a row has no speedup. The first two are the machine's doing, not the course's: a loaded machine or
# a one-device run slower than its own work (a turn lost to another program) measures no one device.
BUSY = "its one-device run was made on a busy machine (load average above its cores)"
IMPLAUSIBLE = f"the efficiency came out above {COMPARABLE_EFFICIENCY:.0%}: not one device's work"
DISTURBED = (BUSY, IMPLAUSIBLE)
UNMATCHED = "no one-device run did the same work on this machine"


def comparison(run, runs):
    """(baseline, scaling, speedup, why): strong scaling where a one-device run did the same global
    batch, else weak scaling where one did the per-device batch; why says what left a row without."""
    f, why = run["facts"], UNMATCHED
    for scaling in ("strong", "weak"):
        base = single_device_match(run, runs, scaling)
        if base is None:
            if single_device_match(run, runs, scaling, quiet=False) is not None and why == UNMATCHED:
                why = BUSY
            continue
        speedup = rate(run) / rate(base)
        if speedup / f["devices"] <= COMPARABLE_EFFICIENCY:
            return base, scaling, speedup, None
        why = IMPLAUSIBLE
    return None, None, float("nan"), why


def rate(run):
    """The course's one throughput: steady state, samples/s over the epochs after the first
    (report.steady_rate); the summary's number for a log without epoch times."""
    return steady_rate(run["epochs"]) or run["summary"]["samples_per_s"]


def busy(run):
    """The run's log recorded a load average above the machine's cores at its start or end (the course's
    one threshold, lessons/claims.py): something else took turns with it, so it measures no one device."""
    env, summary = run.get("env") or {}, run.get("summary") or {}
    cores = env.get("cores") or env.get("cpu_count")
    loads = [v for v in (env.get("load_start"), summary.get("load_end")) if v is not None]
    return bool(cores and loads and max(loads) > cores)


def nearest(candidates, f):
    """The candidate made closest in time to the run (the same course and a machine in the same state, as
    a lesson makes its runs one after another), the latest of equals; None when there is none."""
    return min(candidates, key=lambda r: (abs((r["facts"]["time"] or 0) - (f["time"] or 0)),
                                          -(r["facts"]["time"] or 0), r["name"]), default=None)


def performance(runs):
    """One row per training run: strategy, hardware, devices, batch, throughput, epoch time, speedup and
    efficiency against the matching single-device run (strong scaling where one did the same global batch,
    else weak scaling where one did the per-device batch: column scaling), resident memory per process
    (peak_mem_mb; on a GPU the memory torch allocated), final loss and accuracy."""
    import pandas as pd
    rows = []
    for r in runs:
        f, s = r["facts"], r["summary"]
        base, scaling, speedup, why = comparison(r, runs)
        achieved = [e["flops_per_s"] for e in r["epochs"] if e.get("flops_per_s")]  # trainup/flops.py
        mfu = [e["mfu"] for e in r["epochs"] if e.get("mfu") is not None]
        rows.append(dict(
            run=r["name"], strategy=r["strategy"].name if r["strategy"] else f"other ({f['script']})",
            family=r["strategy"].family if r["strategy"] else f["script"], measured_on=f["measured_on"],
            hardware=f["hardware"], world_size=f["devices"], global_batch=f.get("batch_size"),
            per_device_batch=(f.get("batch_size") or 0) // max(f["devices"], 1), samples_per_s=rate(r),
            epoch_s=sum(e["wall_s"] for e in r["epochs"]) / len(r["epochs"]), speedup=speedup,
            gflops_per_s=sum(achieved) / len(achieved) / 1e9 if achieved else None,
            mfu=sum(mfu) / len(mfu) if mfu else None,
            efficiency=speedup / f["devices"], baseline=base["name"] if base else None,
            scaling=scaling, no_speedup=why,
            peak_mem_mb=s["peak_mem_mb"], loss=s["loss"], test_accuracy=s["test_accuracy"], epochs=len(r["epochs"]),
            model=f.get("model"), dataset=f.get("dataset"), work=work_of(f)))
    return pd.DataFrame(rows)


def work_of(f):
    """The work of a step in words, per device count: what runs must share to be ranked by speed
    (the model, data set and size, global batch, precision, instruments and threads)."""
    size = f"{f['train_size']} samples" if f.get("train_size") else "all samples"
    setup = [f"{k} {f[k]}" for k in ("monitor", "profile") if f.get(k)]
    return ", ".join([f"{f.get('model')} on {f.get('dataset')} ({size})", f"batch {f.get('batch_size')}",
                      f"float{f.get('precision')}", f"{f.get('threads')} thread(s)", *setup])


# ------------------------------------------------------------------------------------------------- plots

def scaling_plot(table, name="scaling_report_scaling", models=3):
    """Per model (a row each; those with the most jobs on several devices first), the runs of one
    work (work_of: the work with the most such jobs): throughput and efficiency against devices, one
    line per strategy family, machine and scaling (solid: strong, the global batch fixed; dotted:
    weak, the per-device batch fixed), at the median of its runs, the bar their spread (lowest to
    highest); dashed: the ideal, n x one device."""
    import matplotlib.pyplot as plt
    t = table.dropna(subset=["speedup"])
    shown = t[t["world_size"] > 1]["model"].value_counts().index[:models].tolist() or \
        t["model"].value_counts().index[:1].tolist()
    fig, axes = plt.subplots(max(len(shown), 1), 2, figsize=(11, 0.6 + 3.4 * max(len(shown), 1)), squeeze=False)
    for model, (a, b) in zip(shown, axes):
        for ax in (a, b):  # 20 colours: one a line, where the default cycle repeats after 10
            ax.set_prop_cycle(color=plt.cm.tab20.colors)
        m = t[t["model"] == model]
        if "work" in m:  # one work a panel: the work with the most jobs on several devices
            several = m[m["world_size"] > 1]
            work = (several if len(several) else m)["work"].value_counts().index[0]
            m = m[m["work"] == work]
        for (family, where, scaling), g in m.groupby(["family", "measured_on", "scaling"], sort=False):
            q = g.groupby("world_size")[["samples_per_s", "efficiency"]].agg(["median", "min", "max"])
            x, style = q.index, "o-" if scaling == "strong" else "s:"
            label = (family if where == "here" else f"{family} ({where})") + ("" if scaling == "strong" else ", weak")
            colour = None
            for ax, col, scale in ((a, "samples_per_s", 1), (b, "efficiency", 100)):
                med, lo, hi = (scale * q[(col, k)] for k in ("median", "min", "max"))
                drawn = ax.errorbar(x, med, yerr=[med - lo, hi - med], fmt=style, capsize=3, label=label,
                                    color=colour)
                colour = drawn.lines[0].get_color()  # the same colour in both panels
            one = (g["samples_per_s"] / g["speedup"]).median()
            a.plot(x, one * x, "--", color="0.6", lw=0.8)
        b.axhline(100, color="k", ls="--", alpha=0.5, label="ideal")
        a.set(title=f"{model}: throughput (dashed: ideal)", xlabel="devices (processes)", ylabel="samples/s")
        b.set(title=f"{model}: efficiency, speedup / devices", xlabel="devices (processes)", ylabel="%")
        if "work" in m and len(m):
            a.text(0, -0.28, f"runs of one work: {m['work'].iloc[0]}", transform=a.transAxes,
                   fontsize="x-small")
        for ax in (a, b):
            ax.grid(alpha=0.3)
            ax.legend(fontsize="x-small")
            ax.set_xticks(sorted(m["world_size"].unique()))
    fig.tight_layout()
    save(fig, name)
    return fig


def about_scaling(table):
    """Which scaling each comparable job on several devices was measured as, counted from the table."""
    t = table[(table["world_size"] > 1) & table["scaling"].notna()]
    kinds = t["scaling"].value_counts()
    strong, weak = int(kinds.get("strong", 0)), int(kinds.get("weak", 0))
    out = (f"{strong} job(s) on several devices measured as strong scaling (the global batch of a one-device run, "
           f"shared) and {weak} as weak scaling (each device the batch one device did).")
    if not weak:
        out += " No weak-scaling pair is in logs/: a one-device run with the per-device batch would make one."
    return out


def comparable(table, name, scaling):
    """True where run name was measured as this scaling against a one-device run; False where the machine
    left it without one (DISTURBED). Fails where no one-device run did its work: the course's doing."""
    r = table.set_index("run").loc[name]
    if r["scaling"] == scaling:
        return True
    if r["no_speedup"] in DISTURBED:
        return False
    why = r["no_speedup"] if isinstance(r["no_speedup"], str) else f"it is {r['scaling']} scaling"
    raise AssertionError(f"{name} is not measured as {scaling} scaling: {why}")


def about_weak(table, name=None):
    """The weak-scaling run made here in one sentence: its efficiency against the one-device run that did
    its per-device batch, or what the machine did that left it without one (comparable)."""
    name = name or WEAK[0][0]
    r = table.set_index("run").loc[name]
    if comparable(table, name, "weak"):
        return (f"{name} ({r.world_size} ranks, {r.per_device_batch} samples each) against {r.baseline} "
                f"(one device, {r.per_device_batch} samples): weak scaling, efficiency {r.efficiency:.0%}.")
    return f"{name} has no efficiency this time: {r.no_speedup}. Run this notebook again on a quiet machine."


# Time to accuracy needs a target far above chance (10 classes: 10 %), else it ranks first epochs.
TARGET = 0.8


def time_to_accuracy(runs, target=TARGET):
    """Time to a test accuracy within ONE model and data set (same data size, same machine): the group
    of runs with the most of them reaching the target; per run, the training time (sum of epoch times)
    until its test accuracy first reached it. Runs that never reached it are left out; when none did,
    the table is empty and about_time says so. Returns (table, target, the group in words)."""
    import pandas as pd
    columns = ["run", "strategy", "measured_on", "world_size", "global_batch", "target", "seconds",
               "epochs_needed"]
    groups = {}
    for r in runs:
        f = r["facts"]
        key = (f["measured_on"], f.get("dataset"), f.get("train_size"), f.get("model"))
        groups.setdefault(key, []).append(r)
    if not groups:
        return pd.DataFrame(columns=columns), target, None
    reached = lambda r: max(e["test_accuracy"] for e in r["epochs"]) >= target  # noqa: E731
    key = max(groups, key=lambda k: (sum(map(reached, groups[k])), len(groups[k])))
    where, dataset, size, model = key
    group = (f"model {model} on {dataset} ({f'{size} samples' if size else 'all samples'}), "
             f"measured on {where}")
    rows = []
    for r in groups[key]:
        if not reached(r):
            continue
        spent = 0.0
        for e in r["epochs"]:
            spent += e["wall_s"]
            if e["test_accuracy"] >= target:
                break
        rows.append(dict(run=r["name"], strategy=r["strategy"].name if r["strategy"] else r["facts"]["script"],
                         measured_on=where, world_size=r["facts"]["devices"],
                         global_batch=r["facts"].get("batch_size"), target=target, seconds=spent,
                         epochs_needed=e["epoch"]))
    t = pd.DataFrame(rows, columns=columns).sort_values("seconds").reset_index(drop=True)
    return t, target, group


def about_time(t, target, group):
    """One sentence over time_to_accuracy's table: which run was first to the target, or that none
    reached it (one run each: the order is that of single runs, said so)."""
    if group is None:
        return "No training run to time."
    if not len(t):
        return (f"No run of {group} reached {target:.0%} test accuracy: no time to accuracy is "
                f"measured (quick runs stop early; the full course's runs reach it).")
    if len(t) == 1:
        return f"Of {group}, only {t.run[0]} reached {target:.0%}, in {t.seconds[0]:.1f} s."
    return (f"Of {group}: {len(t)} runs reached {target:.0%} test accuracy, {t.run[0]} "
            f"({t.strategy[0]}) first in {t.seconds[0]:.1f} s, {t.run.iloc[-1]} last in "
            f"{t.seconds.iloc[-1]:.1f} s; times of single runs, counted in whole epochs: an order, not "
            f"a ranking decided beyond noise.")


TIME_BARS = 20  # the fastest strategies the time plot shows: a bar each


def time_plot(t, target, name="scaling_report_time"):
    """The fastest run of each strategy to the target, at most TIME_BARS of them (the table has
    every run)."""
    import matplotlib.pyplot as plt
    best = t.sort_values("seconds").drop_duplicates("strategy").head(TIME_BARS)
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.3 * max(len(best), 1)))
    ax.barh(best["strategy"], best["seconds"], color="tab:blue")
    ax.invert_yaxis()
    ax.set(title=f"Time to {target:.0%} test accuracy: each strategy's fastest run",
           xlabel="seconds (sum of epoch times)")
    ax.tick_params(axis="y", labelsize="small")
    ax.grid(alpha=0.3, axis="x")
    save(fig, name)
    return fig


def model_sizes(runs, checkpoint_dir=CHECKPOINT_DIR):
    """Parameters of each run's model, counted in its checkpoint (None when it is not on this machine)."""
    import torch
    sizes = {}
    for r in runs:
        p = checkpoint_of(r, checkpoint_dir)
        if p:
            state = torch.load(p, map_location="cpu", weights_only=True)["model"]
            sizes[r["name"]] = sum(v.numel() for k, v in state.items() if v.is_floating_point())
    return sizes


def memory_records(runs):
    """What each device held, from the lessons' own memory records, not the process's resident memory:
    'shard_memory' (parameters, gradients, optimizer state per rank; lesson 09), 'tp' (parameters per rank;
    lesson 09) and 'pipe_step' (activations kept for backward, per stage; lesson 06c). One row per run and
    part: MB on the rank that held the most."""
    import pandas as pd
    rows = []
    for r in runs:
        f = r["facts"]
        head = dict(run=r["name"], strategy=r["strategy"].name if r["strategy"] else f["script"], model=f["model"],
                    world_size=f["devices"], measured_on=f["measured_on"])
        parts = {}
        for rec in r["extra"]:
            kind = rec.get("type") if isinstance(rec, dict) else None
            if kind == "shard_memory":
                for part, key in (("parameters", "param_bytes"), ("gradients", "grad_bytes"),
                                  ("optimizer state", "optim_bytes")):
                    parts[part] = max(rec[key])
            elif kind == "tp":
                parts["parameters"] = max(rec["param_bytes"])
            elif kind == "pipe_step" and rec.get("peak_activation_bytes"):
                parts["activations"] = max(parts.get("activations", 0), *rec["peak_activation_bytes"])
        rows += [dict(head, part=part, mb=b / 2**20, source=SOURCE[part]) for part, b in parts.items()]
    return pd.DataFrame(rows, columns=["run", "strategy", "model", "world_size", "measured_on", "part", "mb",
                                       "source"])


SOURCE = {"parameters": "tensors each rank holds", "gradients": "tensors each rank holds",
          "optimizer state": "tensors each rank holds", "activations": "saved for backward (a hook)"}
PARTS = ["parameters", "gradients", "optimizer state", "activations"]


def memory_plot(mem, name="scaling_report_memory", models=3):
    """Per model: MB per device of each strategy and device count, parameters, gradients, optimizer state
    and activations stacked, as the lessons counted them."""
    import matplotlib.pyplot as plt
    shown = mem["model"].value_counts().index[:models].tolist()
    fig, axes = plt.subplots(1, max(len(shown), 1), figsize=(5.5 * max(len(shown), 1), 4), squeeze=False)
    for model, ax in zip(shown, axes[0]):
        g = mem[mem["model"] == model].pivot_table(index=["strategy", "world_size"], columns="part", values="mb",
                                                   aggfunc="median")
        g = g[[p for p in PARTS if p in g.columns]].fillna(0)
        labels = [f"{s}, {n}" for s, n in g.index]
        left = [0.0] * len(g)
        for part in g.columns:
            ax.barh(labels, g[part], left=left, label=part)
            left = [x + y for x, y in zip(left, g[part])]
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize="x-small")
        ax.set(title=f"{model}: memory per device", xlabel="MB on the rank holding the most")
        ax.grid(alpha=0.3, axis="x")
        ax.legend(fontsize="x-small")
    fig.tight_layout()
    save(fig, name)
    return fig


def resident_plot(table, sizes, name="scaling_report_resident"):
    """The process's resident memory (on a GPU: what torch allocated) against model size: on a CPU most of
    it is the torch library, the same for every strategy; shown as such."""
    import matplotlib.pyplot as plt
    t = table.assign(parameters=table["run"].map(sizes)).dropna(subset=["parameters", "peak_mem_mb"])
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.set_prop_cycle(color=plt.cm.tab20.colors)  # one colour a family, for up to 20
    for family, g in t.groupby("family", sort=False):
        ax.scatter(g["parameters"] / 1e6, g["peak_mem_mb"], label=family, alpha=0.7)
    ax.set(title="Resident memory per process (mostly the torch library on a CPU)",
           xlabel="parameters (millions)", ylabel="peak resident memory (MB)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small")
    save(fig, name)
    return fig


# ------------------------------------------------------------------------------------------ the sentence

def recommend(table, equal=None, cores=None, mem=None):
    """A few sentences, each worked out from the table: per machine and model, among runs of the same
    work only, what gave the most samples/s and what had the highest efficiency (said only where the
    runs decide it, lessons/claims.py), what needed the least memory per device (each flagged when it
    is not proven to train the one-process model); which runs crowded the cores; which strategies are
    proven equal."""
    import os
    if not len(table):
        return ["No training run to recommend from."]
    ok = set(equal.loc[equal["result"] == "holds", "strategy"]) if equal is not None and len(equal) else set()

    def named(r):
        flag = "" if r.world_size == 1 or r.strategy in ok else " (not proven to train the same model)"
        return f"{r.strategy}{flag}"

    out = []
    n = cores or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    for (where, hardware), machine in table.groupby(["measured_on", "hardware"], sort=False):
        for model, g in machine.groupby("model", sort=False):
            head = f"On {hardware} ({'this machine' if where == 'here' else where}), model {model}:"
            parts = fastest(g, named) + best_scaling(g, named)
            uncompared = g[(g["world_size"] > 1) & g["efficiency"].isna()]
            disturbed = uncompared["no_speedup"].isin(DISTURBED) if "no_speedup" in g else uncompared["efficiency"] < 0
            if (~disturbed).any():
                parts.append(f"{int((~disturbed).sum())} job(s) on several devices had no one-device run doing the "
                             f"same work (script or its strategy's declared one, model, data size, "
                             f"batch, precision, strategy flags, threads, instruments), so no speedup "
                             f"is claimed")
            if disturbed.any():
                parts.append(f"{int(disturbed.sum())} job(s) on several devices were compared with a busy machine "
                             f"or a disturbed one-device run, so no speedup is claimed for them")
            several = g[g["world_size"] > 1]
            if len(several) and not hardware.startswith("CPU"):  # memory torch allocated on the device
                low = several.loc[several["peak_mem_mb"].idxmin()]
                one = g.loc[g["world_size"] == 1, "peak_mem_mb"]
                parts.append(f"when memory per device is the limit, {named(low)} needed the least "
                             f"({low.peak_mem_mb:,.0f} MB" + (f" against {one.min():,.0f} MB on one device)" if len(one)
                                                              else ")"))
            elif len(several):
                parts.append("resident memory is not compared on a CPU: it is mostly the torch library")
            counted = _counted(mem, where, model)
            if len(counted[counted["world_size"] > 1]):
                low = counted[counted["world_size"] > 1].sort_values("mb").iloc[0]
                one = counted.loc[counted["world_size"] == 1, "mb"]
                parts.append(f"of the runs whose parameters, gradients and optimizer state the lessons counted, "
                             f"{named(low)} on {low.world_size} held the least per device ({low.mb:.3g} MB"
                             + (f" against {one.min():.3g} MB on one device)" if len(one) else ")"))
            if parts:
                out.append(head + " " + "; ".join(parts) + ".")
        crowded = machine[(machine["world_size"] > n)] if where == "here" and hardware.startswith("CPU") else machine.iloc[:0]
        if len(crowded):
            out.append(f"Runs with more processes than this machine's {n} core(s) ({', '.join(crowded.run)}) took turns "
                       f"on the cores: their speed says little about the strategy.")
    if equal is not None and len(equal):
        bad = equal.loc[equal["result"] == "FAILS", "strategy"].tolist()
        if ok:
            out.append(f"Proven to train the one-process model here: {', '.join(sorted(ok))}.")
        if bad:
            out.append(f"Not to be trusted until fixed (different parameters): {', '.join(bad)}.")
    return out


def _ranked(g, column, named):
    """Per strategy and device count in g: the values of column over its runs, best first (by
    median), with its name; and the phrase claims.compare gives for the best against the next."""
    from .. import claims
    groups = [(named(rows.iloc[0]), n, list(rows[column]))
              for (_, n), rows in g.dropna(subset=[column]).groupby(["strategy", "world_size"])]
    groups.sort(key=lambda x: -sorted(x[2])[len(x[2]) // 2])
    if len(groups) < 2:
        return groups, None
    (_, _, top), (name, n, second) = groups[0], groups[1]
    return groups, claims.compare(top, second, f"{name} on {n}")


def fastest(g, named):
    """Which strategy gave the most samples/s, only among runs of the same work (work_of) and with
    repeats enough to decide it (lessons/claims.py); none where no two strategies did the same work."""
    from .. import claims
    out = []
    for work, runs in g.groupby("work", sort=False):
        groups, phrase = _ranked(runs, "samples_per_s", named)
        if phrase is None:
            continue
        name, n, values = groups[0]
        if claims.decided(phrase):
            out.append(f"of the runs of the same work ({work}), {name} on {n} device(s) gave the most "
                       f"samples/s: {phrase}")
        else:
            out.append(f"of the runs of the same work ({work}), which strategy gives the most samples/s "
                       f"{claims.CANNOT_TELL} ({name} on {n}: {phrase})")
    return out


def best_scaling(g, named):
    """The highest efficiency among the jobs on several devices of the same work and the same kind
    of scaling, as numbers; a direction (faster or slower than one device, which scales best) only
    where repeated runs decide it (lessons/claims.py)."""
    from .. import claims
    out = []
    multi = g[(g["world_size"] > 1) & g["efficiency"].notna()]
    for (work, scaling), runs in multi.groupby(["work", "scaling"], sort=False):
        groups, phrase = _ranked(runs, "efficiency", named)
        name, n, values = groups[0]
        efficiency = sorted(values)[len(values) // 2]
        numbers = f"{efficiency:.0%} efficiency ({scaling} scaling, {efficiency * n:.2f}x one device)"
        what = (f"{name} on {n} had the highest, {numbers}" if len(groups) > 1 else
                f"{name} on {n}: {numbers}")
        if len(values) < claims.REPEATS:
            what += ("; from single runs, whether it is faster than one device "
                     f"{claims.CANNOT_TELL}")
        elif phrase is not None and not claims.decided(phrase):
            what += f"; which of them scales best {claims.CANNOT_TELL}"
        out.append(f"of the jobs of the same work ({work}) on several devices, {what}")
    return out


def _counted(mem, where, model):
    """Per run of this machine and model: the MB per device of parameters, gradients and optimizer state
    together, for the runs whose lesson counted all three (memory_records)."""
    import pandas as pd
    if mem is None or not len(mem):
        return pd.DataFrame(columns=["run", "strategy", "world_size", "mb"])
    m = mem[(mem["measured_on"] == where) & (mem["model"] == model) & (mem["part"] != "activations")]
    whole = m.groupby("run")["part"].nunique() == 3
    m = m[m["run"].isin(whole[whole].index)]
    return m.groupby(["run", "strategy", "world_size"], as_index=False)["mb"].sum()


# ----------------------------------------------------------------------------------- this lesson's pair

# The cheapest proof made here: one process with the whole batch, and 2 DDP ranks with half each
# (dropout off: each rank would draw its own masks), in float64 (checks.PROOF) like every proof.
# NOISE_PAIR: one DDP process, then the same with its batch cut in two micro-batches
# (--accumulate 2): only the order of its sums changes (equivalence.noise_pairs), so their
# difference is the noise floor. Notebook 10 makes all five (WEAK below) when logs/ lacks them.
# Each: (name, script, processes, flags).
PAIR_FLAGS = ["--device", "cpu", "--batch-size", 64, "--dropout", 0, "--threads", 1, *checks.PROOF]
PAIR = (("report_one", "_trainup_gpu.py", 1, ()), ("report_ddp_n2", "_trainup_ddp.py", 2, ()))
NOISE_PAIR = (("report_ddp_n1", "_trainup_ddp_tuned.py", 1, ()),
              ("report_ddp_n1_acc2", "_trainup_ddp_tuned.py", 1, ("--accumulate", 2)))
# WEAK: 2 DDP ranks with 64 samples each, the batch report_one did alone: weak scaling beside the pair's strong.
WEAK = (("report_ddp_n2_b128", "_trainup_ddp.py", 2, ("--batch-size", 128)),)


def _made(name, flags, log_dir, checkpoint_dir, script=None):
    """Finished, in the schema, with its checkpoint, and made as asked: by that script, float64, its
    accumulation (a float32 run of an older course's, or one by another script, is made again)."""
    path = Path(log_dir) / f"{name}.jsonl"
    if not path.exists():
        return False
    r = read_log(path)
    args = (r["config"] or {}).get("args") or {}
    accumulate = dict(zip(flags[::2], flags[1::2])).get("--accumulate")
    if script and (r["config"] or {}).get("script") != script:
        return False
    return not r["problems"] and (r["summary"] or {}).get("status") == "finished" and \
        str(args.get("precision")) in FLOAT64 and args.get("accumulate") == accumulate and \
        (Path(checkpoint_dir) / f"{name}.pt").exists()


def ensure_pair(log_dir=LOG_DIR, checkpoint_dir=CHECKPOINT_DIR):
    """Run this lesson's pair and noise pair where logs/ lacks them (quietly: the sentence is the
    same either way)."""
    import contextlib
    import io
    from .. import launch, report
    for name, script, nproc, flags in (*PAIR, *NOISE_PAIR, *WEAK):
        if not _made(name, flags, log_dir, checkpoint_dir, script):
            with contextlib.redirect_stdout(io.StringIO()):
                if nproc == 1:
                    report.run(script, *PAIR_FLAGS, *flags, name=name)
                else:
                    launch.run(script, *PAIR_FLAGS, *flags, name=name, nproc=nproc)
        if not _made(name, flags, log_dir, checkpoint_dir, script):
            raise AssertionError(f"{name}: no finished float64 log (in the schema) and checkpoint")
    return (f"{PAIR[0][0]} (one process, batch 64) and {PAIR[1][0]} (2 DDP ranks, 32 samples "
            f"each); the noise pair {NOISE_PAIR[0][0]} and {NOISE_PAIR[1][0]} (one DDP process, "
            f"batch 64 whole and as 2 micro-batches of 32); {WEAK[0][0]} (2 DDP ranks, 64 samples each: "
            f"weak scaling): float64, finished, logs in the schema, checkpoints here.")


# ---------------------------------------------------------------------------------------------- command

COLUMNS = ["strategy", "measured_on", "hardware", "world_size", "global_batch", "per_device_batch", "samples_per_s",
           "epoch_s", "speedup", "efficiency", "scaling", "peak_mem_mb", "loss", "test_accuracy"]
# The model's FLOPs a second (trainup/flops.py) and that over the GPUs' datasheet peak (MFU): empty where
# they were not counted (the block-stack scripts, logs from before) or the peak is not known (CPUs).
ACHIEVED = ["gflops_per_s", "mfu"]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m lessons.bylesson.scaling_report", description=__doc__.split("\n\n")[0])
    p.add_argument("--log-dir", default=str(LOG_DIR))
    p.add_argument("--checkpoint-dir", default=str(CHECKPOINT_DIR))
    p.add_argument("--no-figures", action="store_true", help="tables and sentences only")
    a = p.parse_args(argv)
    import pandas as pd
    pd.set_option("display.width", 200)
    runs, left_out = load(a.log_dir)
    missing = what_is_missing(runs, left_out)
    for sentence in (missing, about_schema(runs)):
        if sentence:
            print(sentence)
    table = performance(runs)
    if len(table):
        print(table[["run"] + COLUMNS + ACHIEVED].round(3).to_string(index=False))
    if len(table) and not a.no_figures:
        scaling_plot(table)
        t, target, group = time_to_accuracy(runs)
        print(about_time(t, target, group))
        if len(t):
            time_plot(t, target)
        mem = memory_records(runs)
        if len(mem):
            memory_plot(mem)
        resident_plot(table, model_sizes(runs, a.checkpoint_dir))
        print(f"figures: {IMAGE_DIR.name}/scaling_report_*.png")
    print("Whether each strategy trains the same model as one process, and the recommendation: "
          "`python -m lessons.bylesson.equivalence` (lesson 10a).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
