"""Lesson 04, inside DDP: the collectives it is built on, how fast all_reduce is, what DDP does with them,
and what a mistake looks like. Run it under torchrun with 2 or more processes (gloo on CPU):

    torchrun --standalone --nproc-per-node 2 scripts/_trainup_collectives.py --show collectives
    torchrun ... scripts/_trainup_collectives.py --show bandwidth --sizes 1K,64K,1M,16M,64M
    torchrun ... --show bandwidth --ops all_reduce,broadcast,all_gather,reduce_scatter  # each op
    torchrun ... scripts/_trainup_collectives.py --show ddp       # construction broadcast, gradient buckets
    TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun ... --show mismatch   # ranks disagree on a tensor's shape
    torchrun ... scripts/_trainup_collectives.py --show hang --timeout 5   # a rank skips a collective

Rank 0 gathers every rank's tensors and writes them to logs/<run>.jsonl (records collective,
allreduce_bw, collective_bw, ddp_broadcast, ddp_buckets, ddp_step, bn_stats: logs/README.md), so the output is in rank order.
"""
import argparse
import datetime
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from trainup import LOG_DIR, UserError, cli, distributed, metrics, models, runlock
from trainup.parallel.sharding import all_gather_single, reduce_scatter_single

SHOWS = ("collectives", "bandwidth", "ddp", "mismatch", "hang")
UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}


def size_bytes(text):
    text = text.strip().upper().rstrip("B")
    return int(float(text[:-1]) * UNITS[text[-1]]) if text[-1:] in UNITS else int(text)


def gather(value):
    """Every rank's value, in rank order (all_gather_object: any picklable value)."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def show_collectives(log, rank, world):
    """Each collective once, with every rank's tensors before and after it."""
    def record(op, before, after, how):
        before, after = gather(before), gather(after)
        log.write("collective", op=op, how=how, world_size=world, before=before, after=after)
        if rank == 0:
            print(f"{op} ({how}):")
            for r in range(world):
                print(f"  rank {r}: before {before[r]}  after {after[r]}")

    t = torch.full((2,), float(rank + 1))
    before = t.tolist()
    dist.broadcast(t, src=0)  # everyone gets rank 0's tensor
    record("broadcast", before, t.tolist(), "dist.broadcast(src=0)")

    t = torch.tensor([rank + 1.0, 10.0 * (rank + 1)])
    before = t.tolist()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)  # everyone gets the sum
    record("all_reduce", before, t.tolist(), "dist.all_reduce(SUM)")

    t = torch.tensor([rank + 1.0, 10.0 * (rank + 1)])
    parts = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(parts, t)  # everyone gets every rank's tensor
    record("all_gather", t.tolist(), [p.tolist() for p in parts], "dist.all_gather")

    # reduce_scatter: rank j ends with the sum over ranks of chunk j; a chunk of 2 values per rank
    full = torch.arange(2.0 * world) + 100 * rank
    out = torch.zeros(2)
    try:
        dist.reduce_scatter(out, list(full.clone().chunk(world)))
        how = "dist.reduce_scatter"
    except (RuntimeError, NotImplementedError) as e:  # a backend without it: all_reduce, keep my slice
        summed = full.clone()
        dist.all_reduce(summed)
        out = summed.chunk(world)[rank].clone()
        how = f"all_reduce + slicing (dist.reduce_scatter failed: {str(e).splitlines()[0][:120]})"
    record("reduce_scatter", full.tolist(), out.tolist(), how)


# nccl-tests' bus bandwidth: the bytes one rank's link carries, over the size (PERFORMANCE.md there)
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}
OPS = tuple(BUS_FACTOR)


