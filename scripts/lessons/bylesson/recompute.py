"""Lesson 06c: recomputing activations in a pipeline (_trainup_pipeline.py --recompute), measured by
the stages' activation meter and counted by hand from the model's code.

    from lessons.bylesson import recompute
    recompute.table("pp_1f1b", "pp_recompute")  # per stage: kept bytes, each run against the count
"""
import math
from pathlib import Path

from trainup import LOG_DIR

from ..log_reader import read_run
from .schedules import layout, peak_activations


def saved_by_hand(name, stage, log_dir=LOG_DIR):
    """Bytes that one micro-batch leaves saved for backward on a stage of the block stack,
    counted from trainup/models.py: the stem's input (a whole image, flattened) on the first
    stage; per block its input, LayerNorm's output and ReLU's output (`width` numbers a sample
    each) and LayerNorm's mean and 1/std (one each), or with --recompute the block's input only;
    the head's input on the last stage."""
    cfg = layout(name, log_dir)
    args = read_run(Path(log_dir) / f"{name}.jsonl")["config"]["args"]
    first, end = cfg["stage_blocks"][stage]
    width = cfg["width"]
    per_block = width if cfg.get("recompute") else 3 * width + 2
    numbers = (end - first) * per_block
    numbers += math.prod(args["image_shape"]) if stage == 0 else 0
    numbers += width if stage == cfg["stages"] - 1 else 0
    element = 8 if args["precision"] == "64" else 4
    return numbers * cfg["microbatch_size"] * element


def table(plain, recomputed, log_dir=LOG_DIR):
    """Per stage, for two runs of one schedule (without and with --recompute): the most activation
    bytes kept at once, one micro-batch's bytes counted by hand, and their ratio: the micro-batches
    in flight, the same for both where the meter counts what the code keeps."""
    import pandas as pd
    rows = []
    for run, label in ((plain, "plain"), (recomputed, "recompute")):
        peaks = peak_activations(run, log_dir=log_dir)
        for stage, kept in peaks.items():
            one = saved_by_hand(run, stage, log_dir)
            rows.append(dict(stage=stage, run=label, kept_bytes=int(kept), one_microbatch=one,
                             in_flight=kept / one))
    t = pd.DataFrame(rows).pivot(index="stage", columns="run")
    return t.swaplevel(axis=1).sort_index(axis=1)  # columns: run, then measure


def about(t):
    """One sentence per stage, computed from table(): what recomputation kept against without."""
    out = []
    for stage, r in t.iterrows():
        share = r[("recompute", "kept_bytes")] / r[("plain", "kept_bytes")]
        out.append(f"stage {stage}: {r[('plain', 'in_flight')]:.0f} micro-batch(es) in flight; "
                   f"recomputing kept {share:.0%} of the bytes kept without it")
    return out
