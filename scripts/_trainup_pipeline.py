"""Lesson 06, pipeline model parallelism: the model cut into stages, one per process (or GPU); each
batch cut into micro-batches that flow through the stages, so that they work at the same time.

    torchrun --standalone --nproc-per-node 2 scripts/_trainup_pipeline.py --quick                  # 2 stages, GPipe
    torchrun --standalone --nproc-per-node 2 scripts/_trainup_pipeline.py --schedule 1f1b --microbatches 8
    torchrun --standalone --nproc-per-node 2 scripts/_trainup_pipeline.py --sweep 1,2,4,8,16       # the bubble
    torchrun --standalone --nproc-per-node 4 scripts/_trainup_pipeline.py --data-parallel 2       # 2 pipelines x 2
    python scripts/_trainup_pipeline.py --stages 1     # the baseline: the whole model in one process

Compared with _trainup_blocks.py: each process keeps only its stage's blocks of the whole model
(trainup/parallel/pipeline.py), instead of a DDP replica; a PipelineStage per stage and a schedule
(--schedule; pipeline.Pipe holds them) run forward and backward micro-batch by micro-batch, sending
activations forward and gradients back; the first stage feeds the inputs, the last computes the
loss; with --data-parallel each stage is in DDP over the same stage of every pipeline; every stage
notes when each micro-batch's forward and backward ran, and its activation bytes; every rank saves
its own stages at each epoch's end and at a stop (checkpoint.save_ranks).
"""
import time

import torch
import torch.nn.functional as F

from trainup import checkpoint, cli, data, distributed, metrics, models, preempt
from trainup.parallel import pipeline, pipeline_runs


def train_epoch(model, pipe, layout, loader, optimizer, epoch, show_progress, device, log_steps):
    model.train()
    meter = preempt.meter(loader)  # a resumed epoch goes on with the sums of its steps so far
    batches = metrics.progress(loader, f"epoch {epoch}", show_progress)
    for step, (x, y) in enumerate(batches, preempt.first_step(loader)):  # on after a resume
        x, y = x.to(device), y.to(device)
        tick = pipeline.begin_step(pipe, layout)  # the stages start a measured step together
        logits, loss = train_step(model, pipe, layout, optimizer, x, y)
        log_steps.append(pipeline.end_step(pipe, layout, tick, epoch, step))
        if logits is not None:  # only the last stage sees the loss
            meter.add(loss, logits, y)
    return meter


def train_step(model, pipe, layout, optimizer, x, y):
    if pipe is None:  # one process: the whole model, the whole batch
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
    else:  # forward and backward micro-batch by micro-batch, stage by stage
        logits, loss = pipe.run(x, y)  # --data-parallel: each stage's DDP averages its gradients
    optimizer.step()
    optimizer.zero_grad()
    return logits, loss


def optimizer_for(params, args):
    optimizer = torch.optim.Adadelta(params, lr=args.lr)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)


def parse_args(argv=None):
    p = cli.parser(__doc__, lesson="pipeline")
    p.set_defaults(lr=0.1)  # a stack of blocks wants a smaller step than the CNN's Adadelta 1.0
    pipeline_runs.add_flags(p)  # --schedule, --stages, --microbatches, --data-parallel, --sweep
    cli.add_blocks(p, "the pipeline lesson")
    cli.add_group(p, set_epoch=False)
    return pipeline_runs.check_flags(p, cli.parse(p, argv))


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    for run in pipeline_runs.runs(args):
        pipeline.check_shape(run, distributed.from_env().world_size)  # before anyone waits for anyone
    ctx = distributed.setup(args)
    stop = preempt.Stopper(args, preempt.TorchDistributed(ctx))  # all ranks stop at one step
    args = stop.args  # the run's name as the job settled it (rank 0's)
    if args.threads:
        torch.set_num_threads(args.threads)
    train_set, test_set = data.load(args)
    layout = pipeline.Layout(ctx.rank, args.stages, args.data_parallel)
    for run in pipeline_runs.runs(args):
        train(run, ctx, layout, train_set, test_set, stop)
    distributed.cleanup(ctx)


def train(args, ctx, layout, train_set, test_set, stop):
    """One schedule's run: the model from the seed, its log, its training (or --sweep), its checkpoint."""
    device = ctx.device
    torch.manual_seed(args.seed)  # every rank builds the same whole model, then keeps its stages
    model = models.BlockStack(train_set.shape, train_set.num_classes, args.blocks, args.width)
    if args.stages == 1:
        model = model.to(device)  # a pipeline moves only its own stages to its device
    log = metrics.RunLog(args, __file__, device, ctx.world_size, ctx.backend, enabled=ctx.is_main)
    pipeline_runs.log_layout(log, args, ctx, layout)  # which stages each rank holds
    if args.sweep:  # the bubble: the same steps with several micro-batch counts
        return pipeline_runs.sweep(args, model, layout, train_set, ctx, log, train_step,
                                   optimizer_for)

    pipe = (pipeline.Pipe(args, model, layout, device, args.microbatches) if args.stages > 1
            else None)
    optimizer, scheduler = optimizer_for(pipe.params() if pipe else model.parameters(), args)
    parts, folder = pipe.parts if pipe else [model], checkpoint.ranks_folder(args)  # this rank's
    start_epoch, saved = (pipeline.load_stages(folder, parts, optimizer, scheduler, args)
                          if args.resume else (1, None))
    stop.watch(folder, log, parts[0], optimizer, scheduler,  # every rank saves its stages
               save=pipeline.stage_saver(folder, parts, optimizer, scheduler, args), saved=saved)
    per_pipeline = args.batch_size // args.data_parallel
    sampler = data.ShuffleSampler(len(train_set), args.seed, layout.pipeline, args.data_parallel)
    test_loader = pipeline.Batches(test_set, per_pipeline,
                                   range(layout.pipeline, len(test_set), args.data_parallel))
    log_steps = []
    for epoch in range(start_epoch, args.epochs + 1):
        tick = time.perf_counter()
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same in every stage of a pipeline
        batches = pipeline.Batches(train_set, per_pipeline, sampler)
        train = train_epoch(model, pipe, layout, stop.batches(batches, epoch), optimizer, epoch,
                            args.show_progress and ctx.is_main, device, log_steps)
        scheduler.step()
        wall = time.perf_counter() - tick
        pipeline.write_steps(log, log_steps)
        test = pipeline.evaluate(model, pipe, test_loader, device)
        log.epoch(epoch, distributed.reduce(train), distributed.reduce(test), wall)
        pipeline.save_stages(folder, parts, optimizer, scheduler, epoch, args)  # for --resume
        whole = pipeline.gather_model(parts, model)
        if ctx.is_main:
            pipeline.save_model(checkpoint.path_for(args), whole, epoch, args)
        stop.after_epoch(epoch)  # a stop asked for during evaluation
    log.summary(checkpoint=checkpoint.path_for(args))


if __name__ == "__main__":
    main()
