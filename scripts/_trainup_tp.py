"""Lesson 09, tensor parallelism: every layer cut across processes, each computing its slice of
every matrix product; with --dp, a 2-D mesh of tensor x data parallelism.

    torchrun --standalone --nproc-per-node 2 scripts/_trainup_tp.py --quick         # tp 2 (gloo)
    torchrun --standalone --nproc-per-node 4 scripts/_trainup_tp.py --quick --tp 2  # dp 2 x tp 2
    python scripts/_trainup_tp.py --quick                                           # the baseline

Compared with _trainup_blocks.py: MLP blocks (--hidden); a DeviceMesh of --dp x --tp processes
instead of one DDP group; each block's `up` cut by its output features (ColwiseParallel), `down`
by its input features (RowwiseParallel) over 'tp' (trainup/parallel/tensor_parallel.py), so the tp
processes of a replica take the SAME batch; with --dp, FSDP (fully_shard) over 'dp' instead of
DDP; the log keeps the bytes each rank holds and one step's collectives; the whole model is
gathered (full_tensor) to save it.
"""
import itertools
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from trainup import checkpoint, cli, data, distributed, evaluation, metrics, models, preempt
from trainup.parallel import tensor_parallel as tpar


def train_epoch(model, loader, optimizer, epoch, show_progress, device):
    model.train()
    meter = preempt.meter(loader)  # a resumed epoch goes on with the sums of its steps so far
    for x, y in metrics.progress(loader, f"epoch {epoch}", show_progress):
        x, y = x.to(device), y.to(device)
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()  # one all-reduce per block over 'tp'; FSDP averages over 'dp', if any
        optimizer.step()  # each rank updates the slices it holds: no communication
        optimizer.zero_grad()
        meter.add(loss, logits, y)
    return meter


def optimizer_for(params, args):
    optimizer = torch.optim.Adadelta(params, lr=args.lr)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)


def parse_args(argv=None):
    p = cli.parser(__doc__, lesson="tp")
    tpar.add_flags(p)  # --tp, --dp; the MLP block stack (--blocks, --width, --hidden)
    cli.add_group(p, set_epoch=False)
    return cli.parse(p, argv)


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    args, tp, dp = tpar.check_shape(args, distributed.from_env().world_size)  # before any waits
    ctx = distributed.setup(args)
    stop = preempt.Stopper(args, preempt.TorchDistributed(ctx))  # all ranks stop at one step
    args = stop.args  # the run's name as the job settled it (rank 0's)
    device = ctx.device
    if args.threads:
        torch.set_num_threads(args.threads)
    train_set, test_set = data.load(args)
    torch.manual_seed(args.seed)  # every rank builds the same whole model
    model = models.FeedForwardStack(train_set.shape, train_set.num_classes, args.blocks,
                                    args.width, args.hidden).to(device)
    mesh = tpar.mesh_for(device, dp, tp) if ctx.world_size > 1 else None  # 1 process: uncut
    if mesh is not None:
        tpar.parallelize(model, mesh)  # keeps this rank's slices: Colwise `up`, Rowwise `down`
    optimizer, scheduler = optimizer_for(model.parameters(), args)
    folder = checkpoint.path_for(args).with_suffix(".dcp")  # every rank its slices (DCP)
    start_epoch, saved = (tpar.load(folder, model, optimizer, scheduler, args) if args.resume
                          else (1, None))
    dp_index, tp_index = tpar.coordinates(ctx.rank, tp)
    log = metrics.RunLog(args, __file__, device, ctx.world_size, ctx.backend, enabled=ctx.is_main)
    tpar.log_layout(log, model, mesh, ctx, args, tp, dp)  # the bytes each rank holds, its place

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
