"""--sweep: a few timed steps at each batch size, logged as 'sweep' records: where the device
(or the job) saturates. One loop for every script; each gives its train_epoch and optimizer,
called through the interfaces declared here (TrainEpoch, OptimizerFor), by keyword."""
import inspect
import itertools
import time
from typing import Any, Iterable, Protocol

import torch

from . import UserError, data, devices, metrics
from .meter import Meter


class TrainEpoch(Protocol):
    """A script's train_epoch, its visible loop: one pass over loader's batches (x, y) on device,
    at --precision (scaler: float16's GradScaler, off otherwise), the meter of its steps returned.
    A script's own extras (accumulate=, warmup=) are keywords with defaults."""

    def __call__(self, *, model: torch.nn.Module, loader: Iterable,
                 optimizer: torch.optim.Optimizer, epoch: int, show_progress: bool,
                 device: torch.device, precision: str, scaler: torch.amp.GradScaler) -> Meter: ...


class OptimizerFor(Protocol):
    """A fresh optimizer and its scheduler (None: none) for model, from the run's flags."""

    def __call__(self, model: torch.nn.Module, args: Any) -> tuple[torch.optim.Optimizer, Any]: ...


def check_step(train_epoch):
    """Refuses, before any work, a train_epoch that cannot be called as TrainEpoch declares: a
    parameter named otherwise, or one more without a default."""
    declared = [p for p in inspect.signature(TrainEpoch.__call__).parameters if p != "self"]
    try:
        inspect.signature(train_epoch).bind(**dict.fromkeys(declared))
    except TypeError as e:
        raise TypeError(f"{train_epoch.__qualname__} is no sweeps.TrainEpoch ({e}): it takes the "
                        f"keywords {', '.join(declared)}") from None


def run(args, model, train_set, device, log, train_epoch: TrainEpoch,
        optimizer_for: OptimizerFor, rank=0, world_size=1):
    """Each --sweep batch size (global: each of world_size ranks takes its share) trained for 2
    warm-up steps, then --sweep-steps timed ones. optimizer_for(model, args) gives each batch size
    a fresh optimizer (Horovod passes one that returns its single DistributedOptimizer)."""
    check_step(train_epoch)
    if min(args.sweep) > len(train_set):  # else the run ends "finished" having measured nothing
        log.summary(status="failed")
        sizes, n = ",".join(map(str, args.sweep)), len(train_set)
        raise UserError(f"--sweep {sizes}: every batch size is larger than the {n} training "
                        f"samples, so none can be measured; sweep sizes up to {n}, or train on "
                        f"more samples (--train-size)")
    for batch_size in args.sweep:
        if batch_size > len(train_set):
            if rank == 0:
                print(f"batch size {batch_size}: skipped, the data set holds only "
                      f"{len(train_set)} samples")
            continue
        optimizer, _ = optimizer_for(model, args)
        scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "16")
        sampler = data.ShuffleSampler(len(train_set), args.seed, rank, world_size)
        per_rank = batch_size // world_size
        loader = data.loader(train_set, per_rank, sampler, args, device)
        batches = data.full_batches(loader, per_rank)
        steps = args.sweep_steps
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)  # the peak of this batch size alone

        def train(n):
            train_epoch(model=model, loader=itertools.islice(batches, n), optimizer=optimizer,
                        epoch=0, show_progress=False, device=device, precision=args.precision,
                        scaler=scaler)
            devices.synchronize(device)
        try:  # warm-up steps first: kernels chosen, memory allocated, loader workers started
            train(2)
            tick = time.perf_counter()  # batches load while the GPU computes, as in training
            train(steps)
        except torch.cuda.OutOfMemoryError:
            if world_size > 1:
                raise  # one rank stopping alone would leave the others waiting: the job fails
            print(f"batch size {batch_size}: out of GPU memory, so the sweep stops here")
            break
        seconds = time.perf_counter() - tick
        line = log.write("sweep", batch_size=batch_size, steps=steps, step_s=seconds / steps,
                         samples_per_s=steps * batch_size / seconds,
                         peak_mem_mb=metrics.peak_memory_mb(device))
        if rank == 0:
            print(f"batch size {batch_size}: {line['samples_per_s']:.0f} samples/s")
