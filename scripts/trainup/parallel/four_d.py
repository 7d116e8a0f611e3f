"""The plumbing of _trainup_4d.py: lesson 09c's transformer on a mesh of four dimensions
(trainup/parallel/parallel_dims.py), each dimension applied as the course's lesson for it applies
it, in torchtitan's order (torchtitan/models/llama3/infra/parallelize.py and pipeline.py):

1. pipeline ("pp"): every rank builds the whole model from the seed and keeps its stage, a run of
   consecutive layers (the embedding with the first, the norm and head with the last), as lesson
   06 cuts its block stack; a PipelineStage and a GPipe schedule run the micro-batches;
2. context ("cp"): the stage's tokens are this rank's block of the image's rows (lesson 09d);
   attention by ring over the "cp" group; the class scores, a mean over the tokens, summed over it;
3. tensor ("tp"): each layer cut as Megatron-LM cuts it (lesson 09c; no sequence parallelism, so
   the activations a stage sends are whole on every tp rank);
4. data ("dp"): FSDP2 (fully_shard) per layer, then the stage, last, on the TP-cut DTensors. As
   torchtitan does (its dp_shard_cp), cp is folded into FSDP's group: the cp ranks of a replica
   hold the same parameters, so fully_shard shards them over dp x cp processes (one flattened
   mesh dimension). Here every cp rank computes the same loss (the scores are summed over cp), so
   its gradients are its tokens' shares of that loss's: they must be summed over cp and averaged
   over dp. One reduce-scatter does both, its divide factor set to dp, not dp x cp.
"""
import logging

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import pipelining
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

from .. import checkpoint, config
from . import context_parallel as cp
from ..meter import Meter
from .parallel_dims import NAMES
from . import tensor_parallel as tpar
from . import tp_transformer


class Stage(nn.Module):
    """One pipeline stage of a transformer.Classifier: its layers [first, end), with the
    embedding if it is the first and the norm and head if it is the last, under the whole model's
    parameter names (its state dict a part of the model's). rows: the token positions this rank
    holds (context parallel), of `tokens` in all; cp_group: where the class scores are summed."""

    def __init__(self, model, first, end, is_first, is_last, rows=None, tokens=None,
                 cp_group=None):
        super().__init__()
        self.embed = model.embed if is_first else None
        self.layers = nn.ModuleDict({str(i): model.layers[i] for i in range(first, end)})
        self.norm = model.norm if is_last else None
        self.head = model.head if is_last else None
        self.rows, self.tokens, self.cp_group = rows, tokens, cp_group

    def forward(self, x):
        if self.embed is not None:  # images in: each row a token, this rank's rows only
            x = x.permute(0, 2, 1, 3).flatten(2)
            if self.rows is not None:
                x = x[:, self.rows]
            x = self.embed(x)
        for layer in self.layers.values():
            x = layer(x)
        if self.head is None:
            return x
        scores = self.head(self.norm(x)).mean(1)  # the mean over this rank's tokens
        if self.cp_group is None:
            return scores
        # its share of the mean over every token, summed over the cp ranks
        return cp.Summed.apply(scores * (len(self.rows) / self.tokens), self.cp_group)


def stage_of(model, dims, where, mesh, tokens):
    """This rank's Stage of the whole model (layers split evenly: dims.check_model)."""
    per_stage = len(model.layers) // dims.pp
    first = where["pp"] * per_stage
    rows = cp.positions(where["cp"], dims.cp, tokens, zigzag=False) if dims.cp > 1 else None
    group = mesh["cp"].get_group() if dims.cp > 1 else None
    return Stage(model, first, first + per_stage, where["pp"] == 0, where["pp"] == dims.pp - 1,
                 rows, tokens, group)


def fsdp_mesh(mesh, dims):
    """The dimension FSDP shards over: "dp", or "dp" and "cp" flattened into one (torchtitan's
    dp_shard_cp); None where it is one process."""
    if dims.dp * dims.cp == 1:
        return None
    if dims.cp == 1:
        return mesh["dp"]
    return mesh["dp", "cp"]._flatten("dp_cp")  # private, as torchtitan calls it


