"""Lesson 06, pipeline model parallelism: the model cut into stages, one per process (or GPU); each
batch cut into micro-batches that flow through the stages, so that they work at the same time.

    torchrun --standalone --nproc-per-node 2 scripts/_trainup_pipeline.py --quick                  # 2 stages, GPipe
    torchrun --standalone --nproc-per-node 2 scripts/_trainup_pipeline.py --schedule 1f1b --microbatches 8
    torchrun --standalone --nproc-per-node 2 scripts/_trainup_pipeline.py --schedule gpipe,1f1b --run-name pp
        # several schedules in turn in one job (one start-up): runs pp_gpipe and pp_1f1b
    torchrun --standalone --nproc-per-node 2 scripts/_trainup_pipeline.py --sweep 1,2,4,8,16       # the bubble
    torchrun --standalone --nproc-per-node 4 scripts/_trainup_pipeline.py --data-parallel 2       # 2 pipelines x 2
    python scripts/_trainup_pipeline.py --stages 1     # the baseline: the whole model in one process

Compared with _trainup_blocks.py: each process keeps only its stage's blocks of the whole model
(trainup/pipeline.py), instead of a DDP replica; a PipelineStage per stage and a schedule
(--schedule; pipeline.Pipe holds them) run forward and backward micro-batch by micro-batch, sending
activations forward and gradients back; the first stage feeds the inputs, the last computes the
loss; with --data-parallel the same stage of each pipeline averages its gradients; every stage
notes when each micro-batch's forward and backward ran, and its activation bytes.
"""
import argparse
import itertools
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainup import UserError, checkpoint, cli, data, distributed, metrics, models, pipeline


def optimizer_for(params, args):
    optimizer = torch.optim.Adadelta(params, lr=args.lr)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)


def train_step(model, pipe, layout, optimizer, x, y):
    optimizer.zero_grad()
    if pipe is None:  # one process: the whole model, the whole batch
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
    else:
        logits, loss = pipe.run(x, y)
        pipeline.average_gradients(pipe.params(), layout)
    optimizer.step()
    return logits, loss


def train_epoch(model, pipe, layout, loader, optimizer, epoch, show_progress, log_steps, device):
    meter = metrics.Meter()
    for step, (x, y) in enumerate(metrics.progress(loader, f"epoch {epoch}", show_progress), 1):
        x, y = x.to(device), y.to(device)
        tick = pipeline.begin_step(pipe, layout)
        logits, loss = train_step(model, pipe, layout, optimizer, x, y)
        log_steps.append(pipeline.end_step(pipe, layout, tick, epoch, step))
        if logits is not None:  # only the last stage sees the loss
            meter.add(loss, logits, y)
    return meter


@torch.no_grad()
def evaluate(model, pipe, loader, device):
    meter = metrics.Meter()
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        if pipe is None:
            logits = model(x)
            meter.add(F.cross_entropy(logits, y), logits, y)
            continue
        logits = pipeline.forward_only(pipe.parts, pipe.ids, x, pipe.schedule_name, pipe.layout, pipe.width)
        if logits is not None:
            meter.add(F.cross_entropy(logits, y), logits, y)
    return meter


def sweep(args, model, layout, train_set, device, log, ctx):
    """--sweep: for each micro-batch count, --sweep-steps measured steps (after one warm-up step)."""
    per_pipeline = args.batch_size // args.data_parallel
    sampler = data.ShuffleSampler(len(train_set), args.seed, layout.pipeline, args.data_parallel)
    batches = itertools.cycle(list(pipeline.Batches(train_set, per_pipeline, sampler)))
    for m in args.sweep:
        try:
            pipe = pipeline.Pipe(args, model, layout, device, m)
        except UserError as e:  # the schedule's own limit (1F1B: at least as many micro-batches as stages)
            if ctx.is_main:
                print(f"{m} micro-batches: skipped ({e})")
            continue
        optimizer, _ = optimizer_for(pipe.params(), args)
        steps = []
        for step in range(args.sweep_steps + 1):
            x, y = (t.to(device) for t in next(batches))
            pipe.timing(step > 0)
            tick = pipeline.begin_step(pipe, layout)
            train_step(model, pipe, layout, optimizer, x, y)
            if step:
                steps.append(pipeline.end_step(pipe, layout, tick, 0, step))
        pipeline.write_steps(log, steps)
        if ctx.is_main:
            print(f"{m} micro-batches: {args.sweep_steps} steps measured")


def schedule_list(text):
    """--schedule: one schedule's name, or several, comma-separated."""
    names = text.split(",")
    for name in names:
        if name not in pipeline.SCHEDULES:
            raise argparse.ArgumentTypeError(f"unknown schedule {name!r}; choose from {', '.join(pipeline.SCHEDULES)}")
    return names


def runs(args):
    """One set of arguments per schedule: several schedules run in turn, each its own run <run-name>_<schedule>."""
    for name in args.schedules:
        yield argparse.Namespace(**{
            **vars(args), "schedule": name,
            "run_name": args.run_name if len(args.schedules) == 1 else f"{args.run_name}_{name}",
            "microbatches": 1 if name == "naive" else args.microbatches})  # naive: the whole batch is one


