"""The plumbing of _trainup_cp.py: context parallelism, the sequence cut over the ranks, every
layer whole on each of them, attention computed over the whole sequence all the same.

A transformer's MLP, LayerNorms and residuals act on each token alone: a rank that holds a slice
of the tokens runs them on its slice and needs nothing from the others. Attention is the one
place where a token meets every other. Two ways to give each rank's queries every key and value:

- Ring attention (Liu, Zaharia and Abbeel 2023, "Ring Attention with Blockwise Transformers for
  Near-Infinite Context"): each rank keeps its own queries and passes its block of keys and values
  to the next rank of a ring, world - 1 times, so that every block visits every rank. The partial
  attentions are combined as they come with the online softmax (Milakov and Gimelshein 2018;
  FlashAttention, Dao et al. 2022): a running maximum m and sum l of exp(score - m) per query;
  when a block raises the maximum, what was summed so far is rescaled by exp(m_old - m_new). The
  end result is the exact softmax; beside its own, a rank holds two blocks of keys and values at
  most (the one it computes with, the one arriving) and the scores of its queries against one
  block. The next block travels while the current one is computed on (the send starts first).
- All-to-all, DeepSpeed-Ulysses (Jacobs et al. 2023, "DeepSpeed Ulysses: System Optimizations for
  Enabling Training of Extreme Long Sequence Transformer Models"): one all-to-all trades q, k and
  v's sequence slices for head groups (each rank then holds heads/world heads over the whole
  sequence), attention runs locally, and a second all-to-all trades the output back. Its bytes
  per rank shrink as the ranks grow; the heads must divide over them.

Causal attention (--causal) lets token i see tokens 0..i only. With the sequence cut into world
contiguous blocks, rank 0's queries would see one block and the last rank's all of them: the
work is a triangle, cut unevenly. The zig-zag split cuts the sequence into 2 x world chunks and
gives rank r chunks r and 2 x world - 1 - r, a chunk of the start and one of the end, so every
rank's queries see as many keys: the split the Llama 3 paper describes (Llama Team 2024, "The
Llama 3 Herd of Models", where the keys and values are all-gathered rather than passed round a
ring) and PyTorch's own torch.distributed.tensor.experimental.context_parallel uses (its
head-tail load balancer). Striped Attention (Brandon et al. 2023) balances the same triangle by
dealing the tokens out one at a time. This module computes the masked scores and discards them;
a fused kernel skips the tiles the mask hides whole, so its work follows visible_scores() below.
The Ultra-Scale Playbook (Hugging Face, 2025) draws the ring and the zig-zag split in its chapter
on context parallelism.

The backward pass is written by hand (RingAttention, a torch.autograd.Function), as FlashAttention
and ring attention's implementations do: it keeps q, k, v, the output and the log-sum-exp of each
query, not the scores of every block, and recomputes each block's probabilities from them as the
blocks come round the ring a second time. The gradient of a block of keys and values is summed
on every rank it visits and travels on with it, one step behind the block, until it is back on
the rank that owns it. Letting autograd differentiate a send and a receive instead would also be
exact, but would keep every block's scores for backward: the memory ring attention is there to
save. Ulysses' all-to-all is linear, so its backward is the inverse all-to-all (AllToAll below).

The model itself is left as trainup/transformer.py wrote it: parallelize() replaces each
Attention's scores() and adds two hooks on the model, one that keeps this rank's rows of the
image (its tokens) and one that turns the mean over its tokens into the mean over all of them.
"""
import functools
import math

import torch
import torch.distributed as dist

from .. import UserError, cli

ATTENTIONS = ("ring", "ulysses")


def add_flags(p):
    """The transformer's size (as lesson 09c's) and how attention crosses the ranks."""
    cli.add_blocks(p, "the context-parallel lesson", blocks=2, width=64,
                   what="transformer layers in the model")
    p.add_argument("--hidden", type=cli.positive(int), default=256,
                   help="features of each layer's MLP")
    p.add_argument("--heads", type=cli.positive(int), default=4, help="attention heads per layer")
    p.add_argument("--cp-attention", default="ring", choices=ATTENTIONS,
                   help="ring: keys and values passed round the ranks; ulysses: all-to-all "
                        "trades the sequence for heads")
    p.add_argument("--causal", action="store_true",
                   help="each token attends to the rows above it only (zig-zag split over ranks)")


