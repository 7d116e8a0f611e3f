"""The plumbing of _trainup_experts.py: a mixture-of-experts (MoE) feed-forward layer in place of
each transformer layer's MLP, and expert parallelism: each process holds some of the experts and
the tokens travel to them and back by all-to-all.

    moe.swap_mlps(model, args, rank, world)     # every Layer's MLP becomes an MoE layer
    loss = F.cross_entropy(model(x), y)
    (loss + args.aux_loss_weight * moe.aux_loss(model)).backward()
    moe.sync_gradients(model, world)            # dense averaged over the ranks; experts each its own

The layer (Shazeer et al. 2017, "Outrageously Large Neural Networks: The Sparsely-Gated
Mixture-of-Experts Layer"): a linear router gives each token a softmax over E experts; the token
goes to its top-k experts, each an MLP of its own, and the layer's output is their outputs weighed
by the router's probabilities of them. Shazeer et al. and GShard renormalise those weights over
the k chosen; here they are NOT renormalised, as in the Switch Transformer (Fedus et al. 2021):
with k = 1 a renormalised weight is always 1, and the router would learn from the auxiliary loss
alone; kept as they are, the task loss trains the router through them, for any k. A token passes through k of the E experts: the layer's parameters grow with E, the
compute a token costs with k.

Capacity (GShard, Lepikhin et al. 2020; Switch): an expert takes at most capacity_factor x tokens x
k / E assignments (rounded up), counted over each process's own tokens (GShard's groups): a fixed
bound on every expert's work. Assignments beyond it are dropped and counted; a token whose every
choice was dropped leaves the layer as it came, through the residual connection alone. Every
token's first choice takes a place before any token's second choice (GShard's order), and within a
choice the earlier token in the batch first. With capacity_factor E / k nothing can drop: an expert
is then allowed every token, and a token picks an expert at most once.

Load balancing (Switch): a router that sends most tokens to one expert wastes the others; the
auxiliary loss E * sum_i f_i * P_i, where f_i is the share of the assignments the router chose for
expert i (before capacity; the k choices of a token all count) and P_i the mean probability the
router gives it, is 1 when the assignments are spread evenly (every f_i = 1/E, whatever P) and
grows towards E as they pile up on one expert that the router is sure of. f is a count and passes no
gradient; P does.

Expert parallelism (GShard): with W processes each holds E/W experts (rank r: experts r*E/W on) and
a 1/W share of the batch, as data parallelism gives it. A layer's forward on each rank: route its
own tokens, exchange how many go to each expert (an all-to-all of E counts), send the tokens to
their experts' ranks (all_to_all_single with those split sizes), run its own experts on what
arrived, and send the outputs back the way they came (a second all_to_all_single). Backward runs
the two the other way round: the gradient of an all-to-all is the all-to-all with the split sizes
swapped (AllToAll below), so each expert's gradient gathers every rank's tokens.

The gradients match one process's. Each rank's loss is the mean over its own B/W samples, so its
gradient weighs each sample W times what the one-process mean over B does. The dense parameters
(attention, norms, router), whole on every rank, get their gradients summed over the ranks
(all_reduce) and divided by W: data parallelism's average. An expert's gradient already holds every
rank's tokens, brought back by the all-to-all: it is only divided by W, and never averaged with
another rank's (no other rank holds it). The auxiliary loss takes f from the whole batch (an
all_reduce of the counts) and P from the rank's own tokens: linear in P, its mean over the ranks is
then the one-process loss, and so is its averaged gradient.
"""
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from .. import UserError, checkpoint, cli
from ..transformer import MLP


