"""Lesson 01, Hogwild: the CPU baseline's model trained by several processes at once.

    python scripts/_trainup_hogwild.py --quick
    python scripts/_trainup_hogwild.py --num-processes 2 --threads 1    # 2 processes, 1 model

N worker processes train one model in shared memory, each on its share of the data, without locks
(Hogwild, as in pytorch/examples' mnist_hogwild). Compared with _trainup_cpu.py: the workers.
"""
import atexit
import os
import queue
import time

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.utils.data import DataLoader

from trainup import (UserError, checkpoint, cli, data, evaluation, metrics, models, preempt,
                     profiling)


def train_epoch(model, loader, optimizer, epoch, show_progress):
    model.train()
    meter = preempt.meter(loader)  # a resumed epoch goes on with the sums of the steps it had taken
    for x, y in metrics.progress(loader, f"epoch {epoch}", show_progress):
        optimizer.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        optimizer.step()
        meter.add(loss, logits, y)
    return meter


def optimizer_for(model, args):
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)


def hogwild_worker(rank, args, model, train_set, start_epoch, results, go, parent):
    """One of N processes: trains the shared model on every N-th sample, then waits for the next
    epoch."""
    # a stop signal is for the main process: it ends the workers between epochs
    preempt.leave_to_main(args)
    torch.set_num_threads(args.threads)
    sampler = data.ShuffleSampler(len(train_set), args.seed, rank, args.num_processes)
    batch = args.batch_size // args.num_processes
    loader = DataLoader(train_set, batch_size=batch, sampler=sampler)
    optimizer, scheduler = optimizer_for(model, args)
    for _ in range(1, start_epoch):
        scheduler.step()
    results.put((rank, None))  # ready: the epoch's clock starts once every worker is
    for epoch in range(start_epoch, args.epochs + 1):
        # the main process evaluates and logs between epochs
        if preempt.next_epoch(go, parent) is None:
            return
        sampler.set_epoch(epoch)
        show = rank == 0 and args.show_progress
        results.put((rank, train_epoch(model, loader, optimizer, epoch, show)))
        scheduler.step()


def hogwild_epochs(args, model, train_set, start_epoch):
    """Start the workers; yield (epoch, combined train Meter, seconds) as all workers finish an
    epoch."""
    model.share_memory()
    ctx = mp.get_context("spawn")  # fork is unsafe once torch has started its thread pools
    results, go = ctx.Queue(), ctx.Queue()
    workers = [ctx.Process(target=hogwild_worker, daemon=True,
                           args=(rank, args, model, train_set, start_epoch, results, go,
                                 os.getpid()))
               for rank in range(args.num_processes)]
    for w in workers:
        w.start()

    def gather():
        meters = []
        while len(meters) < len(workers):  # wait, but notice a worker that died instead of hanging
            try:
                meters.append(results.get(timeout=1)[1])
            except queue.Empty:
                dead = [w for w in workers if w.exitcode not in (None, 0)]
                if dead:
                    raise UserError(f"a worker process exited with status {dead[0].exitcode}")
        return meters

    def end():  # the workers ignore SIGTERM (a stop is the main process's), so they are told to end
        if not any(w.is_alive() for w in workers):
            return
        for w in workers:
            go.put(None)
        for w in workers:
            w.join(timeout=10)
            if w.is_alive():
                w.kill()
    # also at exit after a stop: before multiprocessing's own exit handler, which would wait
    atexit.register(end)
    try:
        gather()  # every worker has started
        for epoch in range(start_epoch, args.epochs + 1):
            tick = time.perf_counter()
            for _ in workers:
                go.put(epoch)
            total = sum(m.as_tensor() for m in gather())
            yield epoch, metrics.Meter.from_tensor(total), time.perf_counter() - tick
    finally:
        atexit.unregister(end)
        end()


def parse_args(argv=None):
    p = cli.parser(__doc__, lesson="cpu")
    p.add_argument("--num-processes", type=cli.positive(int), default=2,
                   help="worker processes training one shared model")
    profiling.add_flag(p)
    args = cli.parse(p, argv)
    if args.batch_size < args.num_processes:
        p.error(f"--batch-size {args.batch_size} cannot be split across {args.num_processes} "
                "processes")
    args.threads = args.threads or max(1, (os.cpu_count() or 1) // args.num_processes)
    return args


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    stop = preempt.Stopper(args)  # SIGTERM or --stop-signal: finish the step, save where we are, exit 75
    torch.set_num_threads(args.threads)
    profiler = profiling.start(args)  # --profile STEPS: a trace of a few steps
    train_set, test_set = data.load(args)
    test_loader = DataLoader(test_set, batch_size=1000)
    model = models.build(args, train_set)
    optimizer, scheduler = optimizer_for(model, args)
    ckpt = checkpoint.path_for(args)
    start_epoch = checkpoint.load(ckpt, model, optimizer, scheduler) if args.resume else 1
    log = metrics.RunLog(args, __file__, "cpu", world_size=args.num_processes, backend="hogwild")
    log.flops(model, train_set)  # a sample's FLOPs, once: FLOP/s (and MFU) per epoch
    stop.watch(ckpt, log, model, optimizer, scheduler)  # what a stop saves; on --resume, the step to go on from

    # each worker steps its own optimizer and learning-rate schedule
    for epoch, train, wall in hogwild_epochs(args, model, train_set, start_epoch):
        log.epoch(epoch, train, evaluation.evaluate(model, test_loader), wall)
        checkpoint.save(ckpt, model, optimizer, scheduler, epoch, args)
        stop.after_epoch(epoch)  # a stop asked for during evaluation, or from this epoch's end
    profiler.stop()
    log.summary(checkpoint=ckpt)


if __name__ == "__main__":
    main()
