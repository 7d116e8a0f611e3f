"""The run log every script writes: JSON lines in logs/<run>.jsonl (schema: logs/README.md).

Also the small pieces of timing around it: peak memory, a progress bar, and the copy of stdout into
logs/<run>.stdout. The schema (schema.py) and the epoch's sums (meter.py) live apart: they import nothing.
"""
import json
import math
import os
import platform
import resource
import socket
import sys
import threading
import time
from pathlib import Path

import torch

from . import UserError, config
from .meter import Meter, steady_rate  # noqa: F401  scripts say metrics.Meter
from .schema import (COMMON, OPTIONAL, SCHEMA, SCHEMA_VERSION, TYPES, TYPES_IN,  # noqa: F401
                     check_record)


def machine_load():
    """(one-minute load average or None where the OS has none, CPU cores this process may use)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (os.getloadavg()[0] if hasattr(os, "getloadavg") else None), cores


def gpu_names():
    """The names of the GPUs torch sees, without starting CUDA where it has not started: a process
    that started it cannot fork ranks that use it (Lightning's ddp_notebook refuses), and a process
    forked after it started cannot start it again (on an H100, lesson 07b's CPU ranks
    forked from a kernel failed here). NVML names them (nvitop, CUDA_VISIBLE_DEVICES respected)."""
    if not torch.cuda.is_available():
        return []
    if not torch.cuda.is_initialized():
        try:
            from nvitop import Device
            return [d.name() for d in Device.from_cuda_visible_devices()]
        except Exception:  # no nvitop or no NVML: torch names them, where CUDA may still start
            if getattr(torch.cuda, "_is_in_bad_fork", lambda: False)():
                return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def environment(device, world_size=1, backend="none"):
    """What ran the job: the 'env' record, with the machine's load as the run starts (the summary has
    it as the run ends): a timing taken on a busy machine says so in its own log."""
    load, cores = machine_load()
    gpus = gpu_names()
    return dict(torch=torch.__version__, python=platform.python_version(), host=socket.gethostname(),
                platform=platform.platform(), cpu_count=os.cpu_count(), threads=torch.get_num_threads(),
                device=str(device), gpus=gpus, cuda=torch.version.cuda, world_size=world_size,
                backend=backend, cores=cores, load_start=load)


def peak_memory_mb(device="cpu"):
    """Peak memory of this process: GPU memory allocated by torch on a GPU, resident memory on CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def progress(iterable, desc, enabled=True):
    """A progress bar on stderr (so logs/<run>.stdout stays readable); off when disabled."""
    from tqdm.auto import tqdm
    return tqdm(iterable, desc=desc, disable=not enabled, file=sys.stderr, leave=False,
                dynamic_ncols=True, mininterval=0.5)


class _Tee:
    """The terminal and logs/<run>.stdout as one stream. A stream that fails (a full disk) is
    dropped after its error is raised once: the error's sentence and Python's last flush at exit
    still reach the terminal. A closed one is dropped quietly: whoever kept this stream past the
    run's end writes to the terminal (rich's live display, Lightning's progress bar where rich is
    installed, as on Colab, restores it and writes after the run's log is closed; found on a GPU
    machine: exit status 120)."""
    def __init__(self, *streams):
        self.streams = list(streams)

    def _each(self, do):
        for s in list(self.streams):
            if getattr(s, "closed", False):
                self.streams.remove(s)
                continue
            try:
                do(s)
            except OSError:
                self.streams.remove(s)
                raise

    def write(self, text):
        self._each(lambda s: (s.write(text), s.flush()))
        return len(text)

    def flush(self):
        self._each(lambda s: s.flush())

    def isatty(self):
        return False


