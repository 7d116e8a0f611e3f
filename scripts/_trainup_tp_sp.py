"""Lesson 09c, tensor parallelism of attention: a transformer cut as Megatron-LM cuts it, with
sequence parallelism between the cut layers and the loss on class scores that stay cut.

    torchrun --standalone --nproc-per-node 2 scripts/_trainup_tp_sp.py --quick     # tp 2 (gloo)
    torchrun --standalone --nproc-per-node 2 scripts/_trainup_tp_sp.py --quick --sequence-parallel
    python scripts/_trainup_tp_sp.py --quick                                       # the baseline

Compared with _trainup_tp.py: the model is a transformer over the image's rows (--blocks layers
of attention and MLP, --width, --heads); each layer's q, k, v and fc1 cut by output features,
proj and fc2 by input features, so each rank attends with its own heads; --sequence-parallel
keeps the LayerNorms and residuals cut by sequence (trainup/parallel/tp_transformer.py); the class
scores stay cut by class and loss_parallel computes the cross-entropy on them.
"""
import itertools
import time

import torch
import torch.nn.functional as F
from torch.distributed.tensor.parallel import loss_parallel
from torch.utils.data import DataLoader

from trainup import (checkpoint, cli, data, distributed, evaluation, metrics, preempt,
                     transformer)
from trainup.parallel import tensor_parallel as tpar
from trainup.parallel import tp_transformer


def train_epoch(model, loader, optimizer, epoch, show_progress, device):
    model.train()
    meter = preempt.meter(loader)  # a resumed epoch goes on with the sums of its steps so far
    for x, y in metrics.progress(loader, f"epoch {epoch}", show_progress):
        x, y = x.to(device), y.to(device)
        logits = model(x)  # cut by class over 'tp' (one process: whole)
        with loss_parallel():  # the cross-entropy of cut scores, its backward too: no gather
            loss = F.cross_entropy(logits, y)
            loss.backward()  # per layer 2 all-reduces over 'tp' (with --sequence-parallel, 2
            # all-gathers and 2 reduce-scatters); FSDP averages over 'dp', if any
        optimizer.step()  # each rank updates the slices it holds: no communication
        optimizer.zero_grad()
        meter.add(loss, logits, y)
    return meter


def optimizer_for(params, args):
    optimizer = torch.optim.Adadelta(params, lr=args.lr)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)


def parse_args(argv=None):
    p = cli.parser(__doc__, lesson="tp")
    tpar.add_flags(p)  # --tp, --dp; the layers (--blocks, --width, --hidden)
    tp_transformer.add_flags(p)  # --heads, --sequence-parallel
    cli.add_group(p, set_epoch=False)
    return cli.parse(p, argv)


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    args, tp, dp = tpar.check_shape(args, distributed.from_env().world_size)  # before any waits
    train_set, test_set = data.load(args)  # first: the images' shape decides what can be cut
    tp_transformer.check_shape(args, tp, train_set.shape, train_set.num_classes)
    ctx = distributed.setup(args)
    stop = preempt.Stopper(args, preempt.TorchDistributed(ctx))  # all ranks stop at one step
    args = stop.args  # the run's name as the job settled it (rank 0's)
    device = ctx.device
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # every rank builds the same whole model
    model = transformer.Classifier(train_set.shape, train_set.num_classes, args.blocks,
                                   args.width, args.heads, args.hidden).to(device)
    mesh = tpar.mesh_for(device, dp, tp) if ctx.world_size > 1 else None  # 1 process: uncut
    if mesh is not None:  # keeps this rank's slices: its heads, its part of the MLP
        tp_transformer.parallelize(model, mesh, args.sequence_parallel)
    optimizer, scheduler = optimizer_for(model.parameters(), args)
    folder = checkpoint.path_for(args).with_suffix(".dcp")  # every rank its slices (DCP)
    start_epoch, saved = (tpar.load(folder, model, optimizer, scheduler, args) if args.resume
                          else (1, None))
    dp_index, tp_index = tpar.coordinates(ctx.rank, tp)
    log = metrics.RunLog(args, __file__, device, ctx.world_size, ctx.backend, enabled=ctx.is_main)
    tpar.log_layout(log, model, mesh, ctx, args, tp, dp, tp_transformer.described(
        args.sequence_parallel), heads=args.heads, sequence_parallel=args.sequence_parallel,
        tokens=train_set.shape[1])  # an image's rows: the sequence

    per_rank = args.batch_size // dp  # a replica's share, taken whole by each of its tp ranks
    sampler = data.ShuffleSampler(len(train_set), args.seed, dp_index, dp)  # a shard per tp group
    steps = len(train_set) // args.batch_size  # whole batches only, as many on every rank
    train_loader = DataLoader(train_set, batch_size=per_rank, sampler=sampler, drop_last=True)
    # equal test shards: under FSDP every replica must run as many forward passes as the others
    test_loader = DataLoader(test_set, batch_size=1000,
                             sampler=range(dp_index, len(test_set) - len(test_set) % dp, dp))
    counter = tpar.CommCounter(mesh).on_first_step(model, optimizer, device)  # its collectives
    stop.watch(folder, log, model, optimizer, scheduler,  # every rank saves its slices
               save=tpar.saver(folder, model, optimizer, scheduler, args), saved=saved)
    for epoch in range(start_epoch, args.epochs + 1):
        tick = time.perf_counter()
        sampler.set_epoch(epoch)
        train = train_epoch(model, stop.batches(itertools.islice(train_loader, steps), epoch),
                            optimizer, epoch, args.show_progress and ctx.is_main, device)
        scheduler.step()
        wall = time.perf_counter() - tick
        if epoch == 1:  # the collectives of one training step, every rank's
            tpar.log_comm(log, counter, epoch, per_rank)
        test = evaluation.evaluate(model, test_loader, device)
        log.epoch(epoch, distributed.reduce(tpar.one_per_replica(train, tp_index)),
                  distributed.reduce(tpar.one_per_replica(test, tp_index)), wall)
        tpar.save(folder, model, optimizer, scheduler, epoch, args)  # for --resume
        whole = tpar.full_state(model)  # every rank takes part in gathering the slices
        if ctx.is_main:  # one writer
            tpar.save_model(checkpoint.path_for(args), whole, epoch, args)
        stop.after_epoch(epoch)  # a stop asked for during evaluation
    log.summary(checkpoint=checkpoint.path_for(args))
    distributed.cleanup(ctx)


if __name__ == "__main__":
    main()