def check_shape(args, world, rows):
    """One sentence on a sequence the job cannot cut; before anyone waits for anyone."""
    if args.width % args.heads:
        raise UserError(f"--width {args.width} cannot be split into --heads {args.heads} heads "
                        f"of equal size; use a multiple of {args.heads}")
    pieces = 2 * world if args.causal else world  # zig-zag: two chunks a rank
    if rows % pieces:
        how = f"into 2 x {world} zig-zag chunks" if args.causal else f"over {world} processes"
        fits = "whose double divides" if args.causal else "that divides"
        raise UserError(f"the images' {rows} rows (the sequence) cannot be cut evenly {how}; "
                        f"start a number of processes {fits} {rows}")
    if args.cp_attention == "ulysses" and args.heads % world:
        raise UserError(f"--cp-attention ulysses gives each of the {world} processes whole "
                        f"heads: --heads {args.heads} does not divide over them; use a multiple "
                        f"of {world}")
    return world


def positions(rank, world, rows, zigzag):
    """The rows (token positions) a rank holds: a contiguous block, or zig-zag chunks r and
    2 x world - 1 - r of the sequence."""
    if not zigzag:
        size = rows // world
        return torch.arange(rank * size, (rank + 1) * size)
    size = rows // (2 * world)
    last = 2 * world - 1 - rank
    return torch.cat([torch.arange(rank * size, (rank + 1) * size),
                      torch.arange(last * size, (last + 1) * size)])


def visible_scores(world, rows, causal, zigzag=None):
    """Per rank, the query-key pairs its queries may see: the work a fused kernel does. Without a
    mask every rank's rows x its queries; with one, each query sees the rows up to its own.
    zigzag: the split (None: the script's, zig-zag where causal)."""
    zigzag = causal if zigzag is None else zigzag
    held = [positions(r, world, rows, zigzag) for r in range(world)]
    return [int((p + 1).sum()) if causal else len(p) * rows for p in held]


