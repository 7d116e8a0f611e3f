"""What must hold after a lesson's run. Each check raises AssertionError with one sentence, or returns one.

Notebooks call these in every cell that runs a job or shows a result, so that nbval fails on a wrong
result, not only on a crash. nbval compares only the output of cells tagged nbval-check-output;
the others' asserts still run and still fail the cell. The margins fit quick mode (512 training samples, 2 epochs).

    from lessons import checks
    checks.finished("cpu_t1")                    # the run finished and its log follows the schema
    checks.learned("cpu_t1")                     # test accuracy well above chance, loss fell
    checks.same_parameters("ddp_n2", "gpu_one")  # two float64 runs (PROOF) ended with the same model
    checks.figure(fig, "cpu_loss")               # the plot has data and its PNG was written
    checks.swept("gpu_sweep_here_cpu")           # a --sweep run measured every batch size it was given
    checks.holds(ratio > 0, "...")               # anything else a cell states
"""
from pathlib import Path

from trainup import CHECKPOINT_DIR, IMAGE_DIR, LOG_DIR

from .log_reader import read_run

# The proofs of equal models run in float64 (--precision 64). Sums in another order (other ranks, threads,
# SIMD widths, oneDNN or not) then move the course's parameters by about 1e-16 (8e-17 measured, DDP on 2
# ranks against one process, a quick run), while a real defect (a sum for a mean, a wrong shard or seed)
# moves them by 1e-4 and more. 1e-9 lies far from both, on any processor. In float32 the same reordered
# sums grow, through Adadelta's per-parameter scaling, to 1e-4 and more: noise as large as a defect.
PROOF = ("--precision", "64")
FLOAT64_ATOL = 1e-9
CLASSES = 10  # every data set of the course has 10 classes (digits, MNIST, CIFAR-10, synthetic by default)
# Quick mode reaches about 70-90 % on the digits; chance is 10 %. Twice chance is far from both.
MIN_ACCURACY = 2.0 / CLASSES


def _fail(sentence):
    raise AssertionError(sentence)


def finished(name, log_dir=LOG_DIR):
    """The run's log has a config, env and a 'finished' summary, and every record follows the schema."""
    path = Path(log_dir) / f"{name}.jsonl"
    if not path.exists():
        _fail(f"{name}: no log at {path.name}: the run did not start or wrote elsewhere")
    run = read_run(path)
    if run["problems"]:
        _fail(f"{name}: the log does not follow the schema: " + "; ".join(run["problems"]))
    if run["summary"].get("status") != "finished":
        _fail(f"{name}: the run did not finish (status {run['summary'].get('status')!r})")
    return run


def learned(name, min_accuracy=MIN_ACCURACY, log_dir=LOG_DIR, loss_falls=True):
    """Finished, the training loss fell, and the test accuracy is well above chance.

    loss_falls=False for a quick run with a large batch: 512 samples at batch 256 are 2 steps an epoch, too
    few for the epoch mean of the loss to fall reliably, while the test accuracy already leaves chance."""
    run = finished(name, log_dir)
    losses = [e["loss"] for e in run["epochs"]]
    if not losses:
        _fail(f"{name}: the log has no epoch: nothing was trained")
    if loss_falls and len(losses) >= 2 and not losses[-1] < losses[0]:
        _fail(f"{name}: the training loss did not fall ({losses[0]:.3f} -> {losses[-1]:.3f})")
    accuracy = run["summary"].get("test_accuracy")
    if accuracy is None or not accuracy >= min_accuracy:
        _fail(f"{name}: test accuracy {accuracy} is not above {min_accuracy:.0%} (chance is {1 / CLASSES:.0%})")
    # the sentence names the margin, not the value: it reads the same on every machine (nbval compares it)
    return f"{name}: finished, {'the loss fell, ' if loss_falls else ''}test accuracy above {min_accuracy:.0%} (chance {1 / CLASSES:.0%})."


