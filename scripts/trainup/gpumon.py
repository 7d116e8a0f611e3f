"""Watching the GPUs during a run: utilisation and memory, sampled in a background thread.

    monitor = gpumon.start(log.write, device)   # nothing at all on a CPU, or where NVML is missing
    ...train...                                 # each sample a 'gpu' record of the log as it comes
    monitor.stop()                              # (and a 'gpumon' record if readings failed)

    monitor = gpumon.start_on_node(ctx, log, args)  # DDP, Horovod: each node's first process

The samples come from nvitop's Python API (NVML, the library behind nvidia-smi). The thread writes
each one as it is read (RunLog.write holds a lock, so two threads never write the log at once): a
run that crashes or is killed keeps every sample taken before, in its log and its TensorBoard
scalars.
"""
import contextlib
import io
import threading
import time

from . import scalars
from .distributed import node_gpus
from .metrics import SCHEMA

INTERVAL_S = 0.25  # NVML averages utilisation over 1/6 s to 1 s, depending on the GPU
# The fields of a 'gpu' record (logs/README.md), besides type, run and time.
FIELDS = SCHEMA["gpu"]


def _number(value, scale=1):
    """nvitop answers NA (a string) for what a GPU does not report: None in the log."""
    return value / scale if isinstance(value, (int, float)) else None


def nvitop_source(cuda_indices):
    """A function that reads these GPUs (torch's numbering) through nvitop; None where that cannot
    work."""
    try:
        from nvitop import Device, libnvml
    except ImportError:  # nvitop not installed: nothing to sample with
        return None
    # Only "no NVML, no such GPU" means None; any other error is a bug and is raised, not hidden.
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:  # NVML missing: nvitop prints a banner (swallowed here) and finds no devices
            # CUDA_VISIBLE_DEVICES order, as torch counts
            visible = Device.from_cuda_visible_devices()
            if not cuda_indices or max(cuda_indices) >= len(visible):
                return None
            chosen = [(i, visible[i]) for i in cuda_indices]
            chosen[0][1].gpu_utilization()  # one read, to find out now whether NVML answers
        except libnvml.NVMLError:
            return None

    def read():
        return [dict(gpu=i, utilization_pct=_number(d.gpu_utilization()),
                     memory_used_mb=_number(d.memory_used(), 2**20), memory_total_mb=_number(d.memory_total(), 2**20))
                for i, d in chosen]
    return read


class Monitor:
    """Calls source() every interval seconds in a daemon thread and hands each sample to
    write()."""

    def __init__(self, write, source, interval=INTERVAL_S, clock=time.time):
        self.write, self.source, self.interval, self.clock = write, source, interval, clock
        self.samples, self.errors, self.last_error, self._errors_logged = [], 0, None, False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpumon", daemon=True)
        self.started = None

    def start(self):
        self.started = self.clock()
        self._thread.start()
        return self

    def _loop(self):
        while True:
            self.sample()
            if self._stop.wait(self.interval):
                return

    def sample(self):
        """One reading of every GPU; a failed reading is counted and skipped, never raised in the
        thread."""
        now = self.clock()
        try:
            readings = self.source()
        except Exception as e:  # counted, and written to the log by stop(): never silent
            self.errors += 1
            self.last_error = f"{type(e).__name__}: {e}"
            return
        for r in readings:
            sample = dict(r, sampled_at=now, elapsed_s=now - self.started)
            self.samples.append(sample)
            self.write("gpu", **sample)

    def stop(self):
        """End the thread; the samples written since the last stop, in order."""
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
        samples, self.samples = self.samples, []
        if self.errors and not self._errors_logged:
            self.write("gpumon", samples=len(samples), errors=self.errors, last_error=self.last_error)
            self._errors_logged = True
        return samples


class _Nothing:
    """What start() gives where there is no GPU to watch: stop() does nothing."""
    samples = []

    def stop(self):
        return []


def start(write, device, indices=None, source=None, interval=INTERVAL_S):
    """Watch the GPUs this run uses (device's, or indices for several) until stop(); quietly
    nothing on a CPU, or where nvitop cannot read the GPUs. source replaces nvitop (tests pass a
    fake one)."""
    import torch
    if source is None:
        if torch.device(device).type != "cuda":
            return _Nothing()
        source = nvitop_source(indices if indices is not None else [torch.device(device).index or 0])
        if source is None:
            return _Nothing()
    return Monitor(write, source, interval).start()


class _Closing:
    """A Monitor whose stop() also closes the TensorBoard writer its samples go to."""

    def __init__(self, monitor, live):
        self.monitor, self.live = monitor, live

    def stop(self):
        samples = self.monitor.stop()
        self.live.close()
        return samples


def start_on_node(ctx, log, args, source=None):
    """Watch every GPU of this node from its first process (local rank 0), every node's: rank 0's
    samples go to the run's log (and its scalars), another node's to TensorBoard scalars of their
    own, logs/tensorboard/<run>/node<k>. Files on the shared file system of a multi-node job, not
    a collective: gathering samples to rank 0 would add traffic to the run being measured."""
    if ctx.local_rank != 0:
        return _Nothing()
    gpus = node_gpus(ctx)
    if ctx.is_main:
        return start(log.write, ctx.device, gpus, source=source)
    if source is None and (gpus is None or nvitop_source(gpus) is None):
        return _Nothing()  # no GPU here: no folder either
    live = scalars.Live(args.log_dir, f"{args.run_name}/node{ctx.node_rank}",
                        resume=getattr(args, "resume", False))
    return _Closing(start(lambda type, **fields: live.record(type, fields), ctx.device, gpus,
                          source=source), live)
