"""Lesson 05, Horovod: the DDP lesson's training, with Horovod's ring all-reduce instead of DDP's.

    horovodrun -np 2 -H localhost:2 --gloo python scripts/_trainup_horovod.py --quick   # 2 processes
    horovodrun -np 8 -H node1:4,node2:4 --gloo python scripts/_trainup_horovod.py      # 2 nodes (ssh)
    srun horovodrun -np 2 -H localhost:2 --gloo python scripts/_trainup_horovod.py     # in a SLURM job
    python scripts/_trainup_horovod.py --quick                                         # one process

Compared with _trainup_ddp.py: hvd.init() instead of a process group (horovodrun, or mpirun, tells each
process its rank); the device from hvd.local_rank(); the DistributedSampler sharded by hvd.rank() and
hvd.size(); the optimizer wrapped in hvd.DistributedOptimizer (it all-reduces and AVERAGES the gradients;
--fp16-allreduce halves what travels), instead of the model in DDP; parameters and optimizer state
broadcast from rank 0; metrics summed with hvd.allreduce. Horovod does not scale the learning rate by
itself: its docs tell you to multiply it by hvd.size() (with a warm-up); this script, like the DDP one,
keeps --batch-size GLOBAL and so keeps --lr as it is. No restarts: horovodrun is not elastic here.

Horovod is built from source for this course (tools/build_horovod.sh, part of tools/setup_env.sh).
"""
import time

import os
import socket
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DistributedSampler

from trainup import (UserError, checkpoint, cli, data, devices, distributed, evaluation, gpumon,
                     metrics, models, preempt, sweeps)

try:
    import horovod.torch as hvd
except ImportError as e:  # not built, or built against another torch
    hvd, HOROVOD_MISSING = None, str(e).splitlines()[0] if str(e) else "no module named horovod"


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
        optimizer.synchronize()  # wait for Horovod's all-reduces, so that the scaler unscales averaged gradients
        scaler.unscale_(optimizer)
        with optimizer.skip_synchronize():  # already synchronized: step() must not all-reduce again
            scaler.step(optimizer)
        scaler.update()
        meter.add(loss, logits, y)
    return meter


def optimizer_for(model, args):
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    # Its hooks all-reduce each gradient as soon as backward produces it; step() waits for them (average).
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Average)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)


