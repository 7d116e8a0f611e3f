"""Lesson 04, DDP tuned: what a large global batch needs, on top of _trainup_ddp.py.

    torchrun --standalone --nproc-per-node 2 scripts/_trainup_ddp_tuned.py --quick --accumulate 4
    python scripts/_trainup_ddp_tuned.py --quick --optimizer sgd --lr 0.08 --warmup-steps 4
    torchrun --standalone --nproc-per-node 2 scripts/_trainup_ddp_tuned.py --model cnn_bn --sync-bn

Against _trainup_gpu.py: init_process_group (trainup/distributed.py reads rank, world size
and the meeting point from torchrun, SLURM or neither); torch.cuda.set_device(LOCAL_RANK); a
DistributedSampler with set_epoch; the model wrapped in DDP; --batch-size is the GLOBAL batch (each
process takes batch/world); metrics summed over the processes before logging; logs and checkpoints
from rank 0 only; a torchrun restart resumes from the checkpoint; destroy_process_group.
Against _trainup_ddp.py: --accumulate K (K micro-batches a step, no_sync until the last),
--optimizer sgd, --warmup-steps N (the linear scaling rule's), --sync-bn (GPUs).
"""
import contextlib
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from trainup import (UserError, checkpoint, cli, data, devices, distributed, evaluation, gpumon,
                     metrics, models, preempt, profiling, sweeps, tuning)


def train_epoch(model, loader, optimizer, epoch, show_progress, device, precision, scaler,
                accumulate=1, warmup=None):
    model.train()
    meter = preempt.meter(loader)  # a resumed epoch goes on with the sums of the steps it had taken
    seen = 0  # samples of the step being accumulated
    for i, (x, y) in enumerate(metrics.progress(loader, f"epoch {epoch}", show_progress)):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)  # async from pinned memory
        last = (i + 1) % accumulate == 0 or i + 1 == len(loader)  # --accumulate: the step's last
        with (contextlib.nullcontext() if last else model.no_sync()):  # gradients add up locally
            with devices.autocast(device, precision):
                logits = model(x)
                loss = F.cross_entropy(logits, y)
            # summed, divided by the step's samples below (loss / K over-weights a short batch)
            scaler.scale(loss * len(y) if accumulate > 1 else loss).backward()  # fp16: scaled
        seen += len(y)
        if last:
            if accumulate > 1:
                for p in model.parameters():
                    p.grad.div_(seen)
            seen = 0
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            if warmup is not None and warmup.last_epoch < warmup.total_iters:
                warmup.step()  # --warmup-steps: the rate grows step by step to --lr
        meter.add(loss, logits, y)
    return meter


def optimizer_for(model, args):
    sgd = args.optimizer == "sgd"  # momentum 0.9: the optimizer of the linear scaling rule
    optimizer = (torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9) if sgd
                 else torch.optim.Adadelta(model.parameters(), lr=args.lr))
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)


def parse_args(argv=None):
    p = cli.parser(__doc__, lesson="ddp", precisions=tuple(devices.PRECISIONS))
    cli.add_loading(p)
    cli.add_sweep(p)
    cli.add_group(p)
    tuning.add_flags(p)  # --accumulate, --optimizer, --warmup-steps, --sync-bn
    profiling.add_flag(p)
    args = cli.parse(p, argv)
    tuning.check(args, p)
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
    stop = preempt.Stopper(args, preempt.TorchDistributed(ctx))  # rank 0's run name; all ranks stop at one step
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
    if args.sync_bn:
        tuning.check_sync_bn(model, device)
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)  # statistics over all ranks
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)  # all-reduces gradients
    allreduces = tuning.count_allreduces(model) if args.accumulate else None
    warmup = (torch.optim.lr_scheduler.LinearLR(optimizer, 1 / args.warmup_steps,
                                                total_iters=args.warmup_steps - 1)
              if args.warmup_steps and start_epoch == 1 else None)
    log = metrics.RunLog(args, __file__, device, ctx.world_size, ctx.backend, enabled=ctx.is_main)
    log.flops(model.module, train_set)  # a sample's FLOPs, once: FLOP/s (and MFU) per epoch
    log.write("ddp", **distributed.describe(ctx, args))
    # what a stop saves, rank 0 writes; the warm-up's step too
    stop.watch(ckpt, log, model.module, optimizer, scheduler, scaler, warmup=warmup)
    # each node's first process watches that node's GPUs: every rank's
    monitor = gpumon.start_on_node(ctx, log, args)
    if ctx.restart_count and ctx.is_main:
        print(f"torchrun restart {ctx.restart_count}: resuming at epoch {start_epoch} from {ckpt}")
    if args.sweep:
        sweeps.run(args, model, train_set, device, log, train_epoch, optimizer_for, ctx.rank, ctx.world_size)
        monitor.stop()
        log.summary()
        distributed.before_leaving(ctx)  # a barrier: no rank leaves while another steps
        dist.destroy_process_group()
        return

    sampler = DistributedSampler(train_set, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=args.seed)
    accumulate = args.accumulate or 1
    micro_batch = args.batch_size // ctx.world_size // accumulate  # --accumulate: K of them a step
    train_loader = data.loader(train_set, micro_batch, sampler, args, device)
    test_loader = data.loader(test_set, 1000, range(ctx.rank, len(test_set), ctx.world_size), args, device)
    profiler = profiling.start(args, ctx.rank, device)  # --profile STEPS: a trace of a few steps
    for epoch in range(start_epoch, args.epochs + 1):
        tick = time.perf_counter()
        if not args.no_set_epoch:
            sampler.set_epoch(epoch)  # a new shuffle each epoch; forgotten, every epoch repeats the first
        train = train_epoch(model, profiler.steps(stop.batches(train_loader, epoch)),
                            optimizer, epoch, args.show_progress and ctx.is_main, device,
                            args.precision, scaler, accumulate, warmup)
        scheduler.step()
        if allreduces:
            allreduces.write(log, epoch, accumulate, micro_batch, len(train_loader))  # then from 0
        devices.synchronize(device)
        wall = time.perf_counter() - tick  # training only, as in the CPU baseline: the test set is not timed
        log.write("ranks", **distributed.per_rank(epoch, train, sampler))  # what each rank alone saw
        log.epoch(epoch, distributed.reduce(train),
                  distributed.reduce(evaluation.evaluate(model.module, test_loader, device, args.precision)), wall)
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
