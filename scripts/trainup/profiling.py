"""--profile STEPS: torch.profiler around a few training steps, one trace per process.

    profiling.add_flag(parser)
    profiler = profiling.start(args, rank)                # does nothing without --profile
    train_epoch(model, profiler.steps(train_loader), ...)  # one profiler step per batch
    profiler.stop()

The first steps are skipped (WAIT: the optimizer's first step imports torch._dynamo; WARMUP: the
profiler's own start-up), then STEPS steps are recorded. tensorboard_trace_handler writes each
process's trace to <log-dir>/profiles/<run>/<run>.rank<R>.<time>.pt.trace.json: plain chrome-trace JSON that
TensorBoard (with torch-tb-profiler), ui.perfetto.dev and chrome://tracing open.
"""
import shutil
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from . import UserError
from .cli import positive

WAIT, WARMUP = 1, 1  # steps left out before recording


def add_flag(p):
    p.add_argument("--profile", type=positive(int), default=None, metavar="STEPS",
                   help=f"record STEPS training steps with torch.profiler (after {WAIT + WARMUP} unrecorded ones); "
                        "traces in <log-dir>/profiles/<run>/")


def trace_dir(log_dir, run):
    return Path(log_dir) / "profiles" / run


class _Off:
    """No --profile: the loader passes through untouched."""

    def steps(self, loader):
        return loader

    def stop(self):
        pass


class _On:
    def __init__(self, args, rank, device):
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.device(device).type == "cuda" else [])
        self.dir = trace_dir(args.log_dir, args.run_name)
        self.rank, self.wanted, self.seen = rank, args.profile, 0
        if rank == 0:  # a rerun replaces the run's traces (the others write theirs only after steps with rank 0)
            shutil.rmtree(self.dir, ignore_errors=True)
        self.prof = profile(activities=activities, schedule=schedule(wait=WAIT, warmup=WARMUP, active=args.profile, repeat=1),
                            on_trace_ready=tensorboard_trace_handler(str(self.dir), f"{args.run_name}.rank{rank}"))
        self.prof.start()

    def steps(self, loader):
        return _Steps(self, loader)

    def stop(self):
        self.prof.stop()  # a run shorter than its --profile steps still writes what it recorded
        if self.seen <= WAIT + WARMUP:
            raise UserError(f"--profile {self.wanted}: the run had only {self.seen} training steps, and the first "
                            f"{WAIT + WARMUP} are not recorded: train longer (--epochs, --train-size)")
        if self.rank == 0:
            print(f"profiler: {min(self.wanted, self.seen - WAIT - WARMUP)} steps per process traced in {self.dir} "
                  f"(open with TensorBoard, ui.perfetto.dev or chrome://tracing)")


class _Steps:
    """The loader, with one profiler step per batch (its length kept: a training loop may ask for it)."""

    def __init__(self, on, loader):
        self.on, self.loader = on, loader

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            yield batch
            self.on.seen += 1
            self.on.prof.step()  # the step that just ended is one ProfilerStep#N range in the trace


def start(args, rank=0, device="cpu"):
    """A profiler for this process, or one that does nothing without --profile."""
    if not getattr(args, "profile", None):
        return _Off()
    if hasattr(args, "num_processes"):  # Hogwild trains in worker processes, not in this one
        raise UserError("--profile traces the training loop of one process: Hogwild's workers train in "
                        "others, so profile _trainup_cpu.py instead")
    return _On(args, rank, device)