def parse_args(argv=None):
    p = cli.parser(__doc__, lesson="pipeline")
    p.set_defaults(lr=0.1)  # a stack of blocks wants a smaller step than the CNN's Adadelta 1.0
    p.add_argument("--schedule", dest="schedules", default=["gpipe"], type=schedule_list, metavar="NAME[,NAME...]",
                   help="naive: the whole batch at once; gpipe: all forwards, then all backwards; 1f1b: one "
                        "forward, one backward; the others hold 2 stages a process (interleaved, zero bubble); "
                        f"several, comma-separated, run in turn in one job (of: {', '.join(pipeline.SCHEDULES)})")
    p.add_argument("--stages", type=cli.positive(int), default=2, help="processes in one pipeline (1: no pipeline)")
    p.add_argument("--microbatches", type=cli.positive(int), default=4, help="micro-batches per batch")
    p.add_argument("--data-parallel", type=cli.positive(int), default=1, help="pipelines side by side")
    cli.add_blocks(p, "the pipeline lesson")
    cli.add_sweep(p, steps=3, what="micro-batch counts", example="1,2,4,8")  # measure the schedule only
    cli.add_group(p, set_epoch=False)
    args = cli.parse(p, argv)
    args.schedule = args.schedules[0]
    if len(args.schedules) > 1 and args.stages == 1:
        p.error("several schedules need a pipeline (--stages 2 or more); --stages 1 is the one-process baseline")
    return args


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    for run in runs(args):
        pipeline.check_shape(run, distributed.from_env().world_size)  # before anyone waits for anyone
    ctx = distributed.setup(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    train_set, test_set = data.load(args)
    layout = pipeline.Layout(ctx.rank, args.stages, args.data_parallel)
    for run in runs(args):
        train(run, ctx, layout, train_set, test_set)
    distributed.cleanup(ctx)


def train(args, ctx, layout, train_set, test_set):
    """One schedule's run: the model from the seed, its log, its training (or --sweep), its checkpoint."""
    device = ctx.device
    torch.manual_seed(args.seed)  # every rank builds the same whole model, then keeps its stages
    model = models.BlockStack(train_set.shape, train_set.num_classes, args.blocks, args.width)
    if args.stages == 1:
        model = model.to(device)  # a pipeline moves only its own stages to its device
    log = metrics.RunLog(args, __file__, device, ctx.world_size, ctx.backend, enabled=ctx.is_main)
    placement = [None] * ctx.world_size
    mine = dict(rank=ctx.rank, pipeline=layout.pipeline, position=layout.position, device=str(device),
                stages=pipeline.stage_ids(args.schedule, layout.position, args.stages) if args.stages > 1 else [0])
    dist.all_gather_object(placement, mine)
    n_stages = args.stages * pipeline.SCHEDULES[args.schedule][1] if args.stages > 1 else 1
    log.write("pipeline", schedule=args.schedule if args.stages > 1 else "none", stages=n_stages,
              stages_per_rank=n_stages // args.stages, pipeline_ranks=args.stages, data_parallel=args.data_parallel,
              microbatches=args.microbatches, microbatch_size=args.batch_size // args.data_parallel // args.microbatches,
              blocks=args.blocks, width=args.width, stage_blocks=pipeline.block_ranges(args.blocks, n_stages),
              placement=placement)
    if args.sweep:
        if args.stages == 1:
            raise UserError("--sweep measures a pipeline; use --stages 2 or more")
        sweep(args, model, layout, train_set, device, log, ctx)
        log.summary()
        return

    pipe = (pipeline.Pipe(args, model, layout, device, args.microbatches) if args.stages > 1
            else None)
    optimizer, scheduler = optimizer_for(pipe.params() if pipe else model.parameters(), args)
    per_pipeline = args.batch_size // args.data_parallel
    sampler = data.ShuffleSampler(len(train_set), args.seed, layout.pipeline, args.data_parallel)
    test_loader = pipeline.Batches(test_set, per_pipeline,
                                   range(layout.pipeline, len(test_set), args.data_parallel))
    log_steps = []
    for epoch in range(1, args.epochs + 1):
        tick = time.perf_counter()
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same in every stage of a pipeline
        batches = pipeline.Batches(train_set, per_pipeline, sampler)
        train = train_epoch(model, pipe, layout, batches, optimizer, epoch,
                            args.show_progress and ctx.is_main, log_steps, device)
        scheduler.step()
        wall = time.perf_counter() - tick
        pipeline.write_steps(log, log_steps)
        test = evaluate(model, pipe, test_loader, device)
        log.epoch(epoch, distributed.reduce(train), distributed.reduce(test), wall)
        whole = pipeline.gather_model(pipe.parts if pipe else [model], model)
        if ctx.is_main:
            pipeline.save_model(checkpoint.path_for(args), whole, epoch, args)
    log.summary(checkpoint=checkpoint.path_for(args))


if __name__ == "__main__":
    main()
