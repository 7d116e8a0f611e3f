"""Lesson 05, Horovod: the DDP lesson's training, with Horovod's ring all-reduce instead of DDP's.

    horovodrun -np 2 -H localhost:2 --gloo python scripts/_trainup_horovod.py --quick   # 2 processes
    horovodrun -np 8 -H node1:4,node2:4 --gloo python scripts/_trainup_horovod.py      # 2 nodes (ssh)
    srun horovodrun -np 2 -H localhost:2 --gloo python scripts/_trainup_horovod.py     # in a SLURM job
    python scripts/_trainup_horovod.py --quick                                         # one process

Compared with _trainup_ddp.py: hvd.init() instead of a process group (horovodrun or mpirun tells
each process its rank); the device pinned by hvd.local_rank(); the optimizer wrapped in
hvd.DistributedOptimizer (it all-reduces and AVERAGES the gradients; --fp16-allreduce halves what
travels; --accumulate K all-reduces once every K backward passes) instead of the model in DDP;
parameters and optimizer state broadcast from rank 0; metrics summed with hvd.allreduce. Horovod
leaves the learning rate alone (its docs: times hvd.size(), with a warm-up): --batch-size is GLOBAL
here, so --lr stays. Not elastic: a lost rank ends the job (hvd.elastic is not used).
Horovod is built from source for the course (tools/build_horovod.sh, run by tools/setup_env.sh).
"""
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DistributedSampler

from trainup import (UserError, checkpoint, cli, data, devices, evaluation, gpumon,
                     metrics, models, preempt, profiling, sweeps)
from trainup.engines import hvd_group
from trainup.engines.hvd_group import hvd  # import horovod.torch as hvd (None where not built)


def train_epoch(model, loader, optimizer, epoch, show_progress, device, precision, scaler):
    model.train()
    meter = preempt.meter(loader)  # a resumed epoch goes on with the sums of the steps it had taken
    step = hvd_group.Accumulation(optimizer, loader)  # --accumulate K: K micro-batches a step
    for x, y in metrics.progress(loader, f"epoch {epoch}", show_progress):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)  # async from pinned memory
        with devices.autocast(device, precision):
            logits = model(x)
            loss = F.cross_entropy(logits, y)
        scaler.scale(step.weigh(loss, len(y))).backward()  # fp16: scaled, small gradients survive
        if step.last():  # Horovod all-reduced only now (backward_passes_per_step=K)
            optimizer.synchronize()  # wait for the all-reduces: the scaler unscales averages
            step.average()  # a short step scaled up to its samples: the step's mean gradient
            scaler.unscale_(optimizer)
            with optimizer.skip_synchronize():  # synchronized: step() must not all-reduce again
                scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()  # after the step: between passes Horovod refuses it (a race)
        meter.add(loss, logits, y)
    return meter


def optimizer_for(model, args):
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    # Its hooks all-reduce each gradient as soon as backward produces it; step() waits for them (average).
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         backward_passes_per_step=args.accumulate or 1,
                                         compression=compression, op=hvd.Average)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)


def parse_args(argv=None):
    p = cli.parser(__doc__, lesson="horovod", precisions=tuple(devices.PRECISIONS))
    cli.add_loading(p)
    cli.add_sweep(p)
    hvd_group.add_flags(p)  # --fp16-allreduce, --accumulate; the group's flags but --backend
    profiling.add_flag(p)
    args = cli.parse(p, argv)
    return args


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    hvd_group.before_init(args)  # Horovod built (else how to build it); --timeout for hvd.init()
    hvd.init()  # rank, size and local rank come from horovodrun (or mpirun)
    ctx = hvd_group.setup(args)  # the DDP script's Context, from hvd.rank(), hvd.size() and kin
    ctx.device = devices.pick(hvd_group.gpu_ops(args.device), hvd.local_rank())  # this rank's GPU
    stop = preempt.Stopper(args, preempt.Horovod(hvd))  # rank 0's run name; all ranks stop at one step
    args = stop.args  # the run's name as the job settled it (rank 0's)
    device = ctx.device
    if ctx.world_size > 1 and args.sweep and any(b % ctx.world_size for b in args.sweep):
        raise UserError(f"every --sweep batch size is global and must split evenly over {ctx.world_size} processes")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.workers is None:
        args = args.replace(workers=2 if device.type == "cuda" else 0)
    train_set, test_set = data.load(args)
    model = models.build(args, train_set).to(device)
    optimizer, scheduler = optimizer_for(model, args)
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "16")
    ckpt = checkpoint.path_for(args)
    start_epoch = checkpoint.load(ckpt, model, optimizer, scheduler, device, scaler) if args.resume else 1
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # every rank starts as rank 0,
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)  # whatever it initialised or loaded
    log = metrics.RunLog(args, __file__, device, ctx.world_size, ctx.backend, enabled=ctx.is_main)
    log.flops(model, train_set)  # a sample's FLOPs, once: FLOP/s (and MFU) per epoch
    log.write("ddp", **hvd_group.describe(ctx, args))
    stop.watch(ckpt, log, model, optimizer, scheduler, scaler)  # what a stop saves, rank 0 writes
    # each node's first process watches that node's GPUs: every rank's
    monitor = gpumon.start_on_node(ctx, log, args)
    if args.sweep:
        sweeps.run(args, model, train_set, device, log, train_epoch, lambda *_: (optimizer, None), ctx.rank,
                   ctx.world_size)  # one DistributedOptimizer: a second would hook every gradient again
        monitor.stop()
        log.summary()
        hvd.shutdown()
        return

    sampler = DistributedSampler(train_set, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=args.seed)
    train_loader = data.loader(train_set, hvd_group.micro_batch(args, ctx), sampler, args, device)
    test_loader = data.loader(test_set, 1000, range(ctx.rank, len(test_set), ctx.world_size), args, device)
    profiler = profiling.start(args, ctx.rank, device)  # --profile STEPS: a trace of a few steps
    for epoch in range(start_epoch, args.epochs + 1):
        tick = time.perf_counter()
        if not args.no_set_epoch:
            sampler.set_epoch(epoch)  # a new shuffle each epoch; forgotten, every epoch repeats the first
        train = train_epoch(model, profiler.steps(stop.batches(train_loader, epoch)),
                            optimizer, epoch, args.show_progress and ctx.is_main, device, args.precision, scaler)
        scheduler.step()
        devices.synchronize(device)
        wall = time.perf_counter() - tick  # training only, as in the CPU baseline: the test set is not timed
        log.write("ranks", **hvd_group.per_rank(epoch, train, sampler))  # what each rank alone saw
        test = evaluation.evaluate(model, test_loader, device, args.precision)
        log.epoch(epoch, hvd_group.reduce(train), hvd_group.reduce(test), wall)  # all ranks' sums
        if ctx.is_main:  # one writer; the others would race for the same file
            checkpoint.save(ckpt, model, optimizer, scheduler, epoch, args, scaler)
        stop.after_epoch(epoch)  # a stop asked for during evaluation
    profiler.stop()
    monitor.stop()
    log.summary(checkpoint=ckpt)
    hvd_group.cleanup(ctx)  # a barrier, then hvd.shutdown()


if __name__ == "__main__":
    main()
