"""Lesson 10a: does each strategy train the same model as one process? The equivalence table over
the runs lesson 10's report reads, and the recommendation worked out from both.

    cd scripts && python -m lessons.bylesson.equivalence  # the table, its sentence, the advice

    from lessons.bylesson import equivalence as eq
    equal = eq.equivalence(runs)         # one row per strategy of sr.STRATEGIES with a baseline
    floor, why = eq.noise_floor(runs)    # float64 summation noise measured here, from a noise pair
    eq.about_equivalence(equal)          # one sentence counted from the table

The runs, the registry (which runs are a strategy's, which one-process run it must equal) and the
performance table are lesson 10's (lessons/bylesson/scaling_report.py).

A row compares float64 runs only (--precision 64), against one tolerance for all (TOLERANCE). Its
noise floor is the largest difference between two one-process runs made here that differ only in
their CPU threads or their micro-batches (noise_pairs): what summation order alone moves here.
"""
import argparse
import importlib.util
import math
import sys
from pathlib import Path

from trainup import CHECKPOINT_DIR, LOG_DIR, ROOT

from .. import checks
from . import scaling_report as sr
# lesson 10's helpers, the proof's too: float64's spellings, a registry condition, a checkpoint
from .scaling_report import FLOAT64, checkpoint_of, fits, same

# The flags that make two runs train the same thing (data, model, seed, global batch, steps, rule).
SAME_TRAINING = ("dataset", "model", "batch_size", "epochs", "lr", "gamma", "dropout", "seed",
                 "train_size", "test_size", "image_shape", "num_classes", "optimizer",
                 "warmup_steps", "precision", "blocks", "width", "hidden", "no_set_epoch",
                 "fp16_allreduce", "capacity_factor", "aux_loss_weight")
# One tolerance for every strategy, float64's. The proof runs are float64 (--precision 64): sums
# in another order (ranks, threads, micro-batches, SIMD widths, kernels) move the course's
# parameters by about 1e-16 on any processor, a real defect (a sum for a mean, a wrong shard or
# seed) by 1e-4 and more. Tolerances fitted to float32 (1e-4, 1e-5) held on one processor and
# failed on another, where float32 DDP ended 5.65e-4 from one process: float32 noise is as large
# as a defect.
TOLERANCE = checks.FLOAT64_ATOL
NAMES = {"64": "float64", "32": "float32", "16": "mixed float16", "bf16": "mixed bfloat16"}
# A noise pair: two runs that share their training and script, one process each on the same device
# (NOISE_SAME), and differ in one of NOISE_KNOBS alone. Either changes only the order of the sums:
# threads split a convolution's or a matrix product's sums, --accumulate 2 cuts the batch in two
# micro-batches whose gradients add up (1 in the log's args when the script has no --accumulate).
NOISE_SAME = SAME_TRAINING + ("script", "device", "devices", "world_size", "measured_on")
NOISE_KNOBS = ("threads", "accumulate")


# --------------------------------------------------------------------------------- helpers

def precision(run):
    """'64' for a float64 run (any spelling of the flag), else the flag as logged."""
    p = str(run["facts"].get("precision"))
    return "64" if p in FLOAT64 else p


def latest(candidates):
    if not candidates:
        return None
    return max(candidates, key=lambda r: (r["facts"]["time"] or 0, r["name"]))


def fits_all(where, f):
    return all(fits(v, f.get(k)) for k, v in where.items())


def missing_need(strategy, scripts_dir=ROOT / "scripts"):
    """One sentence naming what this machine or course lacks for the strategy, or None."""
    import torch
    for kind, what in strategy.needs:
        if kind == "script" and not (Path(scripts_dir) / what).exists():
            return f"scripts/{what} is not in the course yet"
        if kind == "module" and importlib.util.find_spec(what) is None:
            return f"{what} is not installed in this Python"
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if kind == "gpus" and gpus < what:
            return f"it needs {what} GPU(s); torch sees {gpus} here"
    return None


def parameter_difference(a, b):
    """The largest difference between two checkpoints' tensors (in float64); ValueError if the
    models differ."""
    import torch
    sa, sb = (torch.load(p, map_location="cpu", weights_only=True)["model"] for p in (a, b))
    if sa.keys() != sb.keys() or any(sa[k].shape != sb[k].shape for k in sa):
        raise ValueError("the checkpoints hold different models")
    return max((float((sa[k].double() - sb[k].double()).abs().max()) for k in sa if sa[k].numel()),
               default=0.0)


def compare(pairs, checkpoint_dir):
    """The largest difference over (run, other) pairs (inf for another model), the pairs named."""
    worst, names = 0.0, []
    for r, b in pairs:
        try:
            d = parameter_difference(*(checkpoint_of(x, checkpoint_dir) for x in (r, b)))
        except ValueError:
            d = float("inf")
        worst = max(worst, d)
        names.append(f"{r['name']}~{b['name']} ({d:.1e})")
    return worst, ", ".join(names)