def parallelize(stage, mesh, dims, traffic=None):
    """Tensor parallel, then the ring over 'cp', then FSDP2 over dp (x cp): torchtitan's order
    (fully_shard last, on the parameters TP has made DTensors). Returns the FSDP mesh (or None)."""
    if dims.tp > 1:
        per_layer = tp_transformer.plan(False)[1]  # no sequence parallelism: whole activations
        for layer in stage.layers.values():
            parallelize_module(layer, mesh["tp"], per_layer)
    if dims.cp > 1:
        ring = cp.Ring(mesh["cp"].get_group(), None, traffic or cp.Traffic())
        for layer in stage.layers.values():  # q, k, v: this rank's heads (tp), its rows (cp)
            layer.attn.scores = lambda q, k, v: cp.RingAttention.apply(q, k, v, ring)
    # each parameter's shape on this rank before FSDP cuts it (its tp slice): what FSDP gathers
    stage.unsharded = [(p.to_local() if isinstance(p, DTensor) else p).shape
                       for p in stage.parameters()]
    shard_over = fsdp_mesh(mesh, dims)
    if shard_over is not None:
        # with micro-batches, parameters gathered once a step and kept until backward (as
        # torchtitan does under pp): not gathered again for every micro-batch's forward
        keep = dims.pp > 1
        for layer in stage.layers.values():
            fully_shard(layer, mesh=shard_over, reshard_after_forward=not keep)
        fully_shard(stage, mesh=shard_over, reshard_after_forward=not keep)
        for module in stage.modules():  # a cp rank's gradient is its tokens' share: summed
            if hasattr(module, "set_gradient_divide_factor"):
                module.set_gradient_divide_factor(float(dims.dp))
    return shard_over


class Pipe:
    """This rank's stage and the GPipe schedule that drives it over the 'pp' group."""

    def __init__(self, stage, dims, mesh, device, microbatches):
        self.stage = pipelining.PipelineStage(stage, dims.coordinates(dist.get_rank())["pp"],
                                              dims.pp, device, group=mesh["pp"].get_group())
        # the micro-batch losses averaged, the gradients / microbatches: the batch's mean
        self.schedule = pipelining.ScheduleGPipe(self.stage, microbatches,
                                                 loss_fn=F.cross_entropy)
        self.first, self.last = self.stage.is_first, self.stage.is_last

    def run(self, x, y):
        """One step's forward and backward; on the last stage the scores and the mean loss."""
        losses = []
        out = self.schedule.step(*((x,) if self.first else ()),
                                 target=y if self.last else None, losses=losses)
        return (out, torch.stack(losses).mean()) if self.last else (None, None)

    @torch.no_grad()
    def scores(self, x, y):
        """Forward only (the test set); the scores on the last stage, None elsewhere."""
        out = self.schedule.eval(*((x,) if self.first else ()), target=y if self.last else None)
        return out if self.last else None


P2P = {"send": "send", "recv_": "recv"}


class Counter(tpar.CommCounter):
    """lesson 09c's counter of collectives by mesh dimension, with the flattened FSDP dimension
    named and the pipeline's and the ring's point-to-point sends counted too; with `holds`
    (stage, optimizer), what the rank holds at the counted step's end (held) too."""

    def __init__(self, mesh, shard_over, step=1, holds=None):
        super().__init__(mesh)
        self.step = step  # the training step it counts
        if shard_over is not None:
            self.groups[shard_over.get_group().group_name] = shard_over.mesh_dim_names[0]
        self.phase = "step"
        self.holds, self.held = holds, None
        self.ran = False  # step None (steady_step): none

    def __enter__(self):
        self.ran = True
        return super().__enter__()

    def __exit__(self, *exc):
        out = super().__exit__(*exc)
        if self.holds is not None:  # after optimizer.step, before zero_grad: all three held
            self.held = held(*self.holds)
        return out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._overloadpacket.__name__
        if name not in P2P or func.namespace != "c10d":
            return super().__torch_dispatch__(func, types, args, kwargs)
        out = func(*args, **(kwargs or {}))
        size = sum(t.numel() * t.element_size() for t in args[0])  # the tensors it moves
        key = (self.phase, P2P[name], self._dimension(args))
        calls, total = self.calls.get(key, (0, 0))
        self.calls[key] = (calls + 1, total + size)
        return out


