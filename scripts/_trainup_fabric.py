"""Lesson 07, Lightning Fabric: lesson 04's loop kept whole, Fabric doing its distributed parts.

    torchrun --standalone --nproc-per-node 2 scripts/_trainup_fabric.py --quick  # 2 processes
    python scripts/_trainup_fabric.py --quick --accelerator cpu --devices 2      # Fabric starts 2
    srun python scripts/_trainup_fabric.py         # one SLURM task per process
    python scripts/_trainup_fabric.py --quick      # one process (world size 1)

Compared with _trainup_ddp.py: Fabric joins the group (--accelerator, --devices, --num-nodes,
--strategy, or torchrun's and SLURM's variables), wraps the model in DDP (fabric.setup), puts a
DistributedSampler in the loader and moves its batches to the device (setup_dataloaders), and
applies --precision in the forward and in fabric.backward (autocast and the GradScaler are its);
fabric.all_reduce sums the metrics. The loop, the log, the checkpoint, the stop signal and
--profile stay the course's; sweeps and GPU statistics stay with lesson 04: from here the Trainer
(_trainup_lightning.py, which takes the loop itself) has its own.
"""
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from trainup import (checkpoint, cli, data, devices, distributed, evaluation, metrics, models,
                     preempt, profiling)
from trainup.engines import fabric_run, lightning_flags


def train_epoch(model, loader, optimizer, epoch, show_progress, fabric):
    model.train()
    meter = preempt.meter(loader)  # a resumed epoch goes on with the sums of the steps it had taken
    for x, y in metrics.progress(loader, f"epoch {epoch}", show_progress):  # on the device already
        optimizer.zero_grad()
        logits = model(x)  # under --precision's autocast
        loss = F.cross_entropy(logits, y)
        fabric.backward(loss)  # fp16: the loss scaled, as lesson 04's GradScaler did
        optimizer.step()
        meter.add(loss, logits, y)
    return meter


def reduce(fabric, meter):  # the sums of every rank's meter
    return metrics.Meter.from_tensor(fabric.all_reduce(meter.as_tensor(), reduce_op="sum").cpu())


def optimizer_for(model, args):
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)


def parse_args(argv=None):
    p = cli.parser(__doc__, lesson="fabric", precisions=tuple(devices.PRECISIONS))
    cli.add_loading(p, device=None, resident=False)  # the device: Fabric's --accelerator
    lightning_flags.add_launch(p.add_argument_group("Fabric's"))
    profiling.add_flag(p)
    args = cli.parse(p, argv)
    return args


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    fabric = fabric_run.make(args)  # from --accelerator, --devices, --num-nodes, --strategy...
    per_rank = distributed.per_rank_batch(args.batch_size, fabric.world_size)  # or one sentence
    fabric.launch()  # --devices 2 starts the other process; under torchrun or srun: joins
    # the ranks agree on a stop's step through the group Fabric joined
    stop = preempt.Stopper(args, preempt.TorchDistributed(fabric_run.context(fabric)))
    args = stop.args  # the run's name as the job settled it (rank 0's)
    device = fabric.device
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.workers is None:
        args = args.replace(workers=2 if device.type == "cuda" else 0)
    train_set, test_set = data.load(args)
    model = models.build(args, train_set).to(device)
    optimizer, scheduler = optimizer_for(model, args)
    scaler = fabric_run.scaler(fabric)  # Fabric's, under --precision 16
    ckpt = checkpoint.path_for(args)
    start_epoch = checkpoint.load(ckpt, model, optimizer, scheduler, device, scaler) if args.resume else 1
    # Fabric's loader calls its sampler's set_epoch itself, counting passes from 0: seeded with
    # seed + the first epoch, it shuffles as lesson 04's (seed + epoch), a resumed run too
    fabric.seed_everything(args.seed + start_epoch, verbose=False)
    model, optimizer = fabric.setup(model, optimizer)  # in DDP where the strategy is distributed
    log = metrics.RunLog(args, __file__, device, fabric.world_size, fabric_run.backend(fabric),
                         enabled=fabric.is_global_zero)
    log.flops(model.module, train_set)  # a sample's FLOPs, once: FLOP/s (and MFU) per epoch
    stop.watch(ckpt, log, model.module, optimizer, scheduler, scaler)  # what a stop saves, rank 0 writes

    train_loader = fabric.setup_dataloaders(  # a DistributedSampler put in; batches to device
        DataLoader(train_set, per_rank, shuffle=True, num_workers=args.workers,
                   multiprocessing_context=data.worker_start() if args.workers else None,
                   pin_memory=device.type == "cuda" and not args.no_pin_memory))
    # the test set in the course's shares: Fabric's sampler would pad it to equal ones, counting
    # some samples twice
    test_loader = fabric.setup_dataloaders(DataLoader(
        test_set, 1000, sampler=range(fabric.global_rank, len(test_set), fabric.world_size)),
        use_distributed_sampler=False)
    log.write("fabric", **fabric_run.describe(fabric, train_loader))
    profiler = profiling.start(args, fabric.global_rank, device)  # --profile STEPS: a trace
    for epoch in range(start_epoch, args.epochs + 1):
        tick = time.perf_counter()
        train = train_epoch(model, profiler.steps(stop.batches(train_loader, epoch)),
                            optimizer, epoch, args.show_progress and fabric.is_global_zero, fabric)
        scheduler.step()
        devices.synchronize(device)
        wall = time.perf_counter() - tick  # training only, as in the CPU baseline: the test set is not timed
        log.epoch(epoch, reduce(fabric, train),
                  reduce(fabric, evaluation.evaluate(model.module, test_loader, device, args.precision)), wall)
        if fabric.is_global_zero:  # one writer; the others would race for the same file
            checkpoint.save(ckpt, model.module, optimizer, scheduler, epoch, args, scaler)
        stop.after_epoch(epoch)  # a stop asked for during evaluation
    profiler.stop()
    log.summary(checkpoint=ckpt)
    fabric_run.leave(fabric)  # a barrier, then destroy_process_group()


if __name__ == "__main__":
    main()