def timed_call(op, size, world):
    """(one call of op, its size in bytes) on float32 buffers, as the sharding script calls it: the
    size is the whole buffer (an all-gather's output, a reduce-scatter's input), so a multiple of
    the ranks for those two."""
    n = max(size // 4, 1)
    if op == "all_reduce":
        t = torch.ones(n)
        return lambda: dist.all_reduce(t), n * 4
    if op == "broadcast":
        t = torch.ones(n)
        return lambda: dist.broadcast(t, src=0), n * 4
    n = max(n // world, 1) * world
    whole, mine = torch.ones(n), torch.ones(n // world)
    if op == "all_gather":
        return lambda: all_gather_single(whole, mine), n * 4
    return lambda: reduce_scatter_single(mine, whole), n * 4


def show_bandwidth(log, rank, world, sizes, ops=("all_reduce",), rounds=1):
    """Each op's time against message size; bandwidths as nccl-tests defines them. all_reduce's
    records are allreduce_bw (lesson 04a1), the others' collective_bw (lesson 11 fits each op).
    rounds: the whole sweep this many times over, each size's time their mean: on a shared
    machine a call's latency changes from one second to the next (threads woken on busy cores),
    and one pass catches one moment."""
    timed = {}
    for _ in range(rounds):
        for op in ops:
            for size in sizes:
                call, size_bytes = timed_call(op, size, world)
                repeats = 20 if size <= 2**20 else 5
                for _ in range(2):  # warm-up: connections, buffers
                    call()
                dist.barrier()
                tick = time.perf_counter()
                for _ in range(repeats):
                    call()
                mine = torch.tensor([(time.perf_counter() - tick) / repeats])
                dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # as slow as its slowest rank
                timed.setdefault((op, size), []).append((float(mine), size_bytes, repeats))
    for op in ops:
        bus = BUS_FACTOR[op](world)
        if rank == 0 and len(ops) > 1:
            print(f"{op}:")
        for size in sizes:
            seconds = sum(t for t, _, _ in timed[op, size]) / rounds
            _, size_bytes, repeats = timed[op, size][0]
            repeats *= rounds
            algbw = size_bytes / seconds / 1e9
            if op == "all_reduce":
                line = log.write("allreduce_bw", size_bytes=size_bytes, world_size=world,
                                 repeats=repeats, time_s=seconds, algbw_gbps=algbw,
                                 busbw_gbps=algbw * bus, ring_factor=bus)
            else:
                line = log.write("collective_bw", op=op, size_bytes=size_bytes, world_size=world,
                                 repeats=repeats, time_s=seconds, algbw_gbps=algbw,
                                 busbw_gbps=algbw * bus, bus_factor=bus)
            if rank == 0:
                print(f"{size_bytes:>10} bytes  {seconds * 1e3:8.3f} ms  algbw {algbw:7.3f} GB/s  "
                      f"busbw {line['busbw_gbps']:7.3f} GB/s")


def fingerprint(module):
    """Sums of the parameters and of the buffers: two numbers that differ when the models differ."""
    return [float(sum(p.detach().double().sum() for p in module.parameters())),
            float(sum(b.double().sum() for b in module.buffers() if b.is_floating_point()))]


def shape_args(seed):
    from types import SimpleNamespace
    return SimpleNamespace(model="cnn_bn", seed=seed, dropout=0.0), SimpleNamespace(shape=(1, 28, 28), num_classes=10)


def show_ddp(log, rank, world, seed):
    # 1. Construction: ranks built from different seeds, then wrapped; DDP broadcasts rank 0's state.
    model = models.build(*shape_args(seed + rank))
    model(torch.randn(8, 1, 28, 28, generator=torch.Generator().manual_seed(rank)))  # BN stats differ too
    before = gather(fingerprint(model))
    ddp = DDP(model)
    after = gather(fingerprint(ddp.module))
    log.write("ddp_broadcast", world_size=world, params_before=[b[0] for b in before],
              params_after=[a[0] for a in after], buffers_before=[b[1] for b in before],
              buffers_after=[a[1] for a in after])

    # 2. Backward: buckets of gradients, each all-reduced as soon as its gradients are ready.
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(8 * world, 1, 28, 28, generator=g), torch.randint(0, 10, (8 * world,), generator=g)
    mine = slice(rank * 8, (rank + 1) * 8)  # each rank its own 8 samples
    for cap in (25.0, 1.0, 0.05):
        model = DDP(models.build(*shape_args(seed)), bucket_cap_mb=cap)
        events = []
        for name, p in model.module.named_parameters():  # a parameter's gradient is final
            p.register_post_accumulate_grad_hook(lambda p, name=name: events.append(("grad", name)))

        def counting(state, bucket):  # DDP's own all-reduce (mean), counted
            events.append(("allreduce", bucket.buffer().numel() * 4))
            return _allreduce_mean(bucket)
        model.register_comm_hook(None, counting)
        times = []
        for step in range(3):  # DDP re-orders its buckets after the first step (the order gradients came)
            events.clear()
            tick = time.perf_counter()
            F.cross_entropy(model(x[mine]), y[mine]).backward()
            times.append(time.perf_counter() - tick)
            model.zero_grad()
        last_grad = max(i for i, e in enumerate(events) if e[0] == "grad")
        sizes = [e[1] for e in events if e[0] == "allreduce"]
        early = sum(1 for i, e in enumerate(events) if e[0] == "allreduce" and i < last_grad)
        line = log.write("ddp_buckets", bucket_cap_mb=cap, buckets=len(sizes), bucket_mb=[s / 2**20 for s in sizes],
                         allreduce_calls=len(sizes), before_backward_end=early, parameters=sum(
                             1 for _ in model.parameters()), step_s=statistics.median(times[1:]))
        if rank == 0:
            print(f"bucket_cap_mb {cap}: {line['buckets']} bucket(s) of "
                  f"{', '.join(f'{m * 1024:.1f}' for m in line['bucket_mb'])} KiB; {early} all-reduce(s) launched "
                  f"before backward had computed its last gradient")

    # 3. The optimizer: every rank steps its own copy, with the same averaged gradients.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = gather(fingerprint(model.module)[0])
    F.cross_entropy(model(x[mine]), y[mine]).backward()
    optimizer.step()
    log.write("ddp_step", world_size=world, params_before=before, params_after=gather(fingerprint(model.module)[0]))

    # 4. BatchNorm: each rank normalises with its own half-batch statistics; SyncBatchNorm's sums.
    model = DDP(models.build(*shape_args(seed)))
    model(x[mine])
    running = gather(model.module.bn1.running_mean.tolist())
    h = model.module.conv1(x[mine]).detach()  # what bn1 normalises on this rank
    stats = torch.stack([h.sum((0, 2, 3)), (h * h).sum((0, 2, 3))]).double()
    count = torch.tensor([h.numel() / h.shape[1]], dtype=torch.float64)
    local_mean = stats[0] / count
    dist.all_reduce(stats), dist.all_reduce(count)  # what SyncBatchNorm adds up over the ranks
    full = model.module.conv1(x).detach().double().mean((0, 2, 3))  # the whole batch, as one process sees it
    diffs = gather([float((local_mean - full).abs().max()), float((stats[0] / count - full).abs().max())])
    log.write("bn_stats", world_size=world, running_mean_rank_diff=max(
        abs(a - b) for a, b in zip(running[0], running[-1])),
        local_mean_vs_full=[d[0] for d in diffs], allreduced_mean_vs_full=[d[1] for d in diffs])


def _allreduce_mean(bucket):
    t = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0])


def show_mismatch(rank):
    """Rank 1 all-reduces a tensor one element shorter than the others'."""
    t = torch.ones(4 if rank != 1 else 3)
    dist.all_reduce(t)
    print(f"rank {rank}: all_reduce returned {t.tolist()}")


def show_hang(rank, timeout):
    """Rank 1 skips an all_reduce and stays busy; the others wait for it until the timeout."""
    group = dist.new_group(timeout=datetime.timedelta(seconds=timeout))  # a short timeout for this group only
    if rank == 1:
        time.sleep(3 * timeout + 30)  # torchrun ends it when rank 0 fails
    else:
        dist.all_reduce(torch.ones(4), group=group)


def parse_args(argv=None):
    p = cli.Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--show", default="collectives",
                   help=f"what to show, one or several comma-separated: {', '.join(SHOWS)}")
    p.add_argument("--sizes", default="1K,4K,16K,64K,256K,1M,4M,16M,64M",
                   help="--show bandwidth: message sizes (bytes)")
    p.add_argument("--ops", default="all_reduce",
                   help=f"--show bandwidth: the collectives timed, comma-separated: {', '.join(OPS)}")
    p.add_argument("--rounds", type=cli.positive(int), default=1,
                   help="--show bandwidth: the sweep this many times over, each size's mean")
    p.add_argument("--timeout", type=cli.positive(float), default=300,
                   help="--show hang: seconds rank 0 waits in the collective rank 1 skips (the others: at least 120)")
    p.add_argument("--seed", type=cli.seed, default=1)
    p.add_argument("--run-name", default=None)
    p.add_argument("--log-dir", default=str(LOG_DIR))
    p.add_argument("--quick", action="store_true", help="sizes up to 4 MB only")
    p.add_argument("--no-progress", action="store_true", help="(accepted like every lesson script)")
    args = p.parse_args(argv)
    show = tuple(args.show.split(","))
    if not set(show) <= set(SHOWS):
        p.error(f"--show takes {', '.join(SHOWS)}, got {','.join(show)!r}")
    if len(show) > 1 and set(show) & {"mismatch", "hang"}:
        p.error("--show mismatch and --show hang fail on purpose: run each alone")
    try:
        sizes = [size_bytes(s) for s in args.sizes.split(",")]
        assert min(sizes) > 0
    except (ValueError, AssertionError, IndexError):
        p.error(f"--sizes takes sizes like 1K,64K,1M, got {args.sizes!r}")
    ops = tuple(args.ops.split(","))
    if not set(ops) <= set(OPS):
        p.error(f"--ops takes {', '.join(OPS)}, got {','.join(ops)!r}")
    if args.quick:
        sizes = [s for s in sizes if s <= 4 * 2**20] or sizes[:1]
    # a plain name inside --log-dir (never ../ or an absolute path); by default with host and pid
    # (rank 0 logs); the run's name and --log-dir checked as every script's (trainup/config.py)
    run_name = args.run_name or runlock.default_name("collectives")
    values = dict(vars(args), show=show, sizes=tuple(sizes), ops=ops, run_name=run_name)
    return cli.build(p, dict(values, lesson="ddp", resume=False), concerns=("output",))


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    ctx = distributed.from_env()
    if ctx.world_size < 2:
        raise UserError("collectives need 2 or more processes: run it under torchrun --nproc-per-node 2 "
                        "(or srun -n 2)")
    # srun sets no MASTER_ADDR or MASTER_PORT: env:// finds those the launcher's variables give
    os.environ.setdefault("MASTER_ADDR", ctx.master_addr)
    os.environ.setdefault("MASTER_PORT", str(ctx.master_port))
    # joining may take long on a loaded machine: a short --timeout applies to the collectives only (hang)
    dist.init_process_group("gloo", rank=ctx.rank, world_size=ctx.world_size,
                            timeout=datetime.timedelta(seconds=max(args.timeout, 120)))
    rank, world = ctx.rank, ctx.world_size
    torch.set_num_threads(1)
    if args.show[0] in ("mismatch", "hang"):  # these fail on purpose: nothing to log, no goodbye
        show_mismatch(rank) if args.show[0] == "mismatch" else show_hang(rank, args.timeout)
        return
    else:
        log = metrics.RunLog(args, __file__, "cpu", world, "gloo", enabled=rank == 0)
        for show in args.show:
            if show == "collectives":
                show_collectives(log, rank, world)
            elif show == "bandwidth":
                show_bandwidth(log, rank, world, args.sizes, args.ops, args.rounds)
            else:
                show_ddp(log, rank, world, args.seed)
        log.summary()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
