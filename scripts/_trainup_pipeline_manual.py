"""Lesson 06, before any library: the model cut in two by hand, one half per process; activations
are sent forward and gradients back with dist.send / dist.recv, so each half waits for the other.

    torchrun --standalone --nproc-per-node 2 scripts/_trainup_pipeline_manual.py --steps 20

Rank 0 holds the stem and the first half of the blocks, rank 1 the second half and the head (and
the loss). One step: rank 0 forward, send; rank 1 receive, forward, loss, backward, send the
gradient of its input; rank 0 receive it, backward. Each process notes when it computed (F, B),
sent (S) and waited to receive (R): the log's 'pipe_step' records, drawn by the notebook.
SIGTERM or --stop-signal: both halves stop after the same step, each rank saves its own half
(checkpoint.save_ranks), and --resume goes on from the next step.
"""
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainup import UserError, checkpoint, cli, data, distributed, metrics, models, preempt
from trainup.parallel import pipeline


def step(half, rank, x, y, width, clock):
    """One training step of this rank's half; its events and (on rank 1) the loss."""
    events = []

    def note(kind, start):
        events.append([rank, kind, 0, start, clock()])

    if rank == 0:
        t = clock()
        act = half(x)
        note("F", t)
        t = clock()
        dist.send(act.detach(), dst=1)  # the activations go forward...
        note("S", t)
        grad = torch.empty_like(act)
        t = clock()
        dist.recv(grad, src=1)  # ...and rank 0 can do nothing until their gradient comes back
        note("R", t)
        t = clock()
        act.backward(grad)
        note("B", t)
        return events, None
    act = torch.empty(len(y), width)
    t = clock()
    dist.recv(act, src=0)  # rank 1 waits for rank 0's forward
    note("R", t)
    act.requires_grad_()  # so that backward gives the gradient to send back
    t = clock()
    loss = F.cross_entropy(half(act), y)
    note("F", t)
    t = clock()
    loss.backward()
    note("B", t)
    t = clock()
    dist.send(act.grad, dst=0)
    note("S", t)
    return events, loss.item()


def layout(args):
    return {"--blocks": args.blocks, "--width": args.width}  # what each rank's file holds: its half


def save(folder, half, optimizer, args, steps_done, position=None):
    """Each rank its half and its optimizer's state; steps_done: 1 once all --steps are taken."""
    state = {"model": half.state_dict(), "optimizer": optimizer.state_dict()}
    checkpoint.save_ranks(folder, state, steps_done, args, layout(args), position)


def load(folder, half, optimizer, args):
    """--resume: (1, where a stop left the steps), or (2, None) when all were taken."""
    mine, start, position = checkpoint.load_ranks(folder, layout(args), args)
    if mine is not None:
        half.load_state_dict(mine["model"])
        optimizer.load_state_dict(mine["optimizer"])
    return start, position


def parse_args(argv=None):
    p = cli.parser(__doc__, lesson="pipeline")
    p.set_defaults(lr=0.1)  # a stack of blocks wants a smaller step than the CNN's Adadelta 1.0
    p.add_argument("--steps", type=cli.positive(int), default=20, help="training steps")
    p.add_argument("--blocks", type=cli.positive(int), default=8, help="identical blocks in the model")
    p.add_argument("--width", type=cli.positive(int), default=256, help="features of each block")
    p.add_argument("--device", default="cpu", choices=("cpu",), help="this picture runs on the CPU")
    p.add_argument("--backend", default="gloo", choices=("gloo",))
    p.add_argument("--timeout", type=cli.positive(float), default=300)
    given = argv if argv is not None else sys.argv[1:]
    args = cli.parse(p, argv)
    if args.blocks < 2:
        p.error(f"--blocks {args.blocks}: two halves need at least 2 blocks")
    if any(a == "--epochs" or a.startswith("--epochs=") for a in map(str, given)):
        p.error(f"--epochs does not apply to this picture of {args.steps} steps: it counts --steps")
    if args.dataset == "synthetic":
        p.error("--dataset synthetic: the halves index a data set held in memory (digits, mnist, cifar10)")
    return args


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    if distributed.from_env().world_size != 2:
        raise UserError("the model is cut in two halves, one per process: start it with torchrun --nproc-per-node 2")
    ctx = distributed.setup(args)
    stop = preempt.Stopper(args, preempt.TorchDistributed(ctx))  # both halves stop at one step
    train_set, _ = data.load(args)
    torch.manual_seed(args.seed)  # both build the same whole model, then keep their half
    model = models.BlockStack(train_set.shape, train_set.num_classes, args.blocks, args.width)
    half = pipeline.cut(model, 2)[ctx.rank]
    optimizer = torch.optim.Adadelta(half.parameters(), lr=args.lr)
    folder = checkpoint.ranks_folder(args)  # each rank saves its own half
    start, saved = load(folder, half, optimizer, args) if args.resume else (1, None)
    log = metrics.RunLog(args, __file__, ctx.device, ctx.world_size, ctx.backend, enabled=ctx.is_main)
    log.write("pipeline", schedule="manual", stages=2, stages_per_rank=1, pipeline_ranks=2, data_parallel=1,
              microbatches=1, microbatch_size=args.batch_size, blocks=args.blocks, width=args.width,
              stage_blocks=pipeline.block_ranges(args.blocks, 2),
              placement=[dict(rank=r, pipeline=0, position=r, device="cpu", stages=[r]) for r in (0, 1)])
    order = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(args.seed))
    batches = [order[i:i + args.batch_size] for i in range(0, len(order) - args.batch_size + 1, args.batch_size)]
    stop.watch(folder, log, half, optimizer, None, saved=saved,
               save=lambda done, position: save(folder, half, optimizer, args, done, position))
    # the --steps steps as one epoch, for the stop: a resumed run skips the steps taken
    steps = stop.batches([batches[(n - 1) % len(batches)] for n in range(1, args.steps + 1)], 1)
    losses = []
    for n, picked in enumerate(steps if start == 1 else [], preempt.first_step(steps)):
        x, y = train_set[picked]
        dist.barrier()  # both start the step together: times are from here
        tick = time.perf_counter()
        optimizer.zero_grad()
        events, loss = step(half, ctx.rank, x, y, args.width, lambda: time.perf_counter() - tick)
        optimizer.step()
        record = dict(epoch=1, step=n, microbatches=1, rank=ctx.rank, stages=[ctx.rank],
                      start_s=tick, step_s=time.perf_counter() - tick, events=events,
                      peak_activation_bytes=[half.meter.step_peak], loss=loss)
        half.meter.reset_peak()
        everyone = [None] * 2
        dist.all_gather_object(everyone, record)  # written at once: a stop after this step keeps it
        for r in everyone:
            log.write("pipe_step", **r)
        losses.append(everyone[1]["loss"])
    if start == 1:
        save(folder, half, optimizer, args, 1)  # all steps taken: --resume has none left
    if ctx.is_main and losses:
        first = n - len(losses) + 1  # after a resume, the step after the stop's
        taken = f"{args.steps} steps" if first == 1 else f"steps {first} to {n}"
        print(f"{taken}: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    seen = dict(first_loss=losses[0], last_loss=losses[-1]) if losses else {}
    log.summary(checkpoint=folder, **seen)
    distributed.cleanup(ctx)


if __name__ == "__main__":
    main()
