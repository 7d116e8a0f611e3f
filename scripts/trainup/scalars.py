"""TensorBoard scalars of a run, written as it trains: logs/tensorboard/<run>/, flushed with every
record.

    live = scalars.Live(log_dir, run_name, resume)  # RunLog's, in the process that writes the log
    live.record("epoch", fields)                    # each record the log gets: its scalars
    live.close()

The JSONL log stays the course's record; these are for watching a run while it goes (`tensorboard
--logdir logs/tensorboard`, or `%tensorboard` in a notebook). lessons.bylesson.traces.to_tensorboard writes
a finished run's log with the same tags (tags_of), so a live run and a converted one look alike.
"""

import shutil
from pathlib import Path

EPOCH = ("loss", "accuracy", "test_loss", "test_accuracy", "samples_per_s", "peak_mem_mb", "lr")
GPU = ("utilization_pct", "memory_used_mb")


def tags_of(type, fields):
    """[(tag, value, step)] of one log record: an epoch's numbers by epoch (train/* and test/*), a
    GPU sample's by tenth of a second since the run started (gpu<N>/*); nothing for other
    records."""
    if type == "epoch":
        return [
            (
                ("test/" if k.startswith("test") else "train/") + k.removeprefix("test_"),
                fields[k],
                fields["epoch"],
            )
            for k in EPOCH
            if fields.get(k) is not None
        ]
    if type == "gpu":
        return [
            (f"gpu{fields['gpu']}/{k}", fields[k], round(fields["elapsed_s"] * 10))
            for k in GPU
            if fields.get(k) is not None
        ]
    return []


class Live:
    """One run's scalars, written and flushed as its records come (a killed run keeps what it
    wrote)."""

    def __init__(self, log_dir, run, resume=False):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard not installed: the JSONL log alone, as before
            self.writer = None
            return
        folder = Path(log_dir) / "tensorboard" / run
        # a run that replaces one starts new curves, not more points on the old ones
        if not resume:
            shutil.rmtree(folder, ignore_errors=True)
        self.writer = SummaryWriter(str(folder))

    def record(self, type, fields):
        points = tags_of(type, fields)
        if self.writer is None or not points:
            return
        for tag, value, step in points:
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self):
        if self.writer is not None:
            self.writer.close()