def add_flags(p):
    """The transformer's size and the experts' flags."""
    cli.add_blocks(p, "the experts lesson", blocks=2, width=64, what="transformer layers")
    p.add_argument("--hidden", type=cli.positive(int), default=128,
                   help="hidden features of each expert's MLP")
    p.add_argument("--heads", type=cli.positive(int), default=4, help="attention heads per layer")
    p.add_argument("--experts", type=cli.positive(int), default=4,
                   help="experts in each MoE layer (each process holds experts / processes)")
    p.add_argument("--top-k", type=cli.positive(int), default=1,
                   help="experts each token goes to (Switch: 1; GShard: 2)")
    p.add_argument("--capacity-factor", type=cli.positive(float), default=1.25,
                   help="an expert takes at most this x tokens x top-k / experts assignments; "
                        "experts / top-k drops nothing")
    p.add_argument("--aux-loss-weight", type=float, default=0.01,
                   help="weight of the Switch load-balancing loss (Switch: 0.01; 0 turns it off)")


def check_shape(args, world_size):
    """One sentence on a layout the job cannot run; before anyone waits for anyone."""
    if args.width % args.heads:
        raise UserError(f"--width {args.width} cannot be split into --heads {args.heads} heads "
                        f"of equal size; use a multiple of {args.heads}")
    if args.experts % world_size:
        raise UserError(f"--experts {args.experts} cannot be shared by {world_size} processes: "
                        f"each holds as many whole experts; use a multiple of {world_size}")
    if args.top_k > args.experts:
        raise UserError(f"--top-k {args.top_k} asks each token for more experts than the "
                        f"{args.experts} of --experts; use at most {args.experts}")
    if args.aux_loss_weight < 0:
        raise UserError(f"--aux-loss-weight {args.aux_loss_weight} would reward piling tokens "
                        f"on a few experts; use 0 or more")


class AllToAll(torch.autograd.Function):
    """all_to_all_single with autograd: rows[i] of this rank's input go to rank i; backward sends
    the gradients back the same way, the split sizes swapped. (torch.distributed.nn.functional's
    all_to_all_single does the same and is deprecated in favour of the functional collectives.)"""

    @staticmethod
    def forward(ctx, x, send, receive, group):
        ctx.send, ctx.receive, ctx.group = send, receive, group
        out = x.new_empty((sum(receive), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), receive, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        back = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), ctx.send, ctx.receive, group=ctx.group)
        return back, None, None, None


def capacity(tokens, experts, top_k, factor):
    """The most assignments one expert takes from `tokens` tokens: factor x tokens x k / E,
    rounded up."""
    return math.ceil(factor * tokens * top_k / experts)


def kept(choices, experts, limit):
    """Which assignments fit: choices is (tokens, k) expert indices; an assignment's place in its
    expert's queue counts first choices before second ones, earlier tokens before later ones."""
    order = choices.t().reshape(-1)  # first choices of all tokens, then second choices, ...
    onehot = F.one_hot(order, experts)
    place = (onehot.cumsum(0) - 1).mul(onehot).sum(1)  # 0 for the first token an expert gets
    return (place < limit).reshape(choices.shape[1], -1).t()