# ----------------------------------------------------------------------------- noise floor

def _knobs(run):
    return {"threads": run["facts"]["threads"], "accumulate": run["facts"].get("accumulate") or 1}


def noise_pairs(runs, p="64", checkpoint_dir=CHECKPOINT_DIR):
    """Pairs of one-process runs made here at precision p that differ only in the order of their
    sums: NOISE_SAME equal, exactly one of NOISE_KNOBS different, both checkpoints here. Notebook
    10 makes one: report_ddp_n1 and report_ddp_n1_acc2, the same run with its batch cut in two."""
    one = [r for r in runs if r["facts"]["devices"] == 1 and (r["facts"]["world_size"] or 1) == 1
           and precision(r) == p and checkpoint_of(r, checkpoint_dir)]
    return [(a, b) for i, a in enumerate(one) for b in one[i + 1:]
            if same(a["facts"], b["facts"], NOISE_SAME)
            and sum(_knobs(a)[k] != _knobs(b)[k] for k in NOISE_KNOBS) == 1]


def noise_floor(runs, p="64", checkpoint_dir=CHECKPOINT_DIR):
    """This machine's summation noise at precision p: the largest difference over its noise pairs,
    and a sentence naming them; NaN and the reason when logs/ holds no noise pair."""
    pairs = noise_pairs(runs, p, checkpoint_dir)
    if not pairs:
        return float("nan"), (f"no noise floor: no two one-process {NAMES.get(p, p)} runs here "
                              f"differ only in their CPU threads or micro-batches (notebook 10 "
                              f"makes such a pair)")
    worst, names = compare(pairs, checkpoint_dir)
    return worst, (f"{NAMES.get(p, p)} noise floor, from runs that differ only in CPU threads or "
                   f"micro-batches: {names}")


def _floor(floors, runs, p, checkpoint_dir):
    """noise_floor at precision p, measured once per table (floors: a dict its rows share)."""
    if p not in floors:
        floors[p] = noise_floor(runs, p, checkpoint_dir)
    return floors[p]


# ----------------------------------------------------------------------------------- a row

def _why_not_comparable(f, dropout_off):
    """Why a run cannot be held to the one-process parameters (None when it can): see
    Strategy.dropout_off."""
    if f.get("dropout") and (dropout_off == "always" or (dropout_off and f["devices"] > 1)):
        return "dropout on (each rank draws its own masks), so the proof runs with --dropout 0"
    if f["devices"] > 1 and "bn" in str(f.get("model")) and not f.get("sync_bn"):
        return "BatchNorm without --sync-bn: each device normalises its own shard"
    if f["devices"] > 1 and f.get("experts") and \
            f.get("capacity_factor", 0) < f["experts"] / (f.get("top_k") or 1):
        return ("its capacity factor is below experts / top-k, and an expert's capacity counts "
                "each rank's own tokens, so which are dropped depends on the split")
    return None


def baseline_pairs(strategy, local, runs, checkpoint_dir):
    """Each run with its one-process baseline (same training, precision included; a checkpoint
    here): the latest, with as many CPU threads if there is one (threads round sums apart)."""
    pairs = []
    for r in local:
        bases = [b for b in runs if b is not r and fits_all(strategy.baseline, b["facts"])
                 and same(b["facts"], r["facts"], SAME_TRAINING + ("measured_on",))
                 and checkpoint_of(b, checkpoint_dir)]
        if bases:
            same_threads = [b for b in bases if b["facts"]["threads"] == r["facts"]["threads"]]
            pairs.append((r, latest(same_threads) or latest(bases)))
    return pairs


def not_float64(row, local, runs, strategy, checkpoint_dir, floors):
    """A strategy whose runs here are all float32 (or mixed): skipped. Their difference from their
    baseline is shown for what it is, summation noise, next to that precision's noise floor."""
    p = precision(local[-1])
    pairs = baseline_pairs(strategy, [r for r in local if precision(r) == p], runs, checkpoint_dir)
    worst, names = compare(pairs, checkpoint_dir) if pairs else (float("nan"), "")
    kinds = " and ".join(sorted({NAMES.get(precision(r), precision(r)) for r in local}))
    return {**row, "largest_difference": worst, "precision": p, "pairs": names,
            "noise_floor": _floor(floors, runs, p, checkpoint_dir)[0],
            "reason": f"its runs in logs/ ({len(local)}) are {kinds}, whose differences are "
                      f"summation noise on this processor: the proof runs with --precision 64"}


