"""Lesson 09, sharding (ZeRO and FSDP): the model's states split over the processes, not copied.

    torchrun --standalone --nproc-per-node 2 scripts/_trainup_fsdp.py --shard none,optimizer
    torchrun --standalone --nproc-per-node 4 scripts/_trainup_fsdp.py --resume-from RUN  # reshards
    python scripts/_trainup_fsdp.py --quick --shard none                 # the baseline: 1 process

Compared with _trainup_blocks.py: Adam, whose state ZeRO counts (--model: the CNN instead);
--shard, what is split over the ranks (trainup/parallel/sharding.py): `none` (DDP), `optimizer`
(ZeRO-1),
`gradients` (ZeRO-2 by hand), `gradients_fsdp` (as FSDP2 ships it), `parameters` (ZeRO-3), in
turn in one job; one step's bytes and collectives logged; DCP checkpoints, loaded by any size,
written by every rank at a stop too (SIGTERM or --stop-signal), which --resume continues exactly.
"""
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler

from trainup import (checkpoint, cli, data, distributed, evaluation, metrics, models, preempt,
                     profiling)
from trainup.parallel import compiled, sharding


def train_epoch(model, loader, optimizer, epoch, show_progress, device):
    model.train()
    meter = preempt.meter(loader)  # a resumed epoch goes on with the sums of the steps it had taken
    for x, y in metrics.progress(loader, f"epoch {epoch}", show_progress):
        x, y = x.to(device), y.to(device)
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()  # ZeRO-2/3: gradients reduce-scattered as they complete
        optimizer.step()  # ZeRO-1/2: this rank's slice updated, then shared; ZeRO-3: its shards
        optimizer.zero_grad()
        meter.add(loss, logits, y)
    return meter


def optimizer_for(model, device, args):
    # on its device, wrapped; FSDP2's options (--prefetch, --offload) from args
    model, optimizer = sharding.shard(model, args.shard, device, dict(lr=args.lr), args)
    inner = getattr(optimizer, "optimizer", optimizer)  # GradientShards steps an Adam of its own
    return model, optimizer, torch.optim.lr_scheduler.StepLR(inner, step_size=1, gamma=args.gamma)


def parse_args(argv=None):
    p = cli.parser(__doc__, lesson="fsdp", precisions=("32", "64", "bf16"),
                   models=("blocks",) + models.MODELS)  # lesson 06's block stack, or the CNN
    p.set_defaults(lr=1e-3, model="blocks")  # Adam's usual step
    sharding.add_flags(p)  # --shard, --blocks, --width, --resume-from, --compile, ...
    profiling.add_flag(p)  # --profile STEPS: a trace per rank, to see what overlaps
    cli.add_group(p, set_epoch=False)
    return sharding.check_flags(p, cli.parse(p, argv))


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    sharding.check_job(args, distributed.from_env().world_size)  # before anyone waits for anyone
    ctx = distributed.setup(args)
    stop = preempt.Stopper(args, preempt.TorchDistributed(ctx))  # all ranks stop at one step
    args = stop.args  # the run's name as the job settled it (rank 0's)
    device = ctx.device
    if args.threads:
        torch.set_num_threads(args.threads)
    train_set, test_set = data.load(args)
    for run, resume_from in sharding.runs(args):  # each --shard mode in turn, in this one job
        one_run(run, resume_from, ctx, device, train_set, test_set, stop)
    distributed.cleanup(ctx)


def one_run(args, resume_from, ctx, device, train_set, test_set, stop):
    """One run of one --shard mode: its own log and checkpoints, its model from the same seed."""
    torch.manual_seed(args.seed)  # every rank builds the same whole model
    with sharding.building(args, ctx):  # --meta-init: only rank 0 builds it in memory
        model = (models.BlockStack(train_set.shape, train_set.num_classes, args.blocks, args.width)
                 if args.model == "blocks" else models.build(args, train_set))
    compiled.blocks(model, args)  # --compile: each block, before fully_shard (lesson 09f)
    model, optimizer, scheduler = optimizer_for(model, device, args)
    start_epoch = sharding.load_sharded(resume_from, model, optimizer, scheduler, args)  # any size
    log = metrics.RunLog(args, __file__, device, ctx.world_size, ctx.backend, enabled=ctx.is_main)
    sharding.log_run(log, model, ctx, args, start_epoch)
    stop.watch(sharding.dcp_folder(args), log, model, optimizer, scheduler,  # every rank saves
               save=sharding.saver(args, model, optimizer, scheduler),
               saved=sharding.saved_position(resume_from))

    per_rank = args.batch_size // ctx.world_size
    sampler = DistributedSampler(train_set, ctx.world_size, ctx.rank, seed=args.seed)  # padded
    train_loader = DataLoader(train_set, batch_size=per_rank, sampler=sampler)
    test_loader = DataLoader(test_set, batch_sampler=sharding.test_batches(len(test_set), ctx))
    sharding.measure_step(log, model, optimizer, len(train_loader), args)  # bytes, collectives
    profiler = profiling.start(args, ctx.rank, device)
    for epoch in range(start_epoch, args.epochs + 1):
        tick = time.perf_counter()
        sampler.set_epoch(epoch)
        train = train_epoch(model, profiler.steps(stop.batches(train_loader, epoch)),
                            optimizer, epoch, args.show_progress and ctx.is_main, device)
        scheduler.step()
        wall = time.perf_counter() - tick
        test = evaluation.evaluate(model, test_loader, device)  # FSDP: as many forwards per rank
        log.epoch(epoch, distributed.reduce(train), distributed.reduce(test), wall)
        if args.shard in sharding.RESUMABLE:  # DCP: every rank writes its own shards
            sharding.save_sharded(sharding.dcp_folder(args), model, optimizer, scheduler, epoch,
                                  args)
        whole = sharding.full_state(model)  # gathered from the shards, on rank 0
        if ctx.is_main:  # one writer
            sharding.save_full(checkpoint.path_for(args), whole, epoch, args)
        stop.after_epoch(epoch)  # a stop asked for during evaluation
    profiler.stop()
    log.summary(checkpoint=checkpoint.path_for(args))


if __name__ == "__main__":
    main()
