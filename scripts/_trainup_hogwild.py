"""Lesson 01, Hogwild: the CPU baseline's model trained by several processes at once.

    python scripts/_trainup_hogwild.py --quick
    python scripts/_trainup_hogwild.py --num-processes 2 --threads 1    # 2 processes, 1 model

N processes train one model in shared memory, each on its share of the data, without locks.
"""
import os

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.utils.data import DataLoader

from trainup import checkpoint, cli, data, evaluation, metrics, models, preempt, profiling, workers


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


def hogwild_worker(rank, args, model, train_set, start_epoch, link):
    """One of N processes: trains the shared model on every N-th sample, epoch by epoch."""
    preempt.leave_to_main(args)  # a stop is the main process's: it ends the workers between epochs
    torch.set_num_threads(args.threads)
    sampler = data.ShuffleSampler(len(train_set), args.seed, rank, args.num_processes)
    batch = args.batch_size // args.num_processes
    loader = DataLoader(train_set, batch_size=batch, sampler=sampler)
    optimizer, scheduler = optimizer_for(model, args)
    for _ in range(1, start_epoch):
        scheduler.step()
    for epoch in link.epochs(start_epoch, args.epochs):  # each when the main process says
        sampler.set_epoch(epoch)
        link.done(train_epoch(model, loader, optimizer, epoch, rank == 0 and args.show_progress))
        scheduler.step()


def hogwild_epochs(args, model, train_set, start_epoch):
    """Start the workers (as in mnist_hogwild); yield (epoch, their Meters summed, seconds)."""
    model.share_memory()  # every worker's optimizer steps these very tensors
    ctx = mp.get_context("spawn")  # fork is unsafe once torch has started its thread pools
    link = workers.Link(ctx)  # the main process tells the workers when to train an epoch
    procs = [ctx.Process(target=hogwild_worker, daemon=True,
                         args=(rank, args, model, train_set, start_epoch, link))
             for rank in range(args.num_processes)]
    for proc in procs:
        proc.start()
    yield from workers.epochs(procs, link, start_epoch, args.epochs)


def parse_args(argv=None):
    p = cli.parser(__doc__, lesson="cpu")
    p.add_argument("--num-processes", type=cli.positive(int), default=2,
                   help="worker processes training one shared model")
    profiling.add_flag(p)
    args = cli.parse(p, argv)
    if args.batch_size < args.num_processes:
        p.error(f"--batch-size {args.batch_size} cannot be split across {args.num_processes} "
                "processes")
    args = args.replace(threads=args.threads or max(1, (os.cpu_count() or 1) // args.num_processes))
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
    log = metrics.RunLog(args, __file__, "cpu", world_size=args.num_processes, backend="hogwild")
    log.flops(model, train_set)  # a sample's FLOPs, once: FLOP/s (and MFU) per epoch
    stop.watch(ckpt, log, model, optimizer, scheduler)  # what a stop saves; on --resume, the step to go on from

    # each worker steps its own optimizer and learning-rate schedule
    for epoch, train, wall in hogwild_epochs(args, model, train_set, start_epoch):
        log.epoch(epoch, train, evaluation.evaluate(model, test_loader), wall)
        checkpoint.save(ckpt, model, optimizer, scheduler, epoch, args)
        stop.after_epoch(epoch)  # a stop asked for during evaluation, or from this epoch's end
    profiler.stop()
    log.summary(checkpoint=ckpt)


if __name__ == "__main__":
    main()
