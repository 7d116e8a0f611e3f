"""The run log every script writes: JSON lines in logs/<run>.jsonl (schema: logs/README.md).

Also the small pieces of timing around it: a meter for loss and accuracy, peak memory, a
progress bar, and the copy of stdout into logs/<run>.stdout.
"""
import json
import math
import os
import platform
import resource
import socket
import sys
import time
from pathlib import Path

import torch

from . import UserError

SCHEMA_VERSION = 1
# The fields each record type must have (every record also has type, run, time).
SCHEMA = {
    "config": ("schema_version", "script", "lesson", "args"),
    "env": ("torch", "python", "host", "platform", "cpu_count", "threads", "device", "gpus",
            "cuda", "world_size", "backend"),
    "epoch": ("epoch", "loss", "accuracy", "test_loss", "test_accuracy", "wall_s", "samples",
              "samples_per_s", "peak_mem_mb"),
    "summary": ("status", "epochs", "loss", "accuracy", "test_accuracy", "wall_s", "samples_per_s",
                "peak_mem_mb", "checkpoint"),
    # Lesson-specific records (logs/README.md, second table)
    "sweep": ("batch_size", "steps", "step_s", "samples_per_s", "peak_mem_mb"),
    "gpu": ("gpu", "utilization_pct", "memory_used_mb", "memory_total_mb", "sampled_at", "elapsed_s"),
    "dp_phases": ("gpus", "batch_size", "scatter_s", "replicate_s", "forward_s", "gather_s", "backward_s"),
    "ddp": ("launcher", "world_size", "local_world_size", "nnodes", "master_addr", "master_port",
            "restart_count", "backend", "timeout_s", "global_batch", "per_rank_batch", "ranks"),
    "ranks": ("epoch", "rank", "loss", "accuracy", "samples", "first_indices"),
    "gpumon": ("samples", "errors", "last_error"),
    "accumulate": ("epoch", "accumulate", "micro_batch", "micro_batches", "allreduce_calls"),
    "collective": ("op", "how", "world_size", "before", "after"),
    "allreduce_bw": ("size_bytes", "world_size", "repeats", "time_s", "algbw_gbps", "busbw_gbps", "ring_factor"),
    "ddp_broadcast": ("world_size", "params_before", "params_after", "buffers_before", "buffers_after"),
    "ddp_buckets": ("bucket_cap_mb", "buckets", "bucket_mb", "allreduce_calls", "before_backward_end",
                    "parameters", "step_s"),
    "ddp_step": ("world_size", "params_before", "params_after"),
    "bn_stats": ("world_size", "running_mean_rank_diff", "local_mean_vs_full", "allreduced_mean_vs_full"),
    "tp": ("tp", "dp", "mesh", "blocks", "width", "hidden", "plan", "placement", "param_bytes", "sharded_bytes",
           "full_param_bytes", "full_sharded_bytes"),
    "tp_comm": ("epoch", "step", "per_replica_batch", "step_s", "collectives"),
    "pipeline": ("schedule", "stages", "stages_per_rank", "pipeline_ranks", "data_parallel", "microbatches",
                 "microbatch_size", "blocks", "width", "stage_blocks", "placement"),
    "pipe_step": ("epoch", "step", "microbatches", "rank", "stages", "step_s", "events", "peak_activation_bytes"),
    "lightning": ("strategy", "accelerator", "precision", "world_size", "num_nodes", "devices", "sync_dist",
                  "launcher"),
    "lightning_sync": ("epoch", "sync_dist", "logged_loss", "job_loss", "rank_loss", "rank_samples", "sampler"),
    "monitor": ("callbacks", "skipped"),
    "sharding": ("shard", "zero_stage", "mesh", "precision", "parameters", "blocks", "width", "start_epoch"),
    "shard_memory": ("shard", "world_size", "parameters", "param_bytes", "grad_bytes", "optim_bytes", "expected_bytes"),
    "shard_comm": ("shard", "world_size", "parameters", "ops"),
}
COMMON = ("type", "run", "time")

