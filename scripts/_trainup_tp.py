"""Lesson 09, tensor parallelism: every layer cut across processes, each computing its slice of every
matrix product; with --dp, a 2-D mesh of tensor x data parallelism.

    torchrun --standalone --nproc-per-node 2 scripts/_trainup_tp.py --quick            # tp 2 (gloo on CPU)
    torchrun --standalone --nproc-per-node 4 scripts/_trainup_tp.py --quick --tp 2     # 2-D: dp 2 x tp 2
    python scripts/_trainup_tp.py --quick                                              # the baseline: one process

Compared with _trainup_blocks.py: the blocks are a transformer's MLP blocks (--hidden); a
DeviceMesh of --dp x --tp processes instead of one DDP group; each block's `up` layer is cut by its
output features (ColwiseParallel) and `down` by its input features (RowwiseParallel) over 'tp'
(trainup/tensor_parallel.py), so the tp processes of one replica take the SAME batch and one
all-reduce per block joins their slices (one more in backward); with --dp the replicas shard the
model and average their gradients with FSDP (fully_shard) over 'dp', instead of DDP; the log keeps
the bytes each rank holds and the collectives of one step; the whole model is gathered
(full_tensor) to save it.
"""
import contextlib
import itertools
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from trainup import (checkpoint, cli, data, devices, distributed, evaluation, metrics,
                     models)
from trainup import tensor_parallel as tpar


def train_epoch(model, loader, optimizer, epoch, show_progress, device, counter=None):
    model.train()
    meter = metrics.Meter()
    for i, (x, y) in enumerate(metrics.progress(loader, f"epoch {epoch}", show_progress)):
        x, y = x.to(device), y.to(device)  # the same batch on every process of a tp group
        counting = counter is not None and i == 0  # the collectives of one step
        with counter if counting else contextlib.nullcontext():
            if counting:
                counter.phase = "forward"
            tick = time.perf_counter()
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            if counting:
                counter.phase = "backward"
            loss.backward()
            if counting:
                counter.phase = "step"
            optimizer.step()  # each rank updates the slices it holds: no communication
            optimizer.zero_grad()
            if counting:
                devices.synchronize(device)  # on a GPU, the step's work, not its launch
                counter.step_s = time.perf_counter() - tick
        meter.add(loss, logits, y)
    return meter


def optimizer_for(params, args):
    optimizer = torch.optim.Adadelta(params, lr=args.lr)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)


def one_per_replica(meter, tp_index):
    """The tp processes of a replica saw the same samples: only one of them counts them in the job's sums."""
    return meter if tp_index == 0 else metrics.Meter()


def parse_args(argv=None):
    p = cli.parser(__doc__, lesson="tp")
    p.add_argument("--tp", type=cli.positive(int), default=None,
                   help="processes that share every layer (default: all of them, or world / --dp)")
    p.add_argument("--dp", type=cli.positive(int), default=None,
                   help="data-parallel replicas (FSDP over them); --dp x --tp must be the number of processes")
    cli.add_blocks(p, "the tensor-parallel lesson", blocks=2, width=64,
                   what="MLP blocks in the model")
    p.add_argument("--hidden", type=cli.positive(int), default=256,
                   help="hidden features of each block (cut over tp)")
    cli.add_group(p, set_epoch=False)
    return cli.parse(p, argv)


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    tp, dp = tpar.check_shape(args, distributed.from_env().world_size)  # before anyone waits for anyone
    ctx = distributed.setup(args)
    device = ctx.device
    if args.threads:
        torch.set_num_threads(args.threads)
    train_set, test_set = data.load(args)
    torch.manual_seed(args.seed)  # every rank builds the same whole model; parallelize keeps its slices
    model = models.FeedForwardStack(train_set.shape, train_set.num_classes, args.blocks, args.width, args.hidden)
    model = model.to(device)
    mesh = tpar.mesh_for(device, dp, tp) if ctx.world_size > 1 else None  # one process: the baseline, uncut
    if mesh is not None:
        tpar.parallelize(model, mesh)
    optimizer, scheduler = optimizer_for(model.parameters(), args)
    dp_index, tp_index = tpar.coordinates(ctx.rank, tp)
    log = metrics.RunLog(args, __file__, device, ctx.world_size, ctx.backend, enabled=ctx.is_main)
    held = tpar.gathered(tpar.parameter_bytes(model, mesh))  # what each rank holds
    log.write("tp", tp=tp, dp=dp, mesh=[dp, tp], blocks=args.blocks, width=args.width, hidden=args.hidden,
              plan=tpar.PLAN, placement=tpar.placement(ctx, tp),
              param_bytes=[h["param_bytes"] for h in held], sharded_bytes=[h["sharded_bytes"] for h in held],
              full_param_bytes=held[0]["full_param_bytes"], full_sharded_bytes=held[0]["full_sharded_bytes"])

    per_replica = args.batch_size // dp
    sampler = data.ShuffleSampler(len(train_set), args.seed, dp_index, dp)  # the same shard in a tp group
    steps = len(train_set) // args.batch_size  # whole batches only: every replica takes the same number
    train_loader = DataLoader(train_set, batch_size=per_replica, sampler=sampler, drop_last=True)
    # equal test shards: under FSDP every replica must run as many forward passes as the others
    test_loader = DataLoader(test_set, batch_size=1000, sampler=range(dp_index, len(test_set) - len(test_set) % dp, dp))
    counter = tpar.CommCounter(mesh)
    for epoch in range(1, args.epochs + 1):
        tick = time.perf_counter()
        sampler.set_epoch(epoch)
        train = train_epoch(model, itertools.islice(train_loader, steps), optimizer, epoch,
                            args.show_progress and ctx.is_main, device, counter if epoch == 1 else None)
        scheduler.step()
        wall = time.perf_counter() - tick
        if epoch == 1:  # the collectives of one training step, every rank's
            log.write("tp_comm", epoch=epoch, step=1, per_replica_batch=per_replica, step_s=counter.step_s,
                      collectives=tpar.gathered(counter.rows()))
        test = evaluation.evaluate(model, test_loader, device)
        log.epoch(epoch, distributed.reduce(one_per_replica(train, tp_index)),
                  distributed.reduce(one_per_replica(test, tp_index)), wall)
        whole = tpar.full_state(model)  # every rank takes part in gathering the slices
        if ctx.is_main:
            tpar.save_model(checkpoint.path_for(args), whole, epoch, args)
    log.summary(checkpoint=checkpoint.path_for(args))
    distributed.cleanup(ctx)


if __name__ == "__main__":
    main()
