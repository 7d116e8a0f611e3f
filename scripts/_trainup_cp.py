"""Lesson 09d, context parallelism: lesson 09c's transformer with its sequence cut over the
processes, every layer whole on each, and attention computed across them.

    torchrun --standalone --nproc-per-node 2 scripts/_trainup_cp.py --quick     # ring (gloo)
    torchrun --standalone --nproc-per-node 2 scripts/_trainup_cp.py --quick --causal
    torchrun --standalone --nproc-per-node 2 scripts/_trainup_cp.py --quick --cp-attention ulysses
    python scripts/_trainup_cp.py --quick                                       # the baseline

Compared with _trainup_tp_sp.py: nothing is cut but the sequence (an image's rows). Every
process takes the whole batch and keeps its own rows through the whole model; attention passes
the keys and values round a ring of the processes (--cp-attention ring) or trades the sequence
for heads with all-to-alls (ulysses); the class scores, a mean over the tokens, are summed over
the processes; so are the gradients (trainup/parallel/context_parallel.py). --causal: each row
attends to
the rows above it only, with the sequence cut zig-zag so that every process has as much to do.
"""
import itertools
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from trainup import (checkpoint, cli, data, distributed, evaluation, metrics, preempt,
                     transformer)
from trainup.parallel import context_parallel as cp
from trainup.parallel import tensor_parallel as tpar


def train_epoch(model, loader, optimizer, epoch, show_progress, device):
    model.train()
    meter = preempt.meter(loader)  # a resumed epoch goes on with the sums of its steps so far
    for x, y in metrics.progress(loader, f"epoch {epoch}", show_progress):
        x, y = x.to(device), y.to(device)
        logits = model(x)  # this rank's rows through every layer; the scores summed: whole
        loss = F.cross_entropy(logits, y)  # the same loss on every rank
        loss.backward()  # each block's key and value gradients travel home round the ring
        cp.sum_gradients(model)  # each rank's tokens' share of every gradient: summed
        optimizer.step()  # the same gradients on every rank: the same update
        optimizer.zero_grad()
        meter.add(loss, logits, y)
    return meter


def optimizer_for(params, args):
    optimizer = torch.optim.Adadelta(params, lr=args.lr)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)


def parse_args(argv=None):
    p = cli.parser(__doc__, lesson="cp")
    cp.add_flags(p)  # the layers (--blocks, --width, --hidden, --heads), --cp-attention, --causal
    cli.add_group(p, set_epoch=False)
    return cli.parse(p, argv)


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    world = distributed.from_env().world_size
    train_set, test_set = data.load(args)  # first: the images' shape decides what can be cut
    rows = train_set.shape[1]  # an image's rows: the sequence
    cp.check_shape(args, world, rows)  # before any process waits
    ctx = distributed.setup(args)
    stop = preempt.Stopper(args, preempt.TorchDistributed(ctx))  # all ranks stop at one step
    args = stop.args  # the run's name as the job settled it (rank 0's)
    device = ctx.device
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # every rank builds the same whole model
    model = transformer.Classifier(train_set.shape, train_set.num_classes, args.blocks,
                                   args.width, args.heads, args.hidden).to(device)
    traffic = cp.parallelize(model, rows, args.cp_attention, args.causal)  # 1 process: uncut
    optimizer, scheduler = optimizer_for(model.parameters(), args)
    ckpt = checkpoint.path_for(args)  # every rank holds the same whole model: rank 0 saves it
    start_epoch = checkpoint.load(ckpt, model, optimizer, scheduler) if args.resume else 1
    traffic.first_step(optimizer)  # what attention sends in one training step
    log = metrics.RunLog(args, __file__, device, ctx.world_size, ctx.backend, enabled=ctx.is_main)
    element_size = torch.get_default_dtype().itemsize
    cp.log_layout(log, args, world, rows, element_size)
    stop.watch(ckpt, log, model, optimizer, scheduler)  # what a stop saves, rank 0 writes

    sampler = data.ShuffleSampler(len(train_set), args.seed, 0, 1)  # every rank the same batches
    steps = len(train_set) // args.batch_size  # whole batches only
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler,
                              drop_last=True)
    test_loader = DataLoader(test_set, batch_size=1000)  # every rank the whole test set
    for epoch in range(start_epoch, args.epochs + 1):
        tick = time.perf_counter()
        sampler.set_epoch(epoch)
        train = train_epoch(model, stop.batches(itertools.islice(train_loader, steps), epoch),
                            optimizer, epoch, args.show_progress and ctx.is_main, device)
        scheduler.step()
        wall = time.perf_counter() - tick
        if epoch == 1:  # the bytes attention sent in one training step, every rank's
            cp.log_traffic(log, traffic, args, world, args.batch_size, rows, element_size)
        test = evaluation.evaluate(model, test_loader, device)
        log.epoch(epoch, distributed.reduce(tpar.one_per_replica(train, ctx.rank)),
                  distributed.reduce(tpar.one_per_replica(test, ctx.rank)), wall)
        if ctx.is_main:  # one writer; every rank holds the same whole model
            checkpoint.save(ckpt, model, optimizer, scheduler, epoch, args)
        stop.after_epoch(epoch)  # a stop asked for during evaluation
    log.summary(checkpoint=ckpt)
    distributed.cleanup(ctx)


if __name__ == "__main__":
    main()