# The JSON type of each field, by name (a field of this name has this type in every record type; a field
# not listed here is not type-checked). 'ranks' records hold one value per rank: lists.
INT, NUMBER, TEXT = ("int",), ("int", "float"), ("str",)
TYPES = {
    "type": TEXT, "run": TEXT, "time": NUMBER, "schema_version": INT, "script": TEXT, "lesson": TEXT,
    "args": ("dict",), "torch": TEXT, "python": TEXT, "host": TEXT, "platform": TEXT, "cpu_count": INT,
    "threads": INT, "device": TEXT, "gpus": ("list",), "cuda": TEXT + ("None",), "world_size": INT,
    "backend": TEXT, "wall_s": NUMBER, "peak_mem_mb": NUMBER, "status": TEXT, "checkpoint": TEXT + ("None",),
    "batch_size": INT, "steps": INT, "step_s": NUMBER, "gpu": INT, "sampled_at": NUMBER, "elapsed_s": NUMBER,
    "utilization_pct": NUMBER + ("None",), "memory_used_mb": NUMBER + ("None",),
    "memory_total_mb": NUMBER + ("None",), "errors": INT, "last_error": TEXT + ("None",),
    "launcher": TEXT, "local_world_size": INT, "nnodes": INT, "master_addr": TEXT, "master_port": INT,
    "restart_count": INT, "timeout_s": NUMBER, "global_batch": INT, "per_rank_batch": INT,
    "first_indices": ("list",),
    "shard": TEXT, "param_bytes": ("list",), "grad_bytes": ("list",), "optim_bytes": ("list",),
    "expected_bytes": ("list",), "ops": ("dict",),
    # optional (logs from before they existed lack them): checked where present
    "cores": INT, "load_start": NUMBER + ("None",), "load_end": NUMBER + ("None",),
}
OPTIONAL = {"env": ("cores", "load_start"), "summary": ("load_end",)}
# Fields whose type depends on the record: an epoch's number against a 'ranks' list of them; a summary of
# a run without epochs (a sweep) has no loss.
TYPES_IN = {
    "epoch": dict(epoch=INT, loss=NUMBER, accuracy=NUMBER, test_loss=NUMBER, test_accuracy=NUMBER,
                  samples=INT, samples_per_s=NUMBER),
    "summary": dict(epochs=INT, loss=NUMBER + ("None",), accuracy=NUMBER + ("None",),
                    test_accuracy=NUMBER + ("None",), samples_per_s=NUMBER + ("None",)),
    "ranks": dict(epoch=INT, rank=("list",), loss=("list",), accuracy=("list",), samples=("list",)),
    "sweep": dict(samples_per_s=NUMBER),
    "dp_phases": dict(gpus=INT, scatter_s=NUMBER, replicate_s=NUMBER, forward_s=NUMBER, gather_s=NUMBER,
                      backward_s=NUMBER),
    "ddp": dict(world_size=INT, ranks=("list",)),
    "gpumon": dict(samples=INT),
    "sharding": dict(zero_stage=INT, mesh=INT, parameters=INT, start_epoch=INT),
    "shard_memory": dict(parameters=INT),
    "tp": dict(tp=INT, dp=INT, param_bytes=("list",), sharded_bytes=("list",), full_param_bytes=INT,
               full_sharded_bytes=INT),
    "tp_comm": dict(epoch=INT, collectives=("list",)),
}


def _json_type(value):
    """int, float, str, bool, None, list or dict: as JSON holds it (a bool is not a number here)."""
    return "None" if value is None else type(value).__name__


def check_record(record):
    """The list of what is wrong with one log record (empty when it follows the schema): an unknown type,
    a missing field, or a field whose value has the wrong type."""
    kind = record.get("type")
    if kind not in SCHEMA:
        return [f"unknown record type {kind!r} (logs/README.md lists the types)"]
    problems = [f"{kind!r} record lacks {k!r}" for k in COMMON + SCHEMA[kind] if k not in record]
    for k, value in record.items():
        want = TYPES_IN.get(kind, {}).get(k) or TYPES.get(k)
        if want and k in COMMON + SCHEMA[kind] + OPTIONAL.get(kind, ()) and _json_type(value) not in want:
            problems.append(f"{kind!r} record's {k!r} is {_json_type(value)} {value!r:.40}, not {' or '.join(want)}")
        elif isinstance(value, float) and not math.isfinite(value):  # a NaN loss is a broken run, not a number
            problems.append(f"{kind!r} record's {k!r} is {value}, not a finite number")
    return problems