def steady_step(steps, saved):
    """The step of epoch 1 (of `steps`) that the Counter counts: this run's second, as its first
    also infers the stages' shapes; step 2, or, resumed inside epoch 1 (saved: where a stop left
    it), the second after the stop. None where this run takes no such step."""
    if not saved:
        return min(2, steps)
    step = saved["step"] + 2
    return step if saved["epoch"] == 1 and step <= steps else None


def expected(stage, dims, where, batch, rows, width, classes, element_size):
    """{(collective, mesh dimension): bytes} this rank moves in one steady training step (not
    the first: it also infers the stages' shapes), by the formulas. batch: the replica's samples a
    step; a token's activation: width values; t = batch x rows / cp tokens held.
    tp: per layer 2 all-reduces in forward (after proj, after fc2) and 2 in backward, each of the
    whole activation (t x width), whatever the micro-batches (they add up to the batch);
    pp: every stage but the last sends its activations on (t x width), every stage but the first
    the gradients back: the same bytes;
    cp: the ring's key and value blocks (context_parallel.expected_bytes, with this rank's heads:
    width / tp), and on the last stage the all-reduce of the class scores (batch x classes);
    dp x cp: FSDP's all-gather (once a step, kept for backward where there are micro-batches; in
    forward and again in backward without) and its reduce-scatter, each of the stage's
    parameters, this rank's tp slices, whole; fully_shard cuts each by its first dimension into
    dp x cp equal shards, padded: ceil(rows / (dp x cp)) rows each."""
    layers = len(stage.layers)
    activation = batch * rows // dims.cp * width * element_size
    out = {}
    if dims.tp > 1:
        out["all_reduce", "tp"] = 4 * layers * activation
    if dims.pp > 1:
        sends = (where["pp"] < dims.pp - 1) + (where["pp"] > 0)
        out["send", "pp"] = out["recv", "pp"] = sends * activation
    if dims.cp > 1:
        ring = cp.expected_bytes("ring", dims.cp, batch, rows, width // dims.tp, layers,
                                 element_size)
        out["send", "cp"] = out["recv", "cp"] = ring["forward"] + ring["backward"]
        if where["pp"] == dims.pp - 1:
            out["all_reduce", "cp"] = batch * classes * element_size
    if dims.dp * dims.cp > 1:
        name = "dp_cp" if dims.cp > 1 else "dp"
        shards = dims.dp * dims.cp
        padded = sum(-(-shape[0] // shards) * shards * shape[1:].numel()
                     for shape in stage.unsharded) * element_size
        gathers = 1 if dims.pp > 1 else 2
        out["all_gather", name] = gathers * padded
        out["reduce_scatter", name] = padded
    return out


TERMS = ("param", "grad", "optim")  # lessons/bylesson/planner.states' terms, in its order


def local_bytes(tensor):
    """Bytes of this rank's part of a tensor: a DTensor's local shard (FSDP2's unpadded chunk of
    its tp slice), else the whole tensor."""
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def held(stage, optimizer):
    """{term: [bytes in the layers, bytes in the embedding, norm and head]} this rank holds of its
    stage's parameters, their gradients and the optimizer's state (Adadelta: two values a
    parameter, and a step count per parameter tensor): the layers are what lessons/bylesson/planner's
    model counts, the rest it leaves out."""
    out = {term: [0, 0] for term in TERMS}
    for name, p in stage.named_parameters():
        part = 0 if name.startswith("layers.") else 1
        grads = [] if p.grad is None else [p.grad]
        for term, tensors in zip(TERMS, ([p], grads, optimizer.state.get(p, {}).values())):
            out[term][part] += sum(local_bytes(t) for t in tensors if torch.is_tensor(t))
    return out


def comm_table(counted, expected):
    """[mesh dimension, collective, calls, bytes, expected bytes] for this rank's counted step,
    every kind of collective the formulas or the count name."""
    seen = {(op, dim): (calls, size) for _, op, dim, calls, size in counted}
    kinds = sorted(set(seen) | set(expected), key=lambda k: (k[1], k[0]))
    return [[dim, op, seen.get((op, dim), (0, 0))[0], seen.get((op, dim), (0, 0))[1],
             expected.get((op, dim))] for op, dim in kinds]


@torch.no_grad()
def evaluate(stage, pipe, loader, device):
    """The test set's loss and accuracy, summed on the last stage's ranks (empty elsewhere)."""
    stage.eval()
    meter = Meter()
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        logits = stage(x) if pipe is None else pipe.scores(x, y)
        if logits is not None:
            meter.add(F.cross_entropy(logits, y), logits, y)
    return meter


def log_layout(log, dims, args, rank):
    """The "4d" record: the mesh's shape, the model's size, every rank's place in the mesh."""
    log.write("4d", layout=dims.layout(), mesh=dict(zip(NAMES, dims.shape)),
              microbatches=args.microbatches if dims.pp > 1 else 1, blocks=args.blocks,
              heads=args.heads, width=args.width, hidden=args.hidden,
              placement=tpar.gathered(dict(rank=rank, **dims.coordinates(rank))))


def log_comm(log, counter, expected, is_main):
    """The "4d_comm" record (every rank's counted step against its formulas) and the
    "4d_memory" record (every rank's bytes held at that step's end, Counter.held), and rank 0's
    table printed: a row per mesh dimension and collective. Nothing where the counter counted no
    step (steady_step: a run resumed too late in epoch 1, or after it)."""
    if not counter.ran:
        return
    everyone = tpar.gathered(comm_table(counter.rows(), expected))
    log.write("4d_comm", step=counter.step, columns=COLUMNS, ranks=everyone)
    if counter.holds is not None:
        log.write("4d_memory", step=counter.step, ranks=tpar.gathered(counter.held))
    if is_main:
        print(f"rank 0, training step {counter.step}: collectives by mesh dimension")
        print("  ".join(f"{c:>14}" for c in COLUMNS))
        for row in everyone[0]:
            print("  ".join(f"{'-' if v is None else v:>14}" for v in row))


COLUMNS = ["dimension", "collective", "calls", "bytes", "formula_bytes"]


def folder(args, dims):
    """Where every rank saves its shards of its stage (save: a DCP checkpoint), the layout kept
    beside it with the flags: load refuses, in one sentence, a checkpoint of another layout (a
    stop's position holds each rank's random states and share of the data, so a run resumes on
    the mesh it saved from). Returns args with the layout, and the folder."""
    args = config.replaced(args, tp_layout=dims.layout())
    return args, checkpoint.path_for(args).with_suffix(".dcp")


def save(folder, stage, optimizer, scheduler, epoch, args, position=None):
    """Every rank saves its shards of its stage's slices and their optimizer state, rank 0 the
    flags and, after a stop, where it stopped (tensor_parallel.save); the optimizer's state keyed
    by parameter name (sharding.states' flat): the stages hold different parameters."""
    tpar.save(folder, stage, optimizer, scheduler, epoch, args, position, flat=True)


def saver(folder, stage, optimizer, scheduler, args):
    """What a stop (preempt.Stopper) calls on every rank: save() with where it stopped."""
    return tpar.saver(folder, stage, optimizer, scheduler, args, flat=True)


def load(folder, stage, optimizer, scheduler, args):
    """--resume: every rank takes back its shards (tensor_parallel.load); (the epoch to start
    from, where a stop left it: None at an epoch's end). Another layout is one sentence."""
    return tpar.load(folder, stage, optimizer, scheduler, args, flat=True)


def full_state(stage):
    """The whole model's parameters, on rank 0 (None elsewhere): every stage's gathered from its
    shards and slices (full_tensor: collective over the stage's ranks), then sent to rank 0."""
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)  # a note
    mine = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu()
            for k, v in stage.state_dict().items()}
    everyone = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, everyone, dst=0)
    if everyone is None:
        return None
    merged = {}
    for state in everyone:
        merged.update(state)
    return merged
