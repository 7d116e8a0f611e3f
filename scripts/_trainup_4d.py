"""Lesson 09g, four dimensions in one job: lesson 09c's transformer with its layers in pipeline
stages, each stage's layers cut by tensor parallelism, its rows by context parallelism, and
sharded by FSDP2 over the data-parallel replicas; one device mesh, checked once.

    torchrun --standalone --nproc-per-node 8 scripts/_trainup_4d.py --quick --pp 2 --dp 2 --tp 2
    torchrun --standalone --nproc-per-node 16 scripts/_trainup_4d.py --quick --pp 2 --dp 2 \\
        --cp 2 --tp 2
    python scripts/_trainup_4d.py --quick                                       # the baseline

Compared with _trainup_tp_sp.py: the layout is one frozen ParallelDims (--pp, --dp, --cp, --tp)
that refuses what cannot be cut and builds one mesh ("pp", "dp", "cp", "tp"); each rank keeps one
stage of the model (trainup/parallel/four_d.py), its layers cut over "tp", its rows over "cp" (ring
attention), FSDP2 over "dp" and "cp" folded into one; a GPipe schedule over "pp" runs the
micro-batches; the scores are whole (no loss_parallel: they leave the last stage); a steady step's
collectives and bytes are counted per mesh dimension, beside the formulas. A stop (SIGTERM,
--stop-signal) saves every rank's shards of its stage (DCP); --resume goes on from that step.
"""
import contextlib
import itertools
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from trainup import checkpoint, cli, data, distributed, metrics, preempt, transformer
from trainup.parallel import four_d, parallel_dims
from trainup.parallel import tensor_parallel as tpar


def train_epoch(stage, pipe, loader, optimizer, epoch, show_progress, device, counter):
    stage.train()
    meter = preempt.meter(loader)  # a resumed epoch goes on with the sums of its steps so far
    batches = metrics.progress(loader, f"epoch {epoch}", show_progress)
    for step, (x, y) in enumerate(batches, preempt.first_step(loader)):  # resumed: numbered on
        x, y = x.to(device), y.to(device)
        counted = epoch == 1 and step == counter.step  # a steady step: the first infers shapes
        with counter if counted else contextlib.nullcontext():
            if pipe is None:  # one stage: the whole model, the whole batch
                logits = stage(x)
                loss = F.cross_entropy(logits, y)
                loss.backward()  # per layer 4 all-reduces over 'tp'; FSDP's over 'dp' x 'cp'
            else:  # micro-batches through the stages: activations on and gradients back, 'pp'
                logits, loss = pipe.run(x, y)
            optimizer.step()  # each rank updates its shards of the slices it holds
        optimizer.zero_grad()
        if logits is not None:  # the last stage's ranks
            meter.add(loss, logits, y)
    return meter


def optimizer_for(params, args):
    optimizer = torch.optim.Adadelta(params, lr=args.lr)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)


def parse_args(argv=None):
    p = cli.parser(__doc__, lesson="4d")
    tpar.add_flags(p)  # --tp, --dp; the layers (--blocks, --width, --hidden)
    parallel_dims.add_flags(p)  # --pp, --cp, --microbatches, --heads
    cli.add_group(p, set_epoch=False)
    return cli.parse(p, argv)


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    dims = parallel_dims.ParallelDims.from_args(args, distributed.from_env().world_size)
    train_set, test_set = data.load(args)  # first: the images' shape decides what can be cut
    dims.check_model(args.blocks, args.heads, args.width, args.hidden, train_set.shape[1],
                     args.batch_size, args.microbatches)  # before any process waits
    ctx = distributed.setup(args)
    stop = preempt.Stopper(args, preempt.TorchDistributed(ctx))  # all ranks stop at one step
    args = stop.args  # the run's name as the job settled it (rank 0's)
    device = ctx.device
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # every rank builds the same whole model, then keeps its stage
    model = transformer.Classifier(train_set.shape, train_set.num_classes, args.blocks,
                                   args.width, args.heads, args.hidden).to(device)
    mesh = dims.build_mesh(device.type) if ctx.world_size > 1 else None  # 1 process: uncut
    where = dims.coordinates(ctx.rank)
    stage = four_d.stage_of(model, dims, where, mesh, tokens=train_set.shape[1])
    shard_over = four_d.parallelize(stage, mesh, dims) if mesh is not None else None
    pipe = (four_d.Pipe(stage, dims, mesh, device, args.microbatches) if dims.pp > 1 else None)
    optimizer, scheduler = optimizer_for(stage.parameters(), args)
    args, folder = four_d.folder(args, dims)  # every rank its shards of its stage (DCP), the layout
    start_epoch, saved = (four_d.load(folder, stage, optimizer, scheduler, args) if args.resume
                          else (1, None))
    log = metrics.RunLog(args, __file__, device, ctx.world_size, ctx.backend, enabled=ctx.is_main)
    four_d.log_layout(log, dims, args, ctx.rank)  # the mesh, where every rank sits

    per_rank = args.batch_size // dims.dp  # a replica's share, the same on all its ranks
    sampler = data.ShuffleSampler(len(train_set), args.seed, where["dp"], dims.dp)
    steps = len(train_set) // args.batch_size  # whole batches only, as many on every rank
    train_loader = DataLoader(train_set, batch_size=per_rank, sampler=sampler, drop_last=True)
    # equal test shards, whole micro-batches: every rank runs as many forward passes
    test_loader = DataLoader(test_set, batch_size=per_rank, drop_last=True,
                             sampler=range(where["dp"], len(test_set), dims.dp))
    counter = four_d.Counter(mesh, shard_over, step=four_d.steady_step(steps, saved),
                             holds=(stage, optimizer))  # a step's collectives, the bytes held
    expected = four_d.expected(stage, dims, where, per_rank, train_set.shape[1], args.width,
                               train_set.num_classes, torch.get_default_dtype().itemsize)
    counted = where["tp"] == where["cp"] == 0 and where["pp"] == dims.pp - 1  # a replica's scores
    stop.watch(folder, log, stage, optimizer, scheduler,  # every rank saves its shards
               save=four_d.saver(folder, stage, optimizer, scheduler, args), saved=saved)
    for epoch in range(start_epoch, args.epochs + 1):
        tick = time.perf_counter()
        sampler.set_epoch(epoch)
        batches = stop.batches(itertools.islice(train_loader, steps), epoch)  # from a stop's step
        train = train_epoch(stage, pipe, batches, optimizer, epoch,
                            args.show_progress and ctx.is_main, device, counter)
        scheduler.step()
        wall = time.perf_counter() - tick
        if epoch == 1:  # the collectives and bytes of one training step, every rank's
            four_d.log_comm(log, counter, expected, ctx.is_main)
        test = four_d.evaluate(stage, pipe, test_loader, device)
        log.epoch(epoch, distributed.reduce(train if counted else metrics.Meter()),
                  distributed.reduce(test if counted else metrics.Meter()), wall)
        four_d.save(folder, stage, optimizer, scheduler, epoch, args)  # for --resume
        whole = four_d.full_state(stage)  # every rank takes part in gathering the slices
        if ctx.is_main:  # one writer
            tpar.save_model(checkpoint.path_for(args), whole, epoch, args)
        stop.after_epoch(epoch)  # a stop asked for during evaluation
    log.summary(checkpoint=checkpoint.path_for(args))
    distributed.cleanup(ctx)


if __name__ == "__main__":
    main()
