"""Lesson 01, the CPU baseline: pytorch/examples' MNIST CNN, trained on the CPU.

    python scripts/_trainup_cpu.py --quick
    python scripts/_trainup_cpu.py --threads 1      # one core

Several processes training one shared model (Hogwild) are the next script: _trainup_hogwild.py.
"""
import os
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from trainup import checkpoint, cli, data, evaluation, metrics, models, preempt, profiling


def train_epoch(model, loader, optimizer, epoch, show_progress):
    model.train()
    meter = preempt.meter(loader)  # a resumed epoch goes on with the sums of the steps it had taken
    for x, y in metrics.progress(loader, f"epoch {epoch}", show_progress):
        optimizer.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        optimizer.step()
        meter.add(loss, logits, y)
    return meter


def optimizer_for(model, args):
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)


def parse_args(argv=None):
    p = cli.parser(__doc__, lesson="cpu")
    profiling.add_flag(p)
    args = cli.parse(p, argv)
    args = args.replace(threads=args.threads or os.cpu_count() or 1)
    return args


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    stop = preempt.Stopper(args)  # SIGTERM or --stop-signal: finish the step, save where we are, exit 75
    args = stop.args  # the run's name as the job settled it (rank 0's)
    torch.set_num_threads(args.threads)
    profiler = profiling.start(args)  # --profile STEPS: a trace of a few steps
    train_set, test_set = data.load(args)
    test_loader = DataLoader(test_set, batch_size=1000)
    model = models.build(args, train_set)
    optimizer, scheduler = optimizer_for(model, args)
    ckpt = checkpoint.path_for(args)
    start_epoch = checkpoint.load(ckpt, model, optimizer, scheduler) if args.resume else 1
    log = metrics.RunLog(args, __file__, "cpu")
    log.flops(model, train_set)  # a sample's FLOPs, once: FLOP/s (and MFU) per epoch
    stop.watch(ckpt, log, model, optimizer, scheduler)  # what a stop saves; on --resume, the step to go on from
    sampler = data.ShuffleSampler(len(train_set), args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)

    for epoch in range(start_epoch, args.epochs + 1):
        tick = time.perf_counter()
        sampler.set_epoch(epoch)
        train = train_epoch(model, profiler.steps(stop.batches(train_loader, epoch)), optimizer, epoch,
                            args.show_progress)
        scheduler.step()
        wall = time.perf_counter() - tick
        log.epoch(epoch, train, evaluation.evaluate(model, test_loader), wall)
        checkpoint.save(ckpt, model, optimizer, scheduler, epoch, args)
        stop.after_epoch(epoch)  # a stop asked for during evaluation
    profiler.stop()
    log.summary(checkpoint=ckpt)


if __name__ == "__main__":
    main()
