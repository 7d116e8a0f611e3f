"""Lesson 04c, Ray Train: the DDP lesson's training, with Ray starting the processes and restarting
them from its own checkpoints when one dies.

    python scripts/_trainup_ray.py --quick                    # 2 workers on a local Ray cluster
    python scripts/_trainup_ray.py --ray-workers 4 --max-failures 3   # 4 workers (one per GPU)
    python scripts/_trainup_ray.py --ray-workers 1 --quick    # one worker (world size 1)

Compared with _trainup_ddp.py: no launcher; this process is Ray's driver: it starts a Ray cluster
on this machine (trainup/engines/ray_run.py; stopped at the end) and hands train_loop to a
TorchTrainer,
which starts --ray-workers processes, joins them into the process group (gloo, nccl on GPUs) and
runs train_loop in each. The loop is the DDP lesson's, but every rank reports each epoch to Ray
(ray.train.report), rank 0's report carrying the checkpoint Ray keeps. When a worker dies, Ray
stops the others and starts all again (FailureConfig: --max-failures times); train_loop then finds
Ray's last checkpoint (ray.train.get_checkpoint) and goes on from the next epoch, its log appended.
SIGTERM or --stop-signal to the driver: the workers stop at one step, Ray records their checkpoint,
and the driver exits 75; --resume goes on from that step (ray_run.Stopper).
"""
import time

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from trainup import (checkpoint, cli, data, devices, distributed, evaluation, gpumon, metrics,
                     models, preempt, profiling)
from trainup.engines import ray_run
from trainup.engines.ray_run import ray  # import ray (None where it is not installed)


def train_epoch(model, loader, optimizer, epoch, show_progress, device, precision, scaler):
    model.train()
    meter = preempt.meter(loader)  # a resumed epoch goes on with the sums of the steps it had taken
    for x, y in metrics.progress(loader, f"epoch {epoch}", show_progress):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)  # async from pinned memory
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
    p = cli.parser(__doc__, lesson="ray", precisions=tuple(devices.PRECISIONS))
    cli.add_loading(p)
    ray_run.add_flags(p)
    profiling.add_flag(p)
    args = cli.parse(p, argv)
    return args


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    args, gpus = ray_run.check(args)  # Ray there, the batch splits: before Ray starts
    with ray_run.cluster(args, gpus):  # this machine alone, offline
        trainer = ray.train.torch.TorchTrainer(
            ray_run.stoppable(train_loop), train_loop_config={"args": args},
            scaling_config=ray.train.ScalingConfig(num_workers=args.ray_workers, use_gpu=gpus > 0),
            torch_config=ray.train.torch.TorchConfig(timeout_s=int(args.timeout)),
            run_config=ray.train.RunConfig(
                name=args.run_name, storage_path=ray_run.storage(args),
                failure_config=ray.train.FailureConfig(max_failures=args.max_failures),
                checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2)))
        result = ray_run.fit(trainer, args)  # stopped by a signal: exit 75
        ray_run.show_placement()  # what ran where: the workers' processes, the dead ones too
    print(f"Ray kept the last checkpoint in {result.checkpoint.path}")


def train_loop(config):
    """Every Ray worker runs this, in a process group Ray has already joined."""
    args = config["args"]
    ctx = ray_run.context(args)  # rank, world size and device from Ray
    stop = ray_run.Stopper(args, ctx)  # the driver's stop signal; all ranks stop at one step
    args = stop.args  # the run's name as the job settled it (rank 0's)
    device = ctx.device
    if args.workers is None:
        args = args.replace(workers=2 if device.type == "cuda" else 0)
    train_set, test_set = data.load(args)
    model = models.build(args, train_set).to(device)
    optimizer, scheduler = optimizer_for(model, args)
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "16")
    ckpt = checkpoint.path_for(args)
    # 1, or after a worker died, the epoch after Ray's last checkpoint
    args, start_epoch = ray_run.restore(args, ckpt, model, optimizer, scheduler, device, scaler)
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)  # all-reduces gradients
    log = metrics.RunLog(args, __file__, device, ctx.world_size, ctx.backend, enabled=ctx.is_main)
    log.flops(model.module, train_set)  # a sample's FLOPs, once: FLOP/s (and MFU) per epoch
    log.write("ddp", **distributed.describe(ctx, args))
    stop.watch(ckpt, log, model.module, optimizer, scheduler, scaler)  # what a stop saves
    # each node's first process watches that node's GPUs: every rank's
    monitor = gpumon.start_on_node(ctx, log, args)
    if start_epoch > 1 and ctx.is_main:
        print(f"resuming at epoch {start_epoch} from Ray's last checkpoint")

    sampler = DistributedSampler(train_set, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=args.seed)
    train_loader = data.loader(train_set, args.batch_size // ctx.world_size, sampler, args, device)
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
        log.write("ranks", **distributed.per_rank(epoch, train, sampler))  # what each rank alone saw
        test = evaluation.evaluate(model.module, test_loader, device, args.precision)
        record = log.epoch(epoch, distributed.reduce(train), distributed.reduce(test), wall)
        if ctx.is_main:  # one writer; the others would race for the same file
            checkpoint.save(ckpt, model.module, optimizer, scheduler, epoch, args, scaler)
        ray_run.report(record, ckpt, ctx)  # every rank; Ray keeps rank 0's checkpoint
    profiler.stop()
    monitor.stop()
    log.summary(checkpoint=ckpt)  # Ray leaves the process group when every worker has returned


if __name__ == "__main__":
    main()
