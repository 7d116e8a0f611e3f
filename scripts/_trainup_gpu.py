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
import itertools
import time

import torch
import torch.nn.functional as F

from trainup import checkpoint, cli, data, devices, gpumon, metrics, models, preempt, profiling


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


@torch.no_grad()
def evaluate(model, loader, device, precision):
    model.eval()
    meter = metrics.Meter()
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with devices.autocast(device, precision):
            logits = model(x)
        meter.add(F.cross_entropy(logits.float(), y), logits, y)  # the loss in fp32, as autocast computes it
    return meter


def optimizer_for(model, args):
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)


def sweep(args, model, train_set, device, log):
    """Train --sweep-steps steps at each batch size and log throughput: where does the GPU saturate?"""
    for batch_size in args.sweep:
        if batch_size > len(train_set):
            print(f"batch size {batch_size}: skipped, the data set holds only {len(train_set)} samples")
            continue
        optimizer, _ = optimizer_for(model, args)
        scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "16")
        sampler = data.ShuffleSampler(len(train_set), args.seed)
        batches = data.full_batches(data.loader(train_set, batch_size, sampler, args, device), batch_size)
        steps = args.sweep_steps
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)  # the peak of this batch size alone
        try:  # warm-up steps first: kernels chosen, memory allocated, loader workers started
            train_epoch(model, itertools.islice(batches, 2), optimizer, 0, False, device, args.precision, scaler)
            devices.synchronize(device)
            tick = time.perf_counter()  # batches load while the GPU computes, as in training
            train_epoch(model, itertools.islice(batches, steps), optimizer, 0, False, device, args.precision, scaler)
            devices.synchronize(device)
        except torch.cuda.OutOfMemoryError:
            print(f"batch size {batch_size}: out of GPU memory, so the sweep stops here")
            break
        seconds = time.perf_counter() - tick
        line = log.write("sweep", batch_size=batch_size, steps=steps, step_s=seconds / steps,
                         samples_per_s=steps * batch_size / seconds, peak_mem_mb=metrics.peak_memory_mb(device))
        print(f"batch size {batch_size}: {line['samples_per_s']:.0f} samples/s")


def parse_args(argv=None):
    p = cli.parser(__doc__, lesson="gpu", precisions=tuple(devices.PRECISIONS))
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--workers", type=int, default=None, help="DataLoader worker processes (2 per GPU to start)")
    p.add_argument("--no-pin-memory", action="store_true", help="copy batches from pageable memory (slower)")
    p.add_argument("--resident", action="store_true", help="keep the whole data set in GPU memory")
    p.add_argument("--sweep", default=None, help="comma-separated batch sizes: measure throughput only")
    p.add_argument("--sweep-steps", type=cli.positive(int), default=20, help="timed steps per batch size")
    profiling.add_flag(p)
    args = cli.parse(p, argv)
    if args.workers is not None and args.workers < 0:
        p.error(f"--workers must be 0 or more, got {args.workers}")
    if args.resident and args.dataset == "synthetic":
        p.error("--resident needs a data set held in memory (digits, mnist, cifar10); synthetic images are made on the fly")
    if args.sweep:
        try:
            args.sweep = [int(b) for b in args.sweep.split(",")]
            assert min(args.sweep) > 0
        except (ValueError, AssertionError):
            p.error(f"--sweep takes batch sizes like 32,64,128, got {args.sweep!r}")
    args.show_progress = not args.no_progress
    return args


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    stop = preempt.Stopper(args)  # SIGTERM or --stop-signal: finish the step, save where we are, exit 75
    device = devices.pick(args.device)
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
    log = metrics.RunLog(args, __file__, device)
    stop.watch(ckpt, log, model, optimizer, scheduler, scaler)  # what a stop saves; on --resume, the step to go on from
    monitor = gpumon.start(log.write, device)  # GPU utilisation and memory in the background; nothing on CPU
    if args.sweep:
        sweep(args, model, train_set, device, log)
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
        log.epoch(epoch, train, evaluate(model, test_loader, device, args.precision), wall)
        checkpoint.save(ckpt, model, optimizer, scheduler, epoch, args, scaler)
    profiler.stop()
    monitor.stop()
    log.summary(checkpoint=ckpt)


if __name__ == "__main__":
    main()