def equivalence_row(strategy, runs, checkpoint_dir=CHECKPOINT_DIR, scripts_dir=ROOT / "scripts",
                    floors=None):
    """The strategy's row: every float64 run of it that has a same-configuration baseline, both
    checkpoints here, compared; 'holds' when every difference is within TOLERANCE, 'FAILS' when one
    is not, else 'skipped' with the reason. runs: classified (each has its 'strategy')."""
    floors = {} if floors is None else floors
    floor, why = _floor(floors, runs, "64", checkpoint_dir)
    row = dict(strategy=strategy.name, largest_difference=float("nan"), noise_floor=floor,
               tolerance=TOLERANCE, result="skipped", reason="", precision="64", pairs="")
    need = missing_need(strategy, scripts_dir)
    mine = [r for r in runs if r["strategy"] is strategy]
    if need:
        return {**row, "reason": need}
    if not mine:
        return {**row, "reason": f"no run of it in logs/ yet: {strategy.made_by} makes one"}
    comparable = [r for r in mine if not _why_not_comparable(r["facts"], strategy.dropout_off)]
    if not comparable:
        why_not = _why_not_comparable(mine[-1]["facts"], strategy.dropout_off)
        return {**row, "reason": f"its runs in logs/ ({len(mine)}) cannot be compared: {why_not}"}
    local = [r for r in comparable if checkpoint_of(r, checkpoint_dir)]
    if not local:
        return {**row, "reason": "no checkpoint of its runs here (reference runs keep none)"}
    proof = [r for r in local if precision(r) == "64"]
    if not proof:
        return not_float64(row, local, runs, strategy, checkpoint_dir, floors)
    pairs = baseline_pairs(strategy, proof, runs, checkpoint_dir)
    if not pairs:
        return {**row, "reason": "no float64 one-process baseline with the same data, model, "
                                 "seed, global batch and steps (and a checkpoint) in logs/"}
    worst, names = compare(pairs, checkpoint_dir)
    reason = f"{len(pairs)} float64 run(s) against their one-process baseline"
    return {**row, "largest_difference": worst, "pairs": names,
            "result": "holds" if worst <= TOLERANCE else "FAILS",
            "reason": reason + (f"; {why}" if math.isnan(floor) else "")}


# ------------------------------------------------------------------------------- the table

EQUIVALENCE_COLUMNS = ["strategy", "largest_difference", "noise_floor", "tolerance", "result",
                       "reason"]


def equivalence(runs, checkpoint_dir=CHECKPOINT_DIR, strategies=None, scripts_dir=ROOT / "scripts"):
    """One row per strategy that claims to train the one-process model (it has a baseline): the
    largest float64 difference, the noise floor measured here, the tolerance, result and why.
    runs: sr.load's; strategies: sr.STRATEGIES unless another registry is given (a row added)."""
    import pandas as pd
    if strategies:  # another registry: each run is classified against it
        runs = [{**r, "strategy": sr.classify(r["facts"], strategies)} for r in runs]
    floors = {}
    return pd.DataFrame([equivalence_row(s, runs, checkpoint_dir, scripts_dir, floors)
                         for s in strategies or sr.STRATEGIES if s.baseline is not None])


def about_equivalence(table):
    """One sentence over the equivalence table, counted from it: the results, the tolerance and the
    float64 noise floor its rows show."""
    counts = table["result"].value_counts()
    failing = table.loc[table["result"] == "FAILS", "strategy"].tolist()
    skipped = counts.get("skipped", 0)
    floors = table.loc[table["precision"] == "64", "noise_floor"].dropna()
    floor = (f"where the noise floor measured here is {floors.max():.0e}" if len(floors) else
             "and no noise floor was measured here (no noise pair in logs/)")
    tolerance = table["tolerance"].max()
    sentence = (f"{counts.get('holds', 0)} of {len(table)} strategies were checked and trained "
                f"the one-process model within {tolerance:.0e} in float64, {floor}; "
                f"{skipped} {'was' if skipped == 1 else 'were'} skipped (reason in the table)")
    return sentence + (f"; {len(failing)} did NOT: {', '.join(failing)}." if failing else ".")


# ---------------------------------------------------------------------------------- command

def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m lessons.bylesson.equivalence",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--log-dir", default=str(LOG_DIR))
    p.add_argument("--checkpoint-dir", default=str(CHECKPOINT_DIR))
    a = p.parse_args(argv)
    import pandas as pd
    pd.set_option("display.width", 200)
    runs, left_out = sr.load(a.log_dir)
    for sentence in (sr.what_is_missing(runs, left_out, "lessons.bylesson.equivalence"),
                     sr.about_schema(runs)):
        if sentence:
            print(sentence)
    equal = equivalence(runs, a.checkpoint_dir)
    print(equal[EQUIVALENCE_COLUMNS].to_string(index=False))
    print(about_equivalence(equal))
    for _, row in equal[equal["result"] == "FAILS"].iterrows():
        print(f"{row['strategy']} FAILS: run~baseline (largest difference): {row['pairs']}")
    table = sr.performance(runs)
    print("\n".join(sr.recommend(table, equal, mem=sr.memory_records(runs))))
    if (equal["result"] == "FAILS").any():
        print("error: a strategy ended with parameters different from its one-process baseline",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
