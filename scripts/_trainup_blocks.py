"""Lessons 06 and 09 start here: DDP on a stack of identical blocks, the model that pipelining,
sharding and tensor parallelism cut up.

    torchrun --standalone --nproc-per-node 2 scripts/_trainup_blocks.py --quick   # 2 processes
    python scripts/_trainup_blocks.py --quick                                     # the baseline

Compared with _trainup_ddp.py: the model is a stack of identical blocks (--blocks, --width) that
every process builds from the same seed; the data set is held in memory and read in whole batches
only, the same number on every rank; what lessons 02-04 added to DDP (precision, loader workers,
sweeps, profiling, GPU statistics, the restart) is left out: the lessons that grow from here
teach where the model's pieces live, and each of their diffs against this script is that. The stop
signal stays (SIGTERM or --stop-signal: a checkpoint at the step, exit 75, --resume goes on).
"""
import itertools
import time

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from trainup import checkpoint, cli, data, distributed, evaluation, metrics, models, preempt


def train_epoch(model, loader, optimizer, epoch, show_progress, device):
    model.train()
    meter = preempt.meter(loader)  # a resumed epoch goes on with the sums of its steps so far
    for x, y in metrics.progress(loader, f"epoch {epoch}", show_progress):
        x, y = x.to(device), y.to(device)
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()  # DDP: gradients averaged over the ranks as they complete
        optimizer.step()
        optimizer.zero_grad()
        meter.add(loss, logits, y)
    return meter


def optimizer_for(params, args):
    optimizer = torch.optim.Adadelta(params, lr=args.lr)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)


def parse_args(argv=None):
    p = cli.parser(__doc__, lesson="blocks")
    p.set_defaults(lr=0.1)  # a stack of blocks wants a smaller step than the CNN's Adadelta 1.0
    cli.add_blocks(p, "the block-stack lessons")
    cli.add_group(p, set_epoch=False)
    return cli.parse(p, argv)


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    ctx = distributed.setup(args)
    stop = preempt.Stopper(args, preempt.TorchDistributed(ctx))  # all ranks stop at one step
    args = stop.args  # the run's name as the job settled it (rank 0's)
    device = ctx.device
    if args.threads:
        torch.set_num_threads(args.threads)
    train_set, test_set = data.load(args)
    torch.manual_seed(args.seed)  # every rank builds the same whole model
    model = models.BlockStack(train_set.shape, train_set.num_classes, args.blocks, args.width)
    model = DDP(model.to(device), device_ids=[device.index] if device.type == "cuda" else None)
    optimizer, scheduler = optimizer_for(model.parameters(), args)
    ckpt = checkpoint.path_for(args)
    start_epoch = checkpoint.load(ckpt, model.module, optimizer, scheduler) if args.resume else 1
    log = metrics.RunLog(args, __file__, device, ctx.world_size, ctx.backend, enabled=ctx.is_main)
    stop.watch(ckpt, log, model.module, optimizer, scheduler)  # what a stop saves, rank 0 writes

    per_rank = args.batch_size // ctx.world_size
    sampler = data.ShuffleSampler(len(train_set), args.seed, ctx.rank, ctx.world_size)
    steps = len(train_set) // args.batch_size  # whole batches only, as many on every rank
    train_loader = DataLoader(train_set, batch_size=per_rank, sampler=sampler, drop_last=True)
    test_loader = DataLoader(test_set, batch_size=1000,
                             sampler=range(ctx.rank, len(test_set), ctx.world_size))
    for epoch in range(start_epoch, args.epochs + 1):
        tick = time.perf_counter()
        sampler.set_epoch(epoch)
        train = train_epoch(model, stop.batches(itertools.islice(train_loader, steps), epoch),
                            optimizer, epoch, args.show_progress and ctx.is_main, device)
        scheduler.step()
        wall = time.perf_counter() - tick
        test = evaluation.evaluate(model.module, test_loader, device)
        log.epoch(epoch, distributed.reduce(train), distributed.reduce(test), wall)
        if ctx.is_main:  # one writer
            checkpoint.save(ckpt, model.module, optimizer, scheduler, epoch, args)
        stop.after_epoch(epoch)  # a stop asked for during evaluation
    log.summary(checkpoint=ckpt)
    distributed.cleanup(ctx)


if __name__ == "__main__":
    main()
