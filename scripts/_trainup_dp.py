"""Lesson 03, every GPU of one machine: the one-GPU script with its model wrapped in nn.DataParallel.

    python scripts/_trainup_dp.py --quick                  # every visible GPU (the CPU where there is none)
    python scripts/_trainup_dp.py --gpus 2 --batch-size 256   # 2 GPUs, 128 samples each per step
    python scripts/_trainup_dp.py --gpus 2 --phases           # also time scatter, replicate, forward, gather

Compared with _trainup_gpu.py: --gpus instead of --device, and the model wrapped in nn.DataParallel,
which splits each global batch across the GPUs in one process (trainup/parallel/dataparallel.py
says how).
"""
import time

import torch
import torch.nn.functional as F
from torch import nn

from trainup import (UserError, checkpoint, cli, data, devices, evaluation, gpumon, metrics,
                     models, preempt, sweeps)
from trainup.parallel import dataparallel


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
    p = cli.parser(__doc__, lesson="dp", precisions=tuple(devices.PRECISIONS))
    p.add_argument("--gpus", type=cli.positive(int), default=None, help="how many GPUs (default: every visible one)")
    p.add_argument("--phases", action="store_true", help="after training, time each phase of a step (2+ GPUs)")
    cli.add_loading(p, device=None)  # DataParallel: the GPUs, or the CPU where there are none
    cli.add_sweep(p)
    args = cli.parse(p, argv)
    return args


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    stop = preempt.Stopper(args)  # SIGTERM or --stop-signal: finish the step, save where we are, exit 75
    args = stop.args  # the run's name as the job settled it (rank 0's)
    device, ids, sentence = dataparallel.choose(args.gpus)
    args = args.replace(gpus=len(ids))
    if args.phases and len(ids) < 2:
        raise UserError(f"--phases times how DataParallel splits a step across GPUs, so it needs 2 or more, "
                        f"and this run has {len(ids)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.workers is None:
        args = args.replace(workers=2 * len(ids))
    train_set, test_set = data.load(args)
    net = models.build(args, train_set).to(device)
    model = nn.DataParallel(dataparallel.Autocast(net, args.precision), device_ids=ids or None)  # no GPU: just calls it
    optimizer, scheduler = optimizer_for(model, args)
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "16")
    ckpt = checkpoint.path_for(args)
    start_epoch = checkpoint.load(ckpt, net, optimizer, scheduler, device, scaler) if args.resume else 1
    log = metrics.RunLog(args, __file__, device, backend="dataparallel" if ids else "none")
    log.flops(net, train_set)  # a sample's FLOPs, once: FLOP/s (and MFU) per epoch
    stop.watch(ckpt, log, net, optimizer, scheduler, scaler)  # what a stop saves; on --resume, the step to go on from
    monitor = gpumon.start(log.write, device, ids)  # every GPU's utilisation and memory; nothing on CPU
    print(sentence)
    if args.sweep:
        sweeps.run(args, model, train_set, device, log, train_epoch, optimizer_for)
        monitor.stop()
        log.summary()
        return

    sampler = data.ShuffleSampler(len(train_set), args.seed)
    train_loader = data.loader(train_set, args.batch_size, sampler, args, device)
    test_loader = data.loader(test_set, 1000, range(len(test_set)), args, device)
    for epoch in range(start_epoch, args.epochs + 1):
        tick = time.perf_counter()
        sampler.set_epoch(epoch)
        train = train_epoch(model, stop.batches(train_loader, epoch), optimizer, epoch, args.show_progress, device, args.precision, scaler)
        scheduler.step()
        devices.synchronize(device)
        wall = time.perf_counter() - tick  # training only, as in the CPU baseline: the test set is not timed
        log.epoch(epoch, train, evaluation.evaluate(model, test_loader, device, args.precision), wall)
        checkpoint.save(ckpt, net, optimizer, scheduler, epoch, args, scaler)  # the model, not its wrappers
        stop.after_epoch(epoch)  # a stop asked for during evaluation
    if args.phases:  # one more batch, with each phase of a DataParallel step timed apart
        x, y = (t.to(device) for t in next(iter(train_loader)))
        timed = dataparallel.time_phases(model.module, x, y, ids)  # the Autocast-wrapped net: --precision holds
        phases = log.write("dp_phases", gpus=len(ids), batch_size=len(y), **timed)
        print("one DataParallel step: " + ", ".join(f"{k[:-2]} {v * 1000:.2f} ms" for k, v in phases.items()
                                                    if k.endswith("_s")))
    monitor.stop()
    log.summary(checkpoint=ckpt)


if __name__ == "__main__":
    main()