def attend(q, k, v, q_at=None, k_at=None):
    """softmax(q k^T / sqrt(d)) v, all of it at once; with positions, a key later than its query
    is masked (-inf before the softmax)."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if q_at is not None:
        s = s.masked_fill(k_at[None, :] > q_at[:, None], float("-inf"))
    return torch.softmax(s, dim=-1) @ v


class Traffic:
    """Bytes this rank sends for attention, by phase, until the first optimizer step ends
    (first_step(): frozen there, so that the test passes do not count)."""

    def __init__(self):
        self.sent, self.counting = {"forward": 0, "backward": 0}, True

    def add(self, phase, tensor, share=1.0):
        if self.counting:
            self.sent[phase] += int(tensor.numel() * tensor.element_size() * share)

    def first_step(self, optimizer):
        def stop(*_):
            self.counting = False
            handle.remove()
        handle = optimizer.register_step_post_hook(stop)
        return self


def expected_bytes(attention, world, batch, rows, width, layers, element_size):
    """What each rank sends for attention in one training step, by phase. One block: one rank's k
    (or v), batch x rows / world x width values. Ring: forward passes k and v on world - 1 times;
    backward passes them round again (world - 1) and the gradient of each block world times, back
    to its owner. Ulysses: 4 all-to-alls each way (q, k, v over, the output back; in backward the
    reverse), each sending (world - 1) / world of a block to the others."""
    block = batch * rows // world * width * element_size
    if world == 1:
        return {"forward": 0, "backward": 0}
    if attention == "ring":
        per_layer = {"forward": 2 * (world - 1) * block,
                     "backward": 2 * (world - 1) * block + 2 * world * block}
    else:
        share = int(4 * block * (world - 1) / world)
        per_layer = {"forward": share, "backward": share}
    return {phase: layers * n for phase, n in per_layer.items()}


class Ring:
    """This rank's place on the ring: its neighbours, every rank's positions (for the causal
    mask, None without one) and the Traffic it adds its sends to."""

    def __init__(self, group, at, traffic):
        group = group or dist.group.WORLD
        self.group, self.at, self.traffic = group, at, traffic
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.world)
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.world)

    def pass_on(self, tensor, phase):
        """Send tensor to the next rank and receive the previous rank's into a new one; returns
        a function that waits for both and gives what came in."""
        tensor = tensor.contiguous()
        received = torch.empty_like(tensor)
        requests = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, tensor, self.next, self.group),
            dist.P2POp(dist.irecv, received, self.prev, self.group)])
        self.traffic.add(phase, tensor)

        def wait():
            for r in requests:
                r.wait()
            return received
        return wait

    def scores(self, q, k, owner):
        """q k^T / sqrt(d) against the block of keys `owner` holds, masked where causal."""
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if self.at is not None:
            later = self.at[owner][None, :] > self.at[self.rank][:, None]
            s = s.masked_fill(later, float("-inf"))
        return s


class RingAttention(torch.autograd.Function):
    """Exact attention of this rank's queries over every rank's keys and values (see the
    module's docstring); q, k, v: (batch, heads, this rank's tokens, head features)."""

    @staticmethod
    def forward(ctx, q, k, v, ring):
        shape = q.shape[:-1] + (1,)
        m = q.new_full(shape, float("-inf"))  # running maximum of each query's scores
        total, out = q.new_zeros(shape), torch.zeros_like(q)  # running sum and weighted values
        kv = torch.stack([k, v])
        for step in range(ring.world):
            arriving = ring.pass_on(kv, "forward") if step < ring.world - 1 else None
            s = ring.scores(q, kv[0], (ring.rank - step) % ring.world)
            top = torch.maximum(m, s.amax(-1, keepdim=True))
            rescale = torch.exp(m - top)  # what was summed under the old maximum
            p = torch.exp(s - top)
            total = total * rescale + p.sum(-1, keepdim=True)
            out = out * rescale + p @ kv[1]
            m = top
            if arriving:
                kv = arriving()
        out = out / total
        ctx.save_for_backward(q, k, v, out, m + torch.log(total))  # log-sum-exp per query
        ctx.ring = ring
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        ring, scale = ctx.ring, 1 / math.sqrt(q.shape[-1])
        row = (grad_out * out).sum(-1, keepdim=True)  # FlashAttention's D: sum of dO * O per query
        grad_q, kv = torch.zeros_like(q), torch.stack([k, v])
        grad_kv = torch.zeros_like(kv)  # the gradient of the block this rank holds, so far
        for step in range(ring.world):
            arriving = ring.pass_on(kv, "backward") if step < ring.world - 1 else None
            p = torch.exp(ring.scores(q, kv[0], (ring.rank - step) % ring.world) - lse)
            grad_s = p * (grad_out @ kv[1].transpose(-2, -1) - row)  # through the softmax
            grad_q += grad_s @ kv[0] * scale
            grad_kv = grad_kv + torch.stack([grad_s.transpose(-2, -1) @ q * scale,
                                             p.transpose(-2, -1) @ grad_out])
            if arriving:
                kv = arriving()
            if ring.world > 1:  # on with its block: after the last step, home to its owner
                grad_kv = ring.pass_on(grad_kv, "backward")()
        return grad_q, grad_kv[0], grad_kv[1], None


class AllToAll(torch.autograd.Function):
    """Ulysses' exchange: to_heads turns (batch, heads, tokens held, d) into (batch, heads /
    world, every token, d); the other way round without. Its backward is the reverse exchange."""

    @staticmethod
    def forward(ctx, x, ring, to_heads):
        ctx.ring, ctx.to_heads = ring, to_heads
        return exchange(x, ring, to_heads, "forward")

    @staticmethod
    def backward(ctx, grad):
        return exchange(grad, ctx.ring, not ctx.to_heads, "backward"), None, None


def exchange(x, ring, to_heads, phase):
    """all_to_all_single sends chunk j of its input's first dimension to rank j: a head group
    (to_heads) or a sequence slice (back)."""
    w = ring.world
    b, h, s, d = x.shape
    if to_heads:
        chunks = x.reshape(b, w, h // w, s, d).transpose(0, 1)
    else:
        chunks = x.reshape(b, h, w, s // w, d).permute(2, 0, 1, 3, 4)
    chunks = chunks.contiguous()
    got = torch.empty_like(chunks)
    dist.all_to_all_single(got, chunks, group=ring.group)
    ring.traffic.add(phase, chunks, (w - 1) / w)  # its own chunk stays
    if to_heads:  # got[j]: rank j's tokens of this rank's heads
        return got.permute(1, 2, 0, 3, 4).reshape(b, h // w, w * s, d)
    return got.transpose(0, 1).reshape(b, w * h, s // w, d)  # got[j]: rank j's heads


def ulysses(q, k, v, ring):
    """Heads for sequence, attention over the whole sequence locally, and back."""
    q, k, v = (AllToAll.apply(t, ring, True) for t in (q, k, v))
    at = torch.cat(ring.at) if ring.at is not None else None  # the tokens in rank order
    return AllToAll.apply(attend(q, k, v, at, at), ring, False)


class Summed(torch.autograd.Function):
    """All-reduce (sum) in forward, the gradient unchanged in backward: every rank computes the
    same loss from the same sum, and the gradient of that one loss with respect to this rank's
    term is its gradient with respect to the sum (Megatron-LM's reduce-from-region)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def parallelize(model, rows, attention="ring", causal=False, group=None):
    """Cut a trainup.transformer.Classifier's sequence over the group (the world by default; one
    process: nothing to cut, the causal mask only). Returns the Traffic its attention adds to."""
    traffic = Traffic()
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    if world == 1:
        if causal:
            every = torch.arange(rows)
            for layer in model.layers:
                layer.attn.scores = functools.partial(attend, q_at=every, k_at=every)
        return traffic
    rank = dist.get_rank(group)
    at = [positions(r, world, rows, causal) for r in range(world)]
    ring = Ring(group, at if causal else None, traffic)
    how = (lambda q, k, v: RingAttention.apply(q, k, v, ring)) if attention == "ring" else (
        functools.partial(ulysses, ring=ring))
    for layer in model.layers:
        layer.attn.scores = how
    mine = at[rank]
    # the images' rows are the tokens: this rank's rows go in, whole every other way
    model.register_forward_pre_hook(lambda m, args: (args[0][:, :, mine.to(args[0].device)],))
    # Classifier ends with the mean over the tokens it saw: over this rank's, made its share of
    # the mean over all, then summed over the ranks
    model.register_forward_hook(
        lambda m, args, out: Summed.apply(out * (len(mine) / rows), group))
    return traffic


def sum_gradients(model, group=None):
    """Each rank's gradients are its own tokens' part of the whole gradient (ring attention sent
    each block's key and value gradients home): summed, not averaged, in one all-reduce."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    for g, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        g.copy_(part.view_as(g))


def log_layout(log, args, world, rows, element_size):
    """The "cp" record: how the sequence is cut, each rank's rows, the work its queries see."""
    log.write("cp", cp=world, attention=args.cp_attention, causal=args.causal, tokens=rows,
              heads=args.heads, blocks=args.blocks, width=args.width, hidden=args.hidden,
              positions=[positions(r, world, rows, args.causal).tolist() for r in range(world)],
              visible_scores=visible_scores(world, rows, args.causal),
              element_size=element_size)


def log_traffic(log, traffic, args, world, batch, rows, element_size):
    """The "cp_comm" record: every rank's bytes sent for attention in the first training step,
    beside expected_bytes()."""
    everyone = [None] * world
    if world > 1:
        dist.all_gather_object(everyone, traffic.sent)
    else:
        everyone = [traffic.sent]
    log.write("cp_comm", epoch=1, step=1, per_rank_batch=batch, sent_bytes=everyone,
              expected_bytes=expected_bytes(args.cp_attention, world, batch, rows, args.width,
                                            args.blocks, element_size))


def self_check(world_rows=24, batch=2, heads_per_rank=2, head_dim=8, seed=0):
    """Every attention this module offers against attend() on the whole sequence, in float64:
    {name: largest difference of the output and of the q, k and v gradients, on this rank's
    tokens}. Every rank draws the same whole q, k, v (one seed) and keeps its own tokens."""
    world, rank = dist.get_world_size(), dist.get_rank()
    heads = heads_per_rank * world  # Ulysses deals whole heads out to the ranks
    torch.manual_seed(seed)
    q, k, v, weight = (torch.randn(batch, heads, world_rows, head_dim, dtype=torch.float64)
                       for _ in range(4))
    found = {}
    for attention in ATTENTIONS:
        for causal in (False, True):
            every = torch.arange(world_rows) if causal else None
            whole = [t.clone().requires_grad_() for t in (q, k, v)]
            (attend(*whole, every, every) * weight).sum().backward()
            at = [positions(r, world, world_rows, causal) for r in range(world)]
            mine = at[rank]
            part = [t[:, :, mine].clone().requires_grad_() for t in (q, k, v)]
            ring = Ring(None, at if causal else None, Traffic())
            out = (RingAttention.apply(*part, ring) if attention == "ring"
                   else ulysses(*part, ring=ring))
            (out * weight[:, :, mine]).sum().backward()
            expected = attend(q, k, v, every, every)[:, :, mine]
            pairs = [(out, expected)] + [(p.grad, w.grad[:, :, mine])
                                         for p, w in zip(part, whole, strict=True)]
            found[f"{attention}{' causal' if causal else ''}"] = [
                (a - b).abs().max().item() for a, b in pairs]
    return found


if __name__ == "__main__":
    # torchrun --nproc-per-node 2 -m trainup.parallel.context_parallel: the self-check on gloo
    import json
    import os
    import sys
    dist.init_process_group("gloo")
    line = json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(),
                       "differences": self_check()}) + "\n"
    # one write of the whole line: the ranks share one pipe, and print() writes the text and the
    # newline apart (unbuffered), so another rank's line could land between them
    os.write(sys.stdout.fileno(), line.encode())
    dist.destroy_process_group()
