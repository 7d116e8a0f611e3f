"""Lesson 06's runs around the pipeline: its flags, one run per schedule in a job, the layout record
in the log, and the --sweep over micro-batch counts. The pipeline itself is
trainup/parallel/pipeline.py."""
import argparse
import itertools

import torch.distributed as dist

from .. import UserError, cli, config, data
from . import pipeline


def schedule_list(text):
    """--schedule: one schedule's name, or several, comma-separated."""
    names = text.split(",")
    for name in names:
        if name not in pipeline.SCHEDULES:
            raise argparse.ArgumentTypeError(
                f"unknown schedule {name!r}; choose from {', '.join(pipeline.SCHEDULES)}")
    return names


def add_flags(p):
    """The pipeline's shape (--schedule, --stages, --microbatches, --data-parallel), --split,
    --recompute and --sweep."""
    p.add_argument("--schedule", dest="schedules", default=["gpipe"], type=schedule_list,
                   metavar="NAME[,NAME...]",
                   help="naive: the whole batch at once; gpipe: all forwards, then all backwards; "
                        "1f1b: one forward, one backward; the others hold 2 stages a process "
                        "(interleaved, zero bubble); several, comma-separated, run in turn in one "
                        f"job (of: {', '.join(pipeline.SCHEDULES)})")
    p.set_defaults(schedule=None)  # check_flags': the first of them
    p.add_argument("--stages", type=cli.positive(int), default=2,
                   help="processes in one pipeline (1: no pipeline)")
    p.add_argument("--microbatches", type=cli.positive(int), default=4,
                   help="micro-batches per batch")
    p.add_argument("--data-parallel", type=cli.positive(int), default=1,
                   help="pipelines side by side")
    p.add_argument("--split", choices=("manual", "traced"), default="manual",
                   help="manual: each stage's blocks picked by hand (pipeline.cut); traced: "
                        "torch's tracer (pipeline(), SplitPoint) cuts the graph at the same blocks")
    p.add_argument("--recompute", action="store_true",
                   help="each block's activations computed again in its backward "
                        "(torch.utils.checkpoint): a micro-batch in flight keeps only each block's "
                        "input")
    # measure the schedule only
    cli.add_sweep(p, steps=3, what="micro-batch counts", example="1,2,4,8")


def check_flags(p, args):
    """After parsing: the first schedule is args.schedule; several need a pipeline."""
    args = config.replaced(args, schedule=args.schedules[0])
    if args.recompute and (args.split == "traced" or args.stages == 1):
        p.error("--recompute checkpoints the blocks of the stages cut by hand: use it with "
                "--split manual and --stages 2 or more")
    if len(args.schedules) > 1 and args.stages == 1:
        p.error("several schedules need a pipeline (--stages 2 or more); --stages 1 is the "
                "one-process baseline")
    return args


def run_name(run_name, schedule, schedules):
    """The run of one schedule of a job's --schedule list: <run-name>_<schedule> when the job runs
    several, <run-name> when it runs one."""
    return run_name if len(schedules) == 1 else f"{run_name}_{schedule}"


def runs(args):
    """One set of arguments per schedule: several schedules run in turn, each its own run
    (run_name)."""
    for name in args.schedules:
        yield config.replaced(
            args, schedule=name, run_name=run_name(args.run_name, name, args.schedules),
            # naive: the whole batch is one micro-batch
            microbatches=1 if name == "naive" else args.microbatches)


def log_layout(log, args, ctx, layout):
    """The "pipeline" record: the shape of the job and which stages every rank holds."""
    placement = [None] * ctx.world_size
    stages = (pipeline.stage_ids(args.schedule, layout.position, args.stages)
              if args.stages > 1 else [0])
    mine = dict(rank=ctx.rank, pipeline=layout.pipeline, position=layout.position,
                device=str(ctx.device), stages=stages)
    dist.all_gather_object(placement, mine)
    n_stages = args.stages * pipeline.SCHEDULES[args.schedule][1] if args.stages > 1 else 1
    log.write("pipeline", schedule=args.schedule if args.stages > 1 else "none", stages=n_stages,
              stages_per_rank=n_stages // args.stages, pipeline_ranks=args.stages,
              data_parallel=args.data_parallel, microbatches=args.microbatches,
              microbatch_size=args.batch_size // args.data_parallel // args.microbatches,
              blocks=args.blocks, width=args.width,
              stage_blocks=pipeline.block_ranges(args.blocks, n_stages), placement=placement,
              split=args.split, recompute=args.recompute)


def sweep(args, model, layout, train_set, ctx, log, train_step, optimizer_for):
    """--sweep: for each micro-batch count, --sweep-steps measured steps (after one warm-up
    step); train_step and optimizer_for are the script's."""
    if args.stages == 1:
        raise UserError("--sweep measures a pipeline; use --stages 2 or more")
    device = ctx.device
    per_pipeline = args.batch_size // args.data_parallel
    sampler = data.ShuffleSampler(len(train_set), args.seed, layout.pipeline, args.data_parallel)
    batches = itertools.cycle(list(pipeline.Batches(train_set, per_pipeline, sampler)))
    for m in args.sweep:
        try:
            pipe = pipeline.Pipe(args, model, layout, device, m)
        except UserError as e:  # the schedule's own limit (1F1B: as many micro-batches as stages)
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
    log.summary()