def setup(args):
    """hvd.init(): rank, size and local rank come from horovodrun (or mpirun); the device from the local rank."""
    if hvd is None:
        raise UserError(f"Horovod is not installed in this Python ({HOROVOD_MISSING}); build and install it with "
                        f"tools/build_horovod.sh (a few minutes, once)")
    os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(int(args.timeout)))  # read by hvd.init()
    hvd.init()
    ctx = distributed.Context(rank=hvd.rank(), world_size=hvd.size(), local_rank=hvd.local_rank(),
                              local_world_size=hvd.local_size(), node_rank=hvd.cross_rank(), nnodes=hvd.cross_size(),
                              launcher="horovodrun" if "HOROVOD_RANK" in os.environ else
                              "mpirun" if hvd.mpi_enabled() else "python",
                              master_addr=os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1"),
                              master_port=int(os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT", 0)),
                              backend="horovod-" + ("mpi" if hvd.mpi_enabled() else "gloo"), timeout_s=args.timeout)
    if args.batch_size % ctx.world_size:
        raise UserError(f"--batch-size {args.batch_size} is the global batch and cannot be split evenly over "
                        f"{ctx.world_size} processes; use a multiple of {ctx.world_size}")
    ctx.device = devices.pick(gpu_ops(args.device), ctx.local_rank)
    return ctx


def gpu_ops(requested):
    """The device, where this Horovod can all-reduce on it: a build without NCCL moves only CPU tensors
    (on a CUDA tensor it stops with its own "not compiled with CUDA")."""
    if requested == "cpu" or hvd.nccl_built() or not torch.cuda.is_available():
        return requested
    build = "HOROVOD_GPU_OPERATIONS=NCCL tools/build_horovod.sh on this GPU machine"
    if requested == "cuda":
        raise UserError(f"--device cuda needs a Horovod built with NCCL, and this one all-reduces CPU tensors "
                        f"only: rebuild it with {build}, or use --device cpu")
    print(f"note: running on the CPU: this Horovod was built without NCCL ({build} builds one for GPUs)",
          file=sys.stderr)
    return "cpu"


def describe(ctx, args):
    """The 'ddp' log record (same fields as the DDP script's): how the job was started, where each rank runs."""
    me = dict(rank=ctx.rank, local_rank=ctx.local_rank, node_rank=ctx.node_rank, host=socket.gethostname(),
              device=str(ctx.device), pid=os.getpid())
    fields = {k: getattr(ctx, k) for k in ("launcher", "world_size", "local_world_size", "nnodes", "master_addr",
                                            "master_port", "restart_count", "backend", "timeout_s")}
    return dict(fields, per_rank_batch=args.batch_size // ctx.world_size, global_batch=args.batch_size,
                ranks=hvd.allgather_object(me))


def reduce(meter):
    """A Meter summed over every rank with hvd.allreduce: the whole job's loss, accuracy and samples."""
    return metrics.Meter.from_tensor(hvd.allreduce(meter.as_tensor(), op=hvd.Sum, name="meter"))


def per_rank(epoch, meter, sampler, first=8):
    """The 'ranks' record: each rank's own numbers and first sample indices, gathered with hvd.allgather."""
    t = torch.cat([meter.as_tensor(), torch.tensor(list(sampler)[:first], dtype=torch.float64)])
    parts = hvd.allgather(t.unsqueeze(0), name="ranks")
    meters = [metrics.Meter.from_tensor(p) for p in parts]
    return dict(epoch=epoch, rank=list(range(len(meters))), loss=[m.mean_loss for m in meters],
                accuracy=[m.accuracy for m in meters], samples=[m.samples for m in meters],
                first_indices=[p[3:].long().tolist() for p in parts])


def parse_args(argv=None):
    p = cli.parser(__doc__, lesson="horovod", precisions=tuple(devices.PRECISIONS))
    cli.add_loading(p)
    cli.add_sweep(p)
    p.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to float16 for the all-reduce")
    cli.add_group(p, backend=False)  # Horovod picks its own (gloo, MPI or NCCL)
    args = cli.parse(p, argv)
    return args


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    ctx = setup(args)  # hvd.init(); the device comes from hvd.local_rank()
    stop = preempt.Stopper(args, preempt.Horovod(hvd))  # rank 0's run name; all ranks stop at one step
    device = ctx.device
    if ctx.world_size > 1 and args.sweep and any(b % ctx.world_size for b in args.sweep):
        raise UserError(f"every --sweep batch size is global and must split evenly over {ctx.world_size} processes")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.workers is None:
        args.workers = 2 if device.type == "cuda" else 0
    train_set, test_set = data.load(args)
    model = models.build(args, train_set).to(device)
    optimizer, scheduler = optimizer_for(model, args)
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "16")
    ckpt = checkpoint.path_for(args)
    start_epoch = checkpoint.load(ckpt, model, optimizer, scheduler, device, scaler) if args.resume else 1
    # Every rank starts from rank 0's model and optimizer state, whatever it initialised or loaded itself.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    log = metrics.RunLog(args, __file__, device, ctx.world_size, ctx.backend, enabled=ctx.is_main)
    log.flops(model, train_set)  # a sample's FLOPs, once: FLOP/s (and MFU) per epoch
    log.write("ddp", **describe(ctx, args))
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

    sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=args.seed)
    train_loader = data.loader(train_set, args.batch_size // ctx.world_size, sampler, args, device)
    test_loader = data.loader(test_set, 1000, range(ctx.rank, len(test_set), ctx.world_size), args, device)
    for epoch in range(start_epoch, args.epochs + 1):
        tick = time.perf_counter()
        if not args.no_set_epoch:
            sampler.set_epoch(epoch)  # a new shuffle each epoch; forgotten, every epoch repeats the first
        train = train_epoch(model, stop.batches(train_loader, epoch), optimizer, epoch,
                            args.show_progress and ctx.is_main, device, args.precision, scaler)
        scheduler.step()
        devices.synchronize(device)
        wall = time.perf_counter() - tick  # training only, as in the CPU baseline: the test set is not timed
        log.write("ranks", **per_rank(epoch, train, sampler))  # what each rank alone saw
        log.epoch(epoch, reduce(train), reduce(evaluation.evaluate(model, test_loader, device, args.precision)), wall)
        if ctx.is_main:  # one writer; the others would race for the same file
            checkpoint.save(ckpt, model, optimizer, scheduler, epoch, args, scaler)
    monitor.stop()
    log.summary(checkpoint=ckpt)
    hvd.barrier()  # leave together, as the DDP script does
    hvd.shutdown()


if __name__ == "__main__":
    main()