class RunLog:
    """logs/<run>.jsonl and logs/<run>.stdout for one run. Only one process of a job writes them
    (enabled=False on the others), so the log holds one job, not one copy per rank."""

    def __init__(self, args, script, device, world_size=1, backend="none", enabled=True, tensorboard=True):
        self.enabled, self.run, self.device = enabled, args.run_name, device
        self.started = time.perf_counter()
        self._lock, self.live = threading.Lock(), None  # the GPU sampler's thread writes records too
        self.world_size, self.precision = world_size, str(getattr(args, "precision", "32"))
        self.flops_per_sample = None  # flops(): each epoch then logs its FLOP/s
        self.lr, self._lr_hook = None, None  # the learning rate of the last optimizer step
        self.path = Path(args.log_dir) / f"{args.run_name}.jsonl"
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        from . import runlock  # one live writer per run name: a second is refused in one sentence
        folder = getattr(args, "checkpoint_dir", None)
        checkpoint = Path(folder) / f"{args.run_name}.pt" if folder else None
        self._locks = [runlock.Lock(self.path.with_suffix(".lock"), f"run {args.run_name!r}")]
        if checkpoint and checkpoint.parent.is_dir():
            self._locks.append(runlock.Lock(checkpoint.with_name(f".{checkpoint.name}.lock"), f"run {args.run_name!r}"))
        mode = "a" if getattr(args, "resume", False) else "w"
        replaced = [p.name for p in (self.path, checkpoint) if p and p.exists()] if mode == "w" else []
        self._file = open(self.path, mode)
        self._stdout = open(self.path.with_suffix(".stdout"), mode)
        if tensorboard:  # the run's scalars live in logs/tensorboard/<run> (Lightning's logger has its own)
            from . import scalars
            self.live = scalars.Live(args.log_dir, args.run_name, resume=mode == "a")
        self._previous_stdout = sys.stdout
        sys.stdout = _Tee(sys.stdout, self._stdout)
        if replaced:  # the notebooks re-run cells on purpose; elsewhere this says what a reused name overwrites
            print(f"run name {args.run_name!r} was used before: this run replaces its {' and '.join(replaced)} "
                  f"(--resume would continue it)")
        # Every optimizer's step reports its learning rate here (a global hook: no script changes,
        # and warm-up or a scheduler shows as it happens): each epoch logs the last one.
        from torch.optim.optimizer import register_optimizer_step_post_hook
        self._lr_hook = register_optimizer_step_post_hook(self._stepped)
        self.write("config", schema_version=SCHEMA_VERSION, script=Path(script).name, lesson=args.lesson,
                   args={k: (list(v) if isinstance(v, tuple) else v)
                         for k, v in config.as_dict(args).items()})
        self.write("env", **environment(device, world_size, backend))

    def write(self, type, **fields):
        if self.enabled:
            record = dict(type=type, run=self.run, time=time.time(), **fields)
            with self._lock:
                self._file.write(json.dumps(record) + "\n")
                self._file.flush()
                if self.live is not None:
                    self.live.record(type, fields)
        return fields

    def _stepped(self, optimizer, args, kwargs):
        self.lr = float(optimizer.param_groups[0]["lr"])

    def flops(self, model, dataset):
        """Count the FLOPs of one sample's forward and backward once (trainup/flops.py, on a meta copy):
        each epoch then logs its achieved FLOP/s, and its MFU where the GPU's peak is known."""
        if self.enabled:
            from . import flops
            self.flops_per_sample = flops.per_sample(model, tuple(dataset[0][0].shape))
        return self.flops_per_sample

    def _achieved(self, samples, wall_s):
        """The epoch's FLOP/s and MFU fields (none before flops() was called)."""
        if not self.flops_per_sample:
            return {}
        from . import flops
        rate = self.flops_per_sample * samples / wall_s
        device = torch.device(self.device) if not isinstance(self.device, torch.device) else self.device
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        return dict(flops_per_s=rate, mfu=flops.mfu(rate, name, self.precision, self.world_size))

    def epoch(self, epoch, train, test, wall_s):
        """Log and print one epoch, from the train and test Meters."""
        from . import preempt
        wall_s += preempt.WALL_BEFORE.pop(epoch, 0.0)  # a resumed epoch: its seconds before the stop too
        line = dict(epoch=epoch, loss=train.mean_loss, accuracy=train.accuracy, test_loss=test.mean_loss,
                    test_accuracy=test.accuracy, wall_s=wall_s, samples=train.samples,
                    samples_per_s=train.samples / wall_s, peak_mem_mb=peak_memory_mb(self.device),
                    **self._achieved(train.samples, wall_s))
        if self.lr is not None:  # the optimizer stepped: the rate its last step used
            line["lr"] = self.lr
        if not math.isfinite(line["loss"]):  # every later step would train on it: stop, and say where
            self.summary(status="failed")
            raise UserError(f"the training loss became {line['loss']} in epoch {epoch}: the learning rate "
                            f"(--lr) is too high, or the data hold bad values; nothing of this epoch was saved")
        self.epochs = getattr(self, "epochs", []) + [line]
        if self.enabled:
            print(f"epoch {epoch}: loss {line['loss']:.4f}  accuracy {line['accuracy']:.3f}  "
                  f"test accuracy {line['test_accuracy']:.3f}  {line['wall_s']:.2f} s  "
                  f"{line['samples_per_s']:.0f} samples/s")
        return self.write("epoch", **line)

    def summary(self, checkpoint=None, status="finished", **extra):
        epochs = getattr(self, "epochs", [])
        last = epochs[-1] if epochs else {}
        wall = time.perf_counter() - self.started
        line = dict(status=status, epochs=len(epochs), loss=last.get("loss"), accuracy=last.get("accuracy"),
                    test_accuracy=last.get("test_accuracy"), wall_s=wall,
                    samples_per_s=steady_rate(epochs), peak_mem_mb=peak_memory_mb(self.device),
                    checkpoint=str(checkpoint) if checkpoint else None, load_end=machine_load()[0], **extra)
        self.write("summary", **line)
        if self.enabled:
            print(f"{status}: {len(epochs)} epochs in {wall:.1f} s; log {self.path}")
            self.close()
        return line

    def close(self):
        if self.enabled and not self._file.closed:
            if self.live is not None:
                self.live.close()
            if self._lr_hook is not None:
                self._lr_hook.remove()
            sys.stdout = self._previous_stdout
            self._stdout.close()
            self._file.close()
            for lock in self._locks:
                lock.release()
