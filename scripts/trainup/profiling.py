"""--profile STEPS: torch.profiler around a few training steps, one trace per process.

    profiling.add_flag(parser)
    profiler = profiling.start(args, rank)                # does nothing without --profile
    train_epoch(model, profiler.steps(train_loader), ...)  # one profiler step per batch
    profiler.stop()

The first steps are skipped (WAIT: the first step pays one-time costs, such as the optimizer's
state, created at its first step, the allocator's first requests and the operator libraries'
first-call set-up; WARMUP: the profiler's own start-up), then STEPS steps are recorded.
tensorboard_trace_handler writes each process's trace to <log-dir>/profiles/<run>/<run>.rank<R>.<time>.pt.trace.json: plain chrome-trace JSON that
TensorBoard (with torch-tb-profiler), ui.perfetto.dev and chrome://tracing open. Beside it,
<run>.rank<R>.key_averages.txt: the profiler's own tables (prof.key_averages().table), by operator,
by operator and input shapes (record_shapes), by memory (profile_memory).

Each recorded step holds four named ranges (record_function), one per phase, for the trace to show:
phase:data (fetching the batch), phase:forward (the model's outermost forward), phase:backward
(Tensor.backward) and phase:optimizer (optimizer.step). Hooks set here open them, not the scripts:
global module and optimizer hooks, and Tensor.backward wrapped while the profiler runs.
"""
import functools
import shutil
from pathlib import Path

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                   register_optimizer_step_pre_hook)
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from . import UserError
from .cli import positive

WAIT, WARMUP = 1, 1  # steps left out before recording
PHASES = ("data", "forward", "backward", "optimizer")  # a step's ranges, named phase:<name>
TABLE_ROWS = 12  # rows of each key_averages table


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
        name = f"{args.run_name}.rank{rank}"
        write_trace = tensorboard_trace_handler(str(self.dir), name)

        def ready(prof):
            write_trace(prof)
            gpu = ProfilerActivity.CUDA in activities
            write_tables(prof, self.dir / f"{name}.key_averages.txt", gpu)

        # record_shapes: each operator's input shapes (a table's grouping, the trace's args);
        # profile_memory: every allocation and free, as the tables' memory columns and the trace's
        # [memory] events. with_stack (Python stacks) is left off: it multiplies the trace's size.
        self.prof = profile(activities=activities, schedule=schedule(wait=WAIT, warmup=WARMUP, active=args.profile, repeat=1),
                            on_trace_ready=ready, record_shapes=True, profile_memory=True)
        self.phases = _Phases()
        self.prof.start()

    def steps(self, loader):
        return _Steps(self, loader)

    def stop(self):
        self.phases.remove()
        self.prof.stop()  # a run shorter than its --profile steps still writes what it recorded
        if self.seen <= WAIT + WARMUP:
            raise UserError(f"--profile {self.wanted}: the run had only {self.seen} training steps, and the first "
                            f"{WAIT + WARMUP} are not recorded: train longer (--epochs, --train-size)")
        if self.rank == 0:
            print(f"profiler: {min(self.wanted, self.seen - WAIT - WARMUP)} steps per process traced in {self.dir} "
                  f"(open with TensorBoard, ui.perfetto.dev or chrome://tracing)")


# The key_averages tables written beside a trace: (title, sort key, group by input shapes)
TABLES = (("by self CPU time", "self_cpu_time_total", False),
          ("by total CPU time", "cpu_time_total", False),  # the ranges first: they hold operators
          ("by input shapes", "self_cpu_time_total", True),  # one row per operator and shapes
          ("by self CPU memory", "self_cpu_memory_usage", False))
GPU_TABLES = (("by self GPU time", "self_device_time_total", False),)


def write_tables(prof, path, gpu=False):
    """The profiler's own summaries of the recorded steps, one per TABLES entry, each under a line
    '## <title>' (lessons/bylesson/traces.py reads them back by title); on a GPU, by self GPU time too."""
    out = []
    for title, key, shapes in TABLES + (GPU_TABLES if gpu else ()):
        averages = prof.key_averages(group_by_input_shape=shapes)
        table = averages.table(sort_by=key, row_limit=TABLE_ROWS)
        out.append(f"## {title}\n{table}")
    Path(path).write_text("\n".join(out))


class _Phases:
    """The named ranges of a training step (PHASES), opened and closed by hooks on the main
    thread, one at a time: a range must end on the thread it began on, and ranges on one thread
    must nest."""

    def __init__(self):
        self.open, self.depth, self.in_step = None, 0, False
        self.handles = [register_module_forward_pre_hook(self._forward_in),
                        # always_call: a forward that raises still leaves its depth
                        register_module_forward_hook(self._forward_out, always_call=True),
                        register_optimizer_step_pre_hook(lambda *_: self.begin("optimizer")),
                        register_optimizer_step_post_hook(lambda *_: self.end())]
        # Backward's hooks may run off the calling thread (autograd runs CUDA work on its own
        # threads): Tensor.backward itself is wrapped, and put back by remove()
        self.backward = backward = torch.Tensor.backward

        @functools.wraps(backward)
        def traced_backward(tensor, *args, **kwargs):
            self.begin("backward")
            try:
                return backward(tensor, *args, **kwargs)
            finally:
                self.end()
        torch.Tensor.backward = traced_backward

    def begin(self, phase):
        if self.in_step and self.open is None:  # evaluation's forwards, nested calls: nothing
            self.open = torch.profiler.record_function(f"phase:{phase}")
            self.open.__enter__()

    def end(self):
        if self.open is not None:
            self.open.__exit__(None, None, None)
            self.open = None

    def _forward_in(self, module, args):
        self.depth += 1
        if self.depth == 1:  # the outermost module: the model (or DDP around it), not its layers
            self.begin("forward")

    def _forward_out(self, module, args, output):
        self.depth -= 1
        if self.depth == 0:
            self.end()

    def remove(self):
        self.end()
        for handle in self.handles:
            handle.remove()
        torch.Tensor.backward = self.backward


class _Steps:
    """The loader, with one profiler step per batch (its length kept: a training loop may ask for
    it) and the step's phases as named ranges (_Phases)."""

    def __init__(self, on, loader):
        self.on, self.loader = on, loader

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        phases, batches = self.on.phases, iter(self.loader)
        while True:
            phases.in_step = True
            phases.begin("data")
            try:
                batch = next(batches)
            except StopIteration:
                return
            finally:
                phases.end()
                phases.in_step = False
            phases.in_step = True
            try:
                yield batch  # the loop's body: forward, backward, optimizer
            finally:
                phases.end()  # a phase left open (an exception, a skipped step) ends with its step
                phases.in_step = False
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
