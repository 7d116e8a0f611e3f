"""Lesson 02, one GPU: the CPU baseline moved to one device, with what makes a GPU fast.

    python scripts/_trainup_gpu.py --quick                       # the GPU if there is one, else the CPU
    python scripts/_trainup_gpu.py --device cuda --workers 2 --precision bf16
    python scripts/_trainup_gpu.py --device cuda --resident      # the whole data set in GPU memory
    python scripts/_trainup_gpu.py --sweep 32,64,128,256,512     # throughput against batch size

Compared with _trainup_cpu.py: a device; DataLoader workers, pinned memory and non-blocking copies
so the GPU never waits for data; optionally the data resident on the GPU; mixed precision; a
batch-size sweep that finds where the GPU saturates; and the GPU's utilisation and memory, sampled
in the background into the run's log.
"""
import time

import torch
import torch.nn.functional as F

from trainup import (checkpoint, cli, data, devices, evaluation, gpumon, metrics, models, preempt,
                     profiling, sweeps)


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
    p = cli.parser(__doc__, lesson="gpu", precisions=tuple(devices.PRECISIONS))
    cli.add_loading(p)
    cli.add_sweep(p)
    profiling.add_flag(p)
    args = cli.parse(p, argv)
    return args


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    stop = preempt.Stopper(args)  # SIGTERM or --stop-signal: finish the step, save where we are, exit 75
    args = stop.args  # the run's name as the job settled it (rank 0's)
    device = devices.pick(args.device)
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
    log = metrics.RunLog(args, __file__, device)
    log.flops(model, train_set)  # a sample's FLOPs, once: FLOP/s (and MFU) per epoch
    stop.watch(ckpt, log, model, optimizer, scheduler, scaler)  # what a stop saves; on --resume, the step to go on from
    monitor = gpumon.start(log.write, device)  # GPU utilisation and memory in the background; nothing on CPU
    if args.sweep:
        sweeps.run(args, model, train_set, device, log, train_epoch, optimizer_for)
        monitor.stop()
        log.summary()
        return

    sampler = data.ShuffleSampler(len(train_set), args.seed)
    train_loader = data.loader(train_set, args.batch_size, sampler, args, device)
    test_loader = data.loader(test_set, 1000, range(len(test_set)), args, device)
    profiler = profiling.start(args, 0, device)  # --profile STEPS: a trace of a few steps
    for epoch in range(start_epoch, args.epochs + 1):
        tick = time.perf_counter()
        sampler.set_epoch(epoch)
        train = train_epoch(model, profiler.steps(stop.batches(train_loader, epoch)), optimizer, epoch, args.show_progress,
                            device, args.precision, scaler)
        scheduler.step()
        devices.synchronize(device)
        wall = time.perf_counter() - tick  # training only, as in the CPU baseline: the test set is not timed
        log.epoch(epoch, train, evaluation.evaluate(model, test_loader, device, args.precision), wall)
        checkpoint.save(ckpt, model, optimizer, scheduler, epoch, args, scaler)
        stop.after_epoch(epoch)  # a stop asked for during evaluation
    profiler.stop()
    monitor.stop()
    log.summary(checkpoint=ckpt)


if __name__ == "__main__":
    main()