class MoE(nn.Module):
    """An MoE feed-forward layer holding experts [first, first + E/W) of E (all of them for W=1).
    Training forward passes keep the layer's aux loss in .aux and add to its counters."""

    def __init__(self, hidden, inner, experts, top_k, capacity_factor, rank=0, world=1):
        super().__init__()
        self.num_experts, self.top_k, self.factor = experts, top_k, capacity_factor
        self.rank, self.world, self.local = rank, world, experts // world
        self.router = nn.Linear(hidden, experts, bias=False)
        mine = range(rank * self.local, (rank + 1) * self.local)
        # every rank builds all E (the same random draws everywhere) and keeps its own; keyed by
        # their number among all E, so that each parameter's name is the one-process model's
        built = [MLP(hidden, inner) for _ in range(experts)]
        self.experts = nn.ModuleDict({str(e): built[e] for e in mine})
        self.aux = None
        self.reset_counts()

    def reset_counts(self):
        self.routed = torch.zeros(self.num_experts, dtype=torch.long)  # assignments chosen
        self.dropped = 0  # assignments over capacity, of this rank's tokens
        self.received = 0  # assignments this rank's experts computed, from every rank

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # every token of the batch: (tokens, hidden)
        probs = torch.softmax(self.router(x), dim=-1)
        weights, choices = probs.topk(self.top_k, dim=-1)  # (tokens, k), not renormalised
        counts = torch.bincount(choices.reshape(-1), minlength=self.num_experts)
        if self.training:
            self.aux = self.balance_loss(probs, counts)
        fits = kept(choices, self.num_experts, capacity(len(x), self.num_experts, self.top_k,
                                                        self.factor))
        token = torch.arange(len(x), device=x.device)[:, None].expand_as(choices)[fits]
        expert, weight = choices[fits], weights[fits]
        order = torch.argsort(expert, stable=True)  # grouped by expert, so by rank
        token, expert, weight = token[order], expert[order], weight[order]
        out = self.experts_on(x[token], expert)
        if self.training:
            self.routed += counts.cpu()
            self.dropped += choices.numel() - len(token)
        combined = torch.zeros_like(x).index_add(0, token, weight[:, None] * out)
        return combined.reshape(shape)

    def balance_loss(self, probs, counts):
        """Switch's E * sum_i f_i * P_i; f from every rank's tokens, P from this rank's."""
        counts = counts.to(probs.dtype)
        if self.world > 1:
            counts = counts.clone()
            dist.all_reduce(counts)
        return self.num_experts * (counts / counts.sum() * probs.mean(0)).sum()

    def experts_on(self, rows, expert):
        """Each row through its expert (rows grouped by expert): sent to the expert's rank,
        computed there, and sent back in the same order."""
        per_expert = torch.bincount(expert, minlength=self.num_experts)
        if self.world > 1:
            arriving = torch.empty_like(per_expert)
            dist.all_to_all_single(arriving, per_expert)  # E/W counts to each rank, from each
            send = per_expert.view(self.world, -1).sum(1).tolist()
            arriving = arriving.view(self.world, self.local)  # [source rank, my expert]
            receive = arriving.sum(1).tolist()
            rows = AllToAll.apply(rows, send, receive, None)
            mine = torch.arange(self.local, device=rows.device).repeat(self.world)
            which = torch.repeat_interleave(mine, arriving.reshape(-1))
        else:
            which = expert
        order = torch.argsort(which, stable=True)  # what arrived, grouped by my expert
        sizes = torch.bincount(which, minlength=self.local).tolist()
        parts = rows[order].split(sizes)
        done = torch.cat([f(part) for f, part in zip(self.experts.values(), parts)])
        out = done[torch.argsort(order)]  # back in the order it arrived
        if self.training:
            self.received += len(rows)
        return AllToAll.apply(out, receive, send, None) if self.world > 1 else out


def swap_mlps(model, args, rank=0, world=1):
    """Every transformer Layer's MLP replaced by an MoE layer of --experts MLPs, this rank's
    share of them kept."""
    for layer in model.layers:
        layer.mlp = MoE(args.width, args.hidden, args.experts, args.top_k, args.capacity_factor,
                        rank, world)
    return model


def moes(model):
    return [m for m in model.modules() if isinstance(m, MoE)]


def aux_loss(model):
    """The load-balancing losses of the last training forward, summed over the layers."""
    return sum(m.aux for m in moes(model))


def is_expert(name):
    return ".experts." in name


def sync_gradients(model, world):
    """Every gradient divided by W, the dense ones first summed over the ranks: the one-process
    gradient of the mean over the whole batch (see the module's docstring)."""
    if world == 1:
        return
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        if not is_expert(name):
            dist.all_reduce(p.grad)  # every rank's share of the batch: summed
        p.grad.div_(world)