def machine_load():
    """(one-minute load average or None where the OS has none, CPU cores this process may use)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (os.getloadavg()[0] if hasattr(os, "getloadavg") else None), cores


def environment(device, world_size=1, backend="none"):
    """What ran the job: the 'env' record, with the machine's load as the run starts (the summary has
    it as the run ends): a timing taken on a busy machine says so in its own log."""
    load, cores = machine_load()
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
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


class Meter:
    """Sums of loss, correct predictions and samples over an epoch."""
    def __init__(self):
        self.loss, self.correct, self.samples = 0.0, 0, 0

    def add(self, loss, logits, labels):
        n = labels.numel()
        if loss.device.type == "cpu":
            self.loss += loss.item() * n
            self.correct += (logits.argmax(1) == labels).sum().item()
        else:  # sums stay on the GPU: .item() would make the CPU wait for the GPU at every step
            self.loss += loss.detach().double() * n
            self.correct += (logits.argmax(1) == labels).sum()
        self.samples += n

    def as_tensor(self):
        """The sums as one tensor, to add up across processes (all_reduce)."""
        return torch.tensor([float(self.loss), float(self.correct), self.samples], dtype=torch.float64)

    @classmethod
    def from_tensor(cls, t):
        m = cls()
        m.loss, m.correct, m.samples = t[0].item(), int(t[1].item()), int(t[2].item())
        return m

    @property
    def mean_loss(self):
        return float(self.loss) / max(self.samples, 1)

    @property
    def accuracy(self):
        return float(self.correct) / max(self.samples, 1)


def progress(iterable, desc, enabled=True):
    """A progress bar on stderr (so logs/<run>.stdout stays readable); off when disabled."""
    from tqdm.auto import tqdm
    return tqdm(iterable, desc=desc, disable=not enabled, file=sys.stderr, leave=False,
                dynamic_ncols=True, mininterval=0.5)


class _Tee:
    """The terminal and logs/<run>.stdout as one stream. A stream that fails (a full disk) is dropped after
    its error is raised once: the error's sentence and Python's last flush at exit still reach the terminal."""
    def __init__(self, *streams):
        self.streams = list(streams)

    def _each(self, do):
        for s in list(self.streams):
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

    def __init__(self, args, script, device, world_size=1, backend="none", enabled=True):
        self.enabled, self.run, self.device = enabled, args.run_name, device
        self.started = time.perf_counter()
        self.path = Path(args.log_dir) / f"{args.run_name}.jsonl"
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        from . import preempt  # one live writer per run name: a second is refused in one sentence
        folder = getattr(args, "checkpoint_dir", None)
        checkpoint = Path(folder) / f"{args.run_name}.pt" if folder else None
        self._locks = [preempt.Lock(self.path.with_suffix(".lock"), f"run {args.run_name!r}")]
        if checkpoint and checkpoint.parent.is_dir():
            self._locks.append(preempt.Lock(checkpoint.with_name(f".{checkpoint.name}.lock"), f"run {args.run_name!r}"))
        mode = "a" if getattr(args, "resume", False) else "w"
        replaced = [p.name for p in (self.path, checkpoint) if p and p.exists()] if mode == "w" else []
        self._file = open(self.path, mode)
        self._stdout = open(self.path.with_suffix(".stdout"), mode)
        self._previous_stdout = sys.stdout
        sys.stdout = _Tee(sys.stdout, self._stdout)
        if replaced:  # the notebooks re-run cells on purpose; elsewhere this says what a reused name overwrites
            print(f"run name {args.run_name!r} was used before: this run replaces its {' and '.join(replaced)} "
                  f"(--resume would continue it)")
        self.write("config", schema_version=SCHEMA_VERSION, script=Path(script).name, lesson=args.lesson,
                   args={k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items()})
        self.write("env", **environment(device, world_size, backend))

    def write(self, type, **fields):
        if self.enabled:
            record = dict(type=type, run=self.run, time=time.time(), **fields)
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        return fields

    def epoch(self, epoch, train, test, wall_s):
        """Log and print one epoch, from the train and test Meters."""
        from . import preempt
        wall_s += preempt.WALL_BEFORE.pop(epoch, 0.0)  # a resumed epoch: its seconds before the stop too
        line = dict(epoch=epoch, loss=train.mean_loss, accuracy=train.accuracy, test_loss=test.mean_loss,
                    test_accuracy=test.accuracy, wall_s=wall_s, samples=train.samples,
                    samples_per_s=train.samples / wall_s, peak_mem_mb=peak_memory_mb(self.device))
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
        samples = sum(e["samples"] for e in epochs)
        train_wall = sum(e["wall_s"] for e in epochs)
        line = dict(status=status, epochs=len(epochs), loss=last.get("loss"), accuracy=last.get("accuracy"),
                    test_accuracy=last.get("test_accuracy"), wall_s=wall,
                    samples_per_s=samples / train_wall if train_wall else None,
                    peak_mem_mb=peak_memory_mb(self.device),
                    checkpoint=str(checkpoint) if checkpoint else None, load_end=machine_load()[0], **extra)
        self.write("summary", **line)
        if self.enabled:
            print(f"{status}: {len(epochs)} epochs in {wall:.1f} s; log {self.path}")
            self.close()
        return line

    def close(self):
        if self.enabled and not self._file.closed:
            sys.stdout = self._previous_stdout
            self._stdout.close()
            self._file.close()
            for lock in self._locks:
                lock.release()
