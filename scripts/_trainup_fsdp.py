"""Lesson 09, sharding (ZeRO and FSDP): the model's states split over the processes instead of copied.

    torchrun --standalone --nproc-per-node 2 scripts/_trainup_fsdp.py --quick --shard parameters   # FSDP2 (ZeRO-3)
    torchrun --standalone --nproc-per-node 2 scripts/_trainup_fsdp.py --shard none,optimizer,gradients,parameters
    torchrun --standalone --nproc-per-node 4 scripts/_trainup_fsdp.py --resume-from RUN  # saved by 2: reshards
    python scripts/_trainup_fsdp.py --quick --shard none     # the baseline: one process

Compared with _trainup_blocks.py: the optimizer is Adam, whose state the ZeRO papers count (and
--model picks the course's CNN instead of the block stack); --shard picks what is split over
the ranks instead of replicated (trainup/sharding.py): `none` (DDP), `optimizer` (ZeRO-1,
ZeroRedundancyOptimizer), `gradients` (ZeRO-2: gradients reduce-scattered, each rank keeps its slice)
or `parameters` (ZeRO-3: fully_shard per block and on the whole model); several modes, comma-separated,
run one after another in the same job. A step measures what each rank holds and the collectives it
runs; checkpoints are sharded (torch.distributed.checkpoint) and load into a job of another size.
"""
import argparse
import contextlib
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler

from trainup import (UserError, checkpoint, cli, data, distributed, evaluation, metrics, models,
                     sharding)


def train_epoch(model, loader, optimizer, epoch, show_progress, device, measure=None):
    model.train()
    meter = metrics.Meter()
    for i, (x, y) in enumerate(metrics.progress(loader, f"epoch {epoch}", show_progress)):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        counting = measure is not None and i == min(1, len(loader) - 1)  # a step after the first (DDP's buckets set)
        collectives = sharding.Collectives() if counting else None
        with collectives or contextlib.nullcontext():
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            loss.backward()  # ZeRO-2/3: gradients reduce-scattered as they complete
            optimizer.step()  # ZeRO-1/2: this rank's slice updated, then shared; ZeRO-3: the local shards
        if counting:
            measure(sharding.held(model, optimizer), collectives.record())  # gradients still held
        optimizer.zero_grad()
        meter.add(loss, logits, y)
    return meter


def optimizer_args(args):
    return dict(lr=args.lr)


def scheduler_for(optimizer, args):
    inner = getattr(optimizer, "optimizer", optimizer)  # GradientShards steps an Adam of its own
    return torch.optim.lr_scheduler.StepLR(inner, step_size=1, gamma=args.gamma)


def parse_args(argv=None):
    # the block stack of lesson 06 beside the course's models
    p = cli.parser(__doc__, lesson="fsdp", precisions=("32", "64", "bf16"), models=("blocks",) + models.MODELS)
    p.set_defaults(lr=1e-3, model="blocks")  # Adam's usual step
    p.add_argument("--shard", default="parameters",
                   help="what is split over the ranks, or several comma-separated: " + ", ".join(sharding.MODES))
    p.add_argument("--blocks", type=cli.positive(int), default=8,
                   help="identical blocks in the model")
    p.add_argument("--width", type=cli.positive(int), default=256, help="features of each block")
    p.add_argument("--resume-from", default=None, metavar="RUN",
                   help="start from the sharded checkpoint of run RUN (saved by a job of any size)")
    p.add_argument("--mesh", type=cli.positive(int), default=None, help="processes in the device mesh (the job's size)")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    cli.add_group(p, set_epoch=False)
    args = cli.parse(p, argv)
    args.shard = args.shard.split(",")
    unknown = [m for m in args.shard if m not in sharding.MODES]
    if unknown or len(set(args.shard)) != len(args.shard):
        p.error(f"--shard takes {', '.join(sharding.MODES)} (each once, comma-separated), got {','.join(args.shard)}")
    if (args.resume or args.resume_from) and not set(args.shard) <= set(sharding.RESUMABLE):
        p.error(f"--resume: sharded checkpoints are written for --shard {' and '.join(sharding.RESUMABLE)} only "
                f"(get_state_dict knows DDP and FSDP, not ZeRO-1/2's split optimizers)")
    if args.model != "blocks" and {"gradients", "parameters"} & set(args.shard):
        p.error(f"--shard {'/'.join(m for m in args.shard if m in ('gradients', 'parameters'))} is shown on the block "
                f"stack (fully_shard per block), and --model {args.model} has no blocks; use --model blocks")
    if args.precision == "bf16" and args.shard != ["parameters"]:
        p.error("--precision bf16 is FSDP's MixedPrecisionPolicy here: use it with --shard parameters alone")
    return args