def full_state(model, world):
    """The whole model's parameters on every rank: the dense ones as they are, the experts
    gathered from their ranks (a collective: every rank calls it)."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    if world == 1:
        return state
    everyone = [None] * world
    dist.all_gather_object(everyone, {k: v for k, v in state.items() if is_expert(k)})
    for part in everyone:
        state.update(part)
    return state


def layout(model, world):
    """The "experts" record: each rank's experts and the bytes it holds, of experts and the rest."""
    first = moes(model)[0]
    held = {"expert": 0, "dense": 0}
    for name, p in model.named_parameters():
        held["expert" if is_expert(name) else "dense"] += p.numel() * p.element_size()
    everyone = gathered(held, world)
    return dict(experts=first.num_experts, top_k=first.top_k, capacity_factor=first.factor,
                experts_per_rank=first.local, layers=len(moes(model)),
                placement=[list(range(r * first.local, (r + 1) * first.local))
                           for r in range(world)],
                expert_bytes=[h["expert"] for h in everyone],
                dense_bytes=[h["dense"] for h in everyone])


def epoch_load(model, world, epoch, tokens_per_step):
    """The "expert_load" record of an epoch, summed over the layers and the training steps: the
    assignments routed to each expert, dropped, and received by each rank's experts. Resets the
    counters (a collective)."""
    layers = moes(model)
    mine = dict(routed=sum(m.routed for m in layers).tolist(),
                dropped=sum(m.dropped for m in layers), received=sum(m.received for m in layers))
    for m in layers:
        m.reset_counts()
    everyone = gathered(mine, world)
    first = layers[0]
    return dict(epoch=epoch, routed=[sum(e["routed"][i] for e in everyone)
                                     for i in range(first.num_experts)],
                dropped=sum(e["dropped"] for e in everyone),
                received=[e["received"] for e in everyone],
                capacity=capacity(tokens_per_step, first.num_experts, first.top_k, first.factor))


def counts(model):
    """Each MoE layer's counters of the epoch so far (routed, dropped, received), for a checkpoint:
    a run resumed inside an epoch goes on counting where the stop left them."""
    return [dict(routed=m.routed.clone(), dropped=m.dropped, received=m.received)
            for m in moes(model)]


def set_counts(model, saved):
    layers = moes(model)
    if len(saved) != len(layers):
        raise ValueError("another number of MoE layers")
    for m, c in zip(layers, saved):
        m.routed, m.dropped, m.received = c["routed"].clone(), c["dropped"], c["received"]


def gathered(value, world):
    """One value from every rank, in rank order."""
    if world == 1:
        return [value]
    everyone = [None] * world
    dist.all_gather_object(everyone, value)
    return everyone


def _layout(args, world):
    """Which experts each rank holds, as what decides it: a resumed job must have the same."""
    return {"--experts": args.experts, "processes": world}


def save(folder, model, optimizer, scheduler, epoch, args, world, position=None):
    """Every rank saves what it holds: the dense parameters and its own experts, with their
    optimizer's and the scheduler's state (checkpoint.save_ranks); position: where a stop left the
    epoch (preempt.Stopper)."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "counts": counts(model)}
    checkpoint.save_ranks(folder, state, epoch, args, _layout(args, world), position)


def saver(folder, model, optimizer, scheduler, args, world):
    """What a stop (preempt.Stopper) calls on every rank: save() with where it stopped."""
    def save_at_stop(epochs_done, position):
        save(folder, model, optimizer, scheduler, epochs_done, args, world, position)
    return save_at_stop


def load(folder, model, optimizer, scheduler, args, world):
    """--resume: every rank takes back its experts; (the epoch to start from, where a stop left it:
    None at an epoch's end). Another layout is one sentence (checkpoint.load_ranks)."""
    mine, epoch, position = checkpoint.load_ranks(folder, _layout(args, world), args)
    if mine is None:
        return 1, None
    try:
        model.load_state_dict(mine["model"])
        optimizer.load_state_dict(mine["optimizer"])
        scheduler.load_state_dict(mine["scheduler"])
        set_counts(model, mine["counts"])  # a stop's epoch: its load record counts every step
    except (KeyError, RuntimeError, ValueError):
        raise UserError(f"checkpoint {folder} holds weights that do not fit this run's model "
                        f"(--blocks, --width, --heads, --hidden); resume with the flags it was "
                        f"saved with, or use another --run-name") from None
    return epoch, position
