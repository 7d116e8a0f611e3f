"""Lesson 09e, mixture of experts and expert parallelism: each transformer layer's MLP becomes
--experts MLPs and a router that sends each token to its --top-k of them; each process holds
experts / processes of them, and the tokens travel to their experts and back by all-to-all.

    torchrun --standalone --nproc-per-node 2 scripts/_trainup_experts.py --quick   # 2 experts each
    python scripts/_trainup_experts.py --quick                                     # the baseline

Compared with _trainup_tp_sp.py: nothing is cut; each rank takes its share of the batch (data
parallelism) and holds its share of the experts (expert parallelism, trainup/parallel/experts.py);
an expert takes at most --capacity-factor x its fair share of tokens, the rest are dropped and
counted; the Switch load-balancing loss (--aux-loss-weight) joins the loss; the dense gradients
are averaged over the ranks, the experts' are not; the log keeps, per epoch, the tokens each
expert was sent and each rank's experts received.
"""
import itertools
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from trainup import (checkpoint, cli, data, distributed, evaluation, metrics, preempt,
                     transformer)
from trainup.parallel import experts as moe
from trainup.parallel import tensor_parallel as tpar


def train_epoch(model, loader, optimizer, epoch, show_progress, device, aux_weight, world):
    model.train()
    meter = preempt.meter(loader)  # a resumed epoch goes on with the sums of its steps so far
    for x, y in metrics.progress(loader, f"epoch {epoch}", show_progress):
        x, y = x.to(device), y.to(device)
        logits = model(x)  # per MoE layer 2 all-to-alls: the tokens to their experts and back
        loss = F.cross_entropy(logits, y)  # the mean over this rank's share of the batch
        (loss + aux_weight * moe.aux_loss(model)).backward()  # the all-to-alls the other way
        moe.sync_gradients(model, world)  # dense: averaged over ranks; experts: each its own
        optimizer.step()  # each rank updates the whole dense model and its own experts
        optimizer.zero_grad()
        meter.add(loss, logits, y)
    return meter


def optimizer_for(params, args):
    optimizer = torch.optim.Adadelta(params, lr=args.lr)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)


def parse_args(argv=None):
    p = cli.parser(__doc__, lesson="experts")
    moe.add_flags(p)  # the layers (--blocks, --width, --heads); --experts, --top-k, ...
    cli.add_group(p, set_epoch=False)
    return cli.parse(p, argv)


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    moe.check_shape(args, distributed.from_env().world_size)  # before any process waits
    train_set, test_set = data.load(args)
    ctx = distributed.setup(args)
    stop = preempt.Stopper(args, preempt.TorchDistributed(ctx))  # all ranks stop at one step
    args = stop.args  # the run's name as the job settled it (rank 0's)
    device = ctx.device
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # every rank builds the same whole model
    model = transformer.Classifier(train_set.shape, train_set.num_classes, args.blocks,
                                   args.width, args.heads, args.hidden)
    model = moe.swap_mlps(model, args, ctx.rank, ctx.world_size).to(device)  # its experts only
    optimizer, scheduler = optimizer_for(model.parameters(), args)
    folder = checkpoint.ranks_folder(args)  # every rank its own experts
    start_epoch, saved = (moe.load(folder, model, optimizer, scheduler, args, ctx.world_size)
                          if args.resume else (1, None))
    dp_index, dp = ctx.rank, ctx.world_size  # every rank a share of the data
    log = metrics.RunLog(args, __file__, device, ctx.world_size, ctx.backend, enabled=ctx.is_main)
    log.write("experts", **moe.layout(model, ctx.world_size))
    stop.watch(folder, log, model, optimizer, scheduler,  # every rank saves its experts
               save=moe.saver(folder, model, optimizer, scheduler, args, ctx.world_size),
               saved=saved)

    per_rank = args.batch_size // dp
    sampler = data.ShuffleSampler(len(train_set), args.seed, dp_index, dp)
    steps = len(train_set) // args.batch_size  # whole batches only, as many on every rank
    train_loader = DataLoader(train_set, batch_size=per_rank, sampler=sampler, drop_last=True)
    # equal test shards: every rank's forward passes meet the others' in the all-to-alls
    test_loader = DataLoader(test_set, batch_size=1000,
                             sampler=range(dp_index, len(test_set) - len(test_set) % dp, dp))
    for epoch in range(start_epoch, args.epochs + 1):
        tick = time.perf_counter()
        sampler.set_epoch(epoch)
        train = train_epoch(model, stop.batches(itertools.islice(train_loader, steps), epoch),
                            optimizer, epoch, args.show_progress and ctx.is_main, device,
                            args.aux_loss_weight, ctx.world_size)
        scheduler.step()
        wall = time.perf_counter() - tick
        log.write("expert_load", **moe.epoch_load(model, ctx.world_size, epoch,
                                                  per_rank * train_set.shape[1]))  # rows: tokens
        test = evaluation.evaluate(model, test_loader, device)
        log.epoch(epoch, distributed.reduce(train), distributed.reduce(test), wall)
        moe.save(folder, model, optimizer, scheduler, epoch, args, ctx.world_size)  # for --resume
        whole = moe.full_state(model, ctx.world_size)  # every rank sends its experts
        if ctx.is_main:  # one writer
            tpar.save_model(checkpoint.path_for(args), whole, epoch, args)
        stop.after_epoch(epoch)  # a stop asked for during evaluation
    log.summary(checkpoint=checkpoint.path_for(args))
    distributed.cleanup(ctx)


if __name__ == "__main__":
    main()