def build_model(args, train_set):
    torch.manual_seed(args.seed)  # every rank builds the same whole model, then keeps its shard
    if args.model == "blocks":
        return models.BlockStack(train_set.shape, train_set.num_classes, args.blocks, args.width)
    return models.build(args, train_set)


def train(args, ctx, mode, name, train_set, test_set):
    """One whole run with one --shard mode: its own log, checkpoints and model from the same seed."""
    device = ctx.device
    model = build_model(args, train_set).to(device)
    parameters = sum(p.numel() for p in model.parameters())
    model, optimizer = sharding.shard(model, mode, device, args.precision, optimizer_args(args))
    scheduler = scheduler_for(optimizer, args)
    run = argparse_copy(args, run_name=name, shard=mode)
    folder = checkpoint.path_for(run).with_suffix(".dcp")  # sharded: one folder, a file per rank
    source = folder.with_name(f"{name.replace(args.run_name, args.resume_from, 1)}.dcp") if args.resume_from else folder
    if args.resume_from and not source.exists():
        raise UserError(f"--resume-from {args.resume_from}: no sharded checkpoint {source.name} in {source.parent}")
    start_epoch = (sharding.load_sharded(source, model, optimizer, scheduler, run)
                   if args.resume or args.resume_from else 1)
    log = metrics.RunLog(run, __file__, device, ctx.world_size, ctx.backend, enabled=ctx.is_main)
    log.write("ddp", **distributed.describe(ctx, args))
    log.write("sharding", shard=mode, zero_stage=sharding.ZERO_STAGE[mode], mesh=ctx.world_size,
              precision=args.precision, parameters=parameters, blocks=args.blocks, width=args.width,
              start_epoch=start_epoch)

    def measure(held, collectives):  # every rank's bytes, gathered to rank 0's log
        everyone = [None] * ctx.world_size
        dist.all_gather_object(everyone, held)
        theory = sharding.expected(mode, parameters, ctx.world_size)
        log.write("shard_memory", shard=mode, world_size=ctx.world_size, parameters=parameters,
                  param_bytes=[h[0] for h in everyone], grad_bytes=[h[1] for h in everyone],
                  optim_bytes=[h[2] for h in everyone], expected_bytes=list(theory))
        log.write("shard_comm", shard=mode, world_size=ctx.world_size, parameters=parameters, ops=collectives)

    sampler = DistributedSampler(train_set, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size // ctx.world_size, sampler=sampler)
    test_loader = DataLoader(test_set, batch_size=1000, sampler=range(ctx.rank, len(test_set), ctx.world_size))
    for epoch in range(start_epoch, args.epochs + 1):
        tick = time.perf_counter()
        sampler.set_epoch(epoch)
        train_meter = train_epoch(model, train_loader, optimizer, epoch, args.show_progress and ctx.is_main, device,
                                  measure if epoch == start_epoch else None)
        scheduler.step()
        wall = time.perf_counter() - tick
        # FSDP: every rank runs the same number of forwards (they all-gather the parameters together)
        test_meter = evaluation.evaluate(model, test_loader, device)
        log.epoch(epoch, distributed.reduce(train_meter), distributed.reduce(test_meter), wall)
        if mode in sharding.RESUMABLE:
            sharding.save_sharded(folder, model, optimizer, scheduler, epoch, run)  # every rank: its shards
        whole = sharding.full_state(model)  # gathered from the shards, on rank 0
        if ctx.is_main:
            sharding.save_full(checkpoint.path_for(run), whole, epoch, run)
    log.summary(checkpoint=checkpoint.path_for(run))


def argparse_copy(args, **changes):
    return argparse.Namespace(**{**vars(args), **changes})


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    sharding.check_mesh(args.mesh, distributed.from_env().world_size)  # before anyone waits for anyone
    if args.precision == "bf16" and not torch.cuda.is_available():
        raise UserError("--precision bf16 shards with FSDP's MixedPrecisionPolicy on GPUs, and this machine has "
                        "none: on the CPU every state stays fp32 (use --precision 32)")
    ctx = distributed.setup(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    train_set, test_set = data.load(args)
    for mode in args.shard:
        name = args.run_name if len(args.shard) == 1 else f"{args.run_name}_{mode}"
        train(args, ctx, mode, name, train_set, test_set)
    distributed.cleanup(ctx)


if __name__ == "__main__":
    main()