def same_parameters(a, b, atol=FLOAT64_ATOL, checkpoint_dir=CHECKPOINT_DIR):
    """Two runs' checkpoints hold the same model: every tensor within atol. Returns the largest difference.
    At float64's tolerance both runs must be float64 (--precision 64): float32 cannot prove that much.
    atol=0 claims bit for bit, in any dtype: two runs that sum in the same order on the same machine (a
    resumed run and an unbroken one, DataParallel without GPUs and the plain model) hold equal bits."""
    worst, dtypes = _difference(a, b, checkpoint_dir)
    if 0 < atol < 1e-6 and dtypes != {"torch.float64"}:
        _fail(f"{a} and {b} hold {', '.join(sorted(dtypes))} parameters: a proof within {atol:.0e} compares "
              f"float64 runs (--precision 64)")
    if not worst <= atol:
        _fail(f"{a} and {b} ended with different parameters (largest difference {worst:.2e} > {atol:.0e})")
    return worst


def difference(a, b, checkpoint_dir=CHECKPOINT_DIR):
    """The largest parameter difference between two runs' checkpoints, asserting nothing (float noise)."""
    return _difference(a, b, checkpoint_dir)[0]


def _difference(a, b, checkpoint_dir):
    import torch
    states = []
    for name in (a, b):
        path = Path(checkpoint_dir) / f"{name}.pt"
        if not path.exists():
            _fail(f"{name}: no checkpoint at {path.name}")
        states.append(torch.load(path, map_location="cpu", weights_only=True)["model"])
    sa, sb = states
    if sa.keys() != sb.keys():
        _fail(f"{a} and {b} hold different models (parameter names differ)")
    worst = max(float((sa[k].double() - sb[k].double()).abs().max()) for k in sa if sa[k].numel())
    dtypes = {str(t.dtype) for t in (*sa.values(), *sb.values()) if t.is_floating_point()}
    return worst, dtypes


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def figure(fig, name, image_dir=IMAGE_DIR):
    """The figure has an axis with data, and images/<name>.png was written and is a PNG. Returns the figure,
    so that a cell can end with `checks.figure(fig, name)` and show it."""
    path = Path(image_dir) / f"{name}.png"
    if fig is None or not getattr(fig, "axes", None):
        _fail(f"figure {name}: nothing was drawn")
    if not any(ax.lines or ax.patches or ax.collections or ax.images for ax in fig.axes):
        _fail(f"figure {name}: its axes hold no data")
    if not path.exists() or path.stat().st_size == 0:
        _fail(f"figure {name}: {path.name} was not saved (or is empty)")
    with open(path, "rb") as f:
        if f.read(len(PNG_MAGIC)) != PNG_MAGIC:
            _fail(f"figure {name}: {path.name} is not a PNG image")
    return fig


def show(fig, name, image_dir=IMAGE_DIR):
    """checks.figure, then the figure shown where it is drawn: in mid-cell, in a loop, beside other output
    (report.save closed it, so a notebook would not show it otherwise)."""
    figure(fig, name, image_dir)
    from IPython.display import display
    display(fig)


def swept(name, log_dir=LOG_DIR):
    """A --sweep run finished, in the schema, and measured the batch sizes it was asked for, each with a
    throughput. A GPU sweep may stop early when a batch no longer fits in memory: the smallest sizes count."""
    run = finished(name, log_dir)
    asked = (run["config"] or {}).get("args", {}).get("sweep") or []
    sizes = [int(b) for b in (asked.split(",") if isinstance(asked, str) else asked)]
    done = [r for r in run["extra"] if r.get("type") == "sweep"]
    measured = sorted({r["batch_size"] for r in done})
    if len(measured) < min(2, len(sizes)) or not set(measured) <= set(sizes) or (sizes and min(sizes) not in measured):
        _fail(f"{name}: the sweep measured batch sizes {measured}, not the {sizes} asked for")
    slow = [r["batch_size"] for r in done if not r["samples_per_s"] > 0]
    if slow:
        _fail(f"{name}: no throughput measured at batch size(s) {slow}")
    return f"{name}: measured {len(measured)} batch sizes, each with a throughput."


def holds(condition, sentence):
    """Any other fact a cell states: fails with the sentence when it does not hold. Returns nothing, so that
    a cell may end with it and show nothing more."""
    if not condition:
        _fail(f"does not hold: {sentence}")


def columns(table, *names, rows=1):
    """A table has these columns and at least `rows` rows, with no missing values in them."""
    missing = [c for c in names if c not in table.columns]
    if missing:
        _fail(f"the table lacks column(s) {', '.join(missing)}")
    if len(table) < rows:
        _fail(f"the table has {len(table)} row(s), expected at least {rows}")
    empty = [c for c in names if table[c].isna().any()]
    if empty:
        _fail(f"the table has missing values in {', '.join(empty)}")
    return table
