"""Lesson 09f, torch.compile with DDP: the DDP model compiled by Inductor, its graph cut at DDP's
bucket boundaries so that each bucket's all-reduce can start while backward goes on.

    torchrun --standalone --nproc-per-node 2 scripts/_trainup_compile.py --quick --compile
    torchrun --standalone --nproc-per-node 2 scripts/_trainup_compile.py --quick  # eager
    python scripts/_trainup_compile.py --quick --compile --bucket-cap-mb 1        # one process

Compared with _trainup_ddp.py: --compile wraps the DDP model in torch.compile (after DDP:
trainup/parallel/compiled.py says why), --compile-mode chooses Inductor's mode, --bucket-cap-mb
DDP's
bucket cap (compiled: one graph per bucket); each epoch's 'compile' record keeps the first step
(which compiles) apart from the median step, with the graphs, graph breaks and recompiles counted.
"""
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from trainup import (UserError, checkpoint, cli, data, devices, distributed, evaluation, gpumon,
                     metrics, models, preempt, profiling, sweeps)
from trainup.parallel import compiled


def train_epoch(model, loader, optimizer, epoch, show_progress, device, precision, scaler):
    model.train()
    meter = preempt.meter(loader)  # a resumed epoch goes on with the sums of the steps it had taken
    for x, y in metrics.progress(loader, f"epoch {epoch}", show_progress):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)  # async, if pinned
        optimizer.zero_grad()
        with devices.autocast(device, precision):
            logits = model(x)
            loss = F.cross_entropy(logits, y)
        scaler.scale(loss).backward()  # fp16 needs its loss scaled so small gradients survive
        scaler.step(optimizer)
        scaler.update()
        meter.add(loss, logits, y)
    return meter


def optimizer_for(model, args):
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)


def parse_args(argv=None):
    p = cli.parser(__doc__, lesson="compile", precisions=tuple(devices.PRECISIONS))
    cli.add_loading(p)
    cli.add_sweep(p)
    cli.add_group(p)
    profiling.add_flag(p)
    compiled.add_flags(p)
    args = cli.parse(p, argv)
    compiled.check(args)  # before any process waits for another
    return args


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    ctx = distributed.context(args)  # rank, world size, backend and device, from the launcher
    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)  # this process's GPU: number LOCAL_RANK on its node
    with distributed.explained(ctx):  # a taken port, a missing rank: a sentence, no traceback
        dist.init_process_group(ctx.backend, **distributed.meeting(ctx))  # waits for every rank
    args = args.replace(resume=args.resume or ctx.restart_count > 0)  # a torchrun restart resumes
    stop = preempt.Stopper(args, preempt.TorchDistributed(ctx))  # all ranks stop at one step
    args = stop.args  # the run's name as the job settled it (rank 0's)
    device = ctx.device
    if ctx.world_size > 1 and args.sweep and any(b % ctx.world_size for b in args.sweep):
        raise UserError(f"every --sweep batch size is global and must split evenly over "
                        f"{ctx.world_size} processes")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.workers is None:
        args = args.replace(workers=2 if device.type == "cuda" else 0)
    train_set, test_set = data.load(args)
    model = models.build(args, train_set).to(device)
    optimizer, scheduler = optimizer_for(model, args)
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "16")
    ckpt = checkpoint.path_for(args)
    start_epoch = (checkpoint.load(ckpt, model, optimizer, scheduler, device, scaler)
                   if args.resume else 1)
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                bucket_cap_mb=args.bucket_cap_mb)  # all-reduces gradients, a bucket at a time
    model = compiled.wrap(model, args)  # after DDP: DDPOptimizer cuts the graph at its buckets
    log = metrics.RunLog(args, __file__, device, ctx.world_size, ctx.backend, enabled=ctx.is_main)
    log.flops(model.module, train_set)  # a sample's FLOPs, once: FLOP/s (and MFU) per epoch
    log.write("ddp", **distributed.describe(ctx, args))
    stop.watch(ckpt, log, model.module, optimizer, scheduler, scaler)  # what a stop saves
    # each node's first process watches that node's GPUs: every rank's
    monitor = gpumon.start_on_node(ctx, log, args)
    if ctx.restart_count and ctx.is_main:
        print(f"torchrun restart {ctx.restart_count}: resuming at epoch {start_epoch} from {ckpt}")
    if args.sweep:
        sweeps.run(args, model, train_set, device, log, train_epoch, optimizer_for, ctx.rank,
                   ctx.world_size)
        monitor.stop()
        log.summary()
        distributed.before_leaving(ctx)  # a barrier: no rank leaves while another steps
        dist.destroy_process_group()
        return

    sampler = DistributedSampler(train_set, num_replicas=ctx.world_size, rank=ctx.rank,
                                 shuffle=True, seed=args.seed)
    train_loader = data.loader(train_set, args.batch_size // ctx.world_size, sampler, args, device)
    test_loader = data.loader(test_set, 1000, range(ctx.rank, len(test_set), ctx.world_size), args,
                              device)
    profiler = profiling.start(args, ctx.rank, device)  # --profile STEPS: a trace of a few steps
    for epoch in range(start_epoch, args.epochs + 1):
        tick = time.perf_counter()
        if not args.no_set_epoch:
            sampler.set_epoch(epoch)  # a new shuffle each epoch, else every epoch repeats the first
        clock = compiled.StepClock(profiler.steps(stop.batches(train_loader, epoch)), device)
        train = train_epoch(model, clock, optimizer, epoch, args.show_progress and ctx.is_main,
                            device, args.precision, scaler)
        scheduler.step()
        devices.synchronize(device)
        wall = time.perf_counter() - tick  # training only, as in the CPU baseline: not the test
        log.write("ranks", **distributed.per_rank(epoch, train, sampler))  # each rank's own
        log.write("compile", **compiled.record(epoch, clock, args))  # the first step apart
        log.epoch(epoch, distributed.reduce(train),
                  distributed.reduce(evaluation.evaluate(model.module, test_loader, device,
                                                         args.precision)), wall)
        if ctx.is_main:  # one writer; the others would race for the same file
            checkpoint.save(ckpt, model.module, optimizer, scheduler, epoch, args, scaler)
        stop.after_epoch(epoch)  # a stop asked for during evaluation
    profiler.stop()
    monitor.stop()
    log.summary(checkpoint=ckpt)
    distributed.before_leaving(ctx)  # a barrier: no rank leaves while another steps
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
