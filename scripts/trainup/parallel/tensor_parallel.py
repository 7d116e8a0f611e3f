"""The plumbing of tensor parallelism: the job's shape (tensor x data parallel), the device mesh, the
plan that cuts each FeedForward block, and the measurements (bytes each rank holds, collectives per step).

A job of dp x tp processes: rank = dp_index * tp + tp_index, so the tp processes that share one layer
are neighbours (on a GPU server: the GPUs of one machine, linked by NVLink).
"""
import json
import logging
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .. import UserError, checkpoint, cli, config
from . import sharding
from ..devices import synchronize

# Megatron-LM's cut of an MLP: `up` by output features (each rank a slice of the hidden layer), `down` by
# input features (each rank's slice gives a partial sum of the output; an all-reduce adds them up).
PLAN = {"up": "colwise", "down": "rowwise"}
STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}


def add_flags(p):
    """Lesson 09's flags: the mesh's shape (--tp, --dp) and the MLP block stack (--hidden)."""
    p.add_argument("--tp", type=cli.positive(int), default=None,
                   help="processes that share every layer (default: all of them, or world / --dp)")
    p.add_argument("--dp", type=cli.positive(int), default=None,
                   help="data-parallel replicas (FSDP over them); --dp x --tp must be the "
                        "number of processes")
    cli.add_blocks(p, "the tensor-parallel lesson", blocks=2, width=64,
                   what="MLP blocks in the model")
    p.add_argument("--hidden", type=cli.positive(int), default=256,
                   help="hidden features of each block (cut over tp)")
    p.set_defaults(tp_layout=None)  # check_shape's, or four_d.folder's: the mesh a checkpoint is of


def check_shape(args, world_size):
    """(args with the layout, tp, dp) for this job, or one sentence on what does not fit; before
    anyone waits for anyone."""
    tp = args.tp or max(world_size // (args.dp or 1), 1)
    if world_size % tp:
        raise UserError(f"--tp {tp} does not divide the {world_size} process(es) of this job: tensor parallelism "
                        f"needs whole groups of {tp}; use a --tp that divides {world_size}")
    dp = args.dp or world_size // tp
    if dp * tp != world_size:
        raise UserError(f"the mesh --dp {dp} x --tp {tp} needs {dp * tp} processes, and this job has {world_size}; "
                        f"start it with torchrun --nproc-per-node {dp * tp}, or change --dp")
    if args.hidden % tp:
        raise UserError(f"--hidden {args.hidden} cannot be cut into --tp {tp} equal slices: each process takes "
                        f"hidden/tp features of every block; use a multiple of {tp}")
    if args.batch_size % dp:
        raise UserError(f"--batch-size {args.batch_size} cannot be split evenly over --dp {dp} data-parallel groups")
    # which slices each rank holds: kept with a checkpoint
    return config.replaced(args, tp_layout=f"--dp {dp} --tp {tp}"), tp, dp


def coordinates(rank, tp):
    """(dp index, tp index) of a rank: the mesh's row and column."""
    return divmod(rank, tp)


def mesh_for(device, dp, tp):
    """The 2-D device mesh: dimension 'dp' (replicas of the model, each a shard of the data) by 'tp'
    (processes that share every layer). init_device_mesh makes one process group per row and column."""
    return init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))


def parallelize(model, mesh):
    """Cut every block's linear layers over the mesh's 'tp' dimension; with dp > 1, shard the model over 'dp'
    with FSDP2 (fully_shard: per block, then the whole model), which also averages gradients over it."""
    plan = {name: STYLES[style]() for name, style in PLAN.items()}
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], plan)
    if mesh["dp"].size() > 1:
        for block in model.blocks:
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    return model


def one_per_replica(meter, tp_index):
    """The tp processes of a replica saw the same samples: only one of them counts them in the
    job's sums (the others give an empty meter)."""
    return meter if tp_index == 0 else type(meter)()


def _local(p):
    return p.to_local() if isinstance(p, DTensor) else p


def tp_sharded(p, mesh):
    """True for a parameter cut over the 'tp' dimension (a Shard placement on it)."""
    if not isinstance(p, DTensor) or "tp" not in (p.device_mesh.mesh_dim_names or ()):
        return False
    return isinstance(p.placements[p.device_mesh.mesh_dim_names.index("tp")], Shard)


def parameter_bytes(model, mesh=None):
    """What this rank holds: bytes of all its parameters, and of those cut over 'tp'; and the same two
    for the whole model (every parameter counted once)."""
    held = held_sharded = full = full_sharded = 0
    for p in model.parameters():
        local, whole = _local(p).numel() * p.element_size(), p.numel() * p.element_size()
        cut = mesh is not None and tp_sharded(p, mesh)
        held += local
        full += whole
        held_sharded += local if cut else 0
        full_sharded += whole if cut else 0
    return dict(param_bytes=held, sharded_bytes=held_sharded, full_param_bytes=full, full_sharded_bytes=full_sharded)


def full_state(model):
    """The whole model's parameters as plain tensors, on every rank (DTensors gathered with full_tensor():
    a collective, so every rank calls it)."""
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)  # 2-D gathers: a note
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu() for k, v in model.state_dict().items()}


# Collectives as the dispatcher sees them: DTensor's functional collectives (tensor parallelism) and the
# c10d ops that FSDP calls (data parallelism). Name -> what the lesson calls it.
COLLECTIVES = {
    "all_reduce": "all_reduce", "allreduce_": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "all_gather_into_tensor": "all_gather", "_allgather_base_": "all_gather", "allgather_": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast": "broadcast", "broadcast_": "broadcast", "all_to_all_single": "all_to_all",
}
NAMESPACES = ("_c10d_functional", "c10d_functional", "c10d")


class CommCounter(TorchDispatchMode):
    """Counts the collectives this process starts while active, with their size in bytes (the whole tensor
    the collective acts on: an all-reduce's input, an all-gather's output, a reduce-scatter's input) and
    the mesh dimension they run on. A dispatch mode sees every operator call: it lets DTensor turn its
    operations into collectives first (NotImplemented), then notes the collectives among them."""

    def __init__(self, mesh=None):
        super().__init__()
        self.phase, self.calls = "forward", {}
        self.groups = {mesh[d].get_group().group_name: d for d in mesh.mesh_dim_names} if mesh is not None else {}

    def _dimension(self, args):
        """The mesh dimension a collective ran on: functional collectives name their group, c10d ops
        carry the ProcessGroup itself (boxed for the dispatcher)."""
        for a in args:
            name = a if isinstance(a, str) else None
            if isinstance(a, torch._C.ScriptObject):
                try:
                    name = dist.ProcessGroup.unbox(a).group_name
                except RuntimeError:  # another boxed argument (a ReduceOp)
                    continue
            if name in self.groups:
                return self.groups[name]
        return "world"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # DTensor first: it decides which collectives an operation needs
        out = func(*args, **(kwargs or {}))
        name = func._overloadpacket.__name__
        if func.namespace in NAMESPACES and name in COLLECTIVES:
            tensors = [t for t in tree_leaves((args, out)) if isinstance(t, torch.Tensor)]
            size = max((t.numel() * t.element_size() for t in tensors), default=0)
            key = (self.phase, COLLECTIVES[name], self._dimension(args))
            calls, total = self.calls.get(key, (0, 0))
            self.calls[key] = (calls + 1, total + size)
        return out

    def on_first_step(self, model, optimizer, device):
        """Count the collectives of the first training step, by phase, and time it, through hooks:
        from the model's forward (forward) to its end (backward: the loss starts none), then
        optimizer.step (step); on a GPU the step's work, not its launch. Returns self."""
        hooks = []

        def phase(name):
            return lambda *_: setattr(self, "phase", name)  # a hook that returns None

        def start(module, args):
            if module.training and len(hooks) == 1:  # the first training forward only
                self.__enter__()
                self.phase, self.tick = "forward", time.perf_counter()
                hooks.append(model.register_forward_hook(phase("backward")))
                hooks.append(optimizer.register_step_pre_hook(phase("step")))
                hooks.append(optimizer.register_step_post_hook(finish))

        def finish(*_):
            synchronize(device)
            self.step_s = time.perf_counter() - self.tick
            self.__exit__(None, None, None)
            for h in hooks:
                h.remove()

        hooks.append(model.register_forward_pre_hook(start, prepend=True))  # before FSDP's gathers
        return self

    def rows(self):
        """[phase, op, mesh dimension, calls, bytes], one row per kind of collective."""
        return [[phase, op, dim, calls, size] for (phase, op, dim), (calls, size) in self.calls.items()]


def placement(ctx, tp):
    """Where every rank sits in the mesh (gathered, so rank 0 can log it)."""
    dp_index, tp_index = coordinates(ctx.rank, tp)
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, dict(rank=ctx.rank, dp=dp_index, tp=tp_index, device=str(ctx.device)))
    return everyone


def log_layout(log, model, mesh, ctx, args, tp, dp, plan=PLAN, **extra):
    """The "tp" record: the mesh, the plan, where every rank sits and the bytes each one holds
    (all of its parameters, and those cut over 'tp'), and the same two for the whole model."""
    held = gathered(parameter_bytes(model, mesh))  # what each rank holds
    log.write("tp", tp=tp, dp=dp, mesh=[dp, tp], blocks=args.blocks, width=args.width,
              hidden=args.hidden, plan=plan, placement=placement(ctx, tp), **extra,
              param_bytes=[h["param_bytes"] for h in held],
              sharded_bytes=[h["sharded_bytes"] for h in held],
              full_param_bytes=held[0]["full_param_bytes"],
              full_sharded_bytes=held[0]["full_sharded_bytes"])


def log_comm(log, counter, epoch, per_replica):
    """The "tp_comm" record: the collectives of the one step the counter counted, every rank's."""
    log.write("tp_comm", epoch=epoch, step=1, per_replica_batch=per_replica, step_s=counter.step_s,
              collectives=gathered(counter.rows()))


def gathered(value):
    """One value from every rank, in rank order."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    return everyone


def save_model(path, state, epoch, args):
    """The whole model's parameters (gathered), atomically: what checks.same_parameters reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with checkpoint.whole(path, tmp):  # a full disk: one sentence, the last whole one kept
        torch.save({"model": state, "epoch": epoch, "args": checkpoint.plain(args)}, tmp)
        os.replace(tmp, path)
    return path


def save(folder, model, optimizer, scheduler, epoch, args, position=None, flat=False):
    """Every rank saves the slices it holds and their optimizer state, rank 0 the flags (with
    args.tp_layout) and, after a stop, where it stopped: a DCP checkpoint
    (sharding.save_sharded; flat: its optimizer state keyed by parameter name)."""
    sharding.save_sharded(folder, model, optimizer, scheduler, epoch, args, position, flat)


def saver(folder, model, optimizer, scheduler, args, flat=False):
    """What a stop (preempt.Stopper) calls on every rank: save() with where it stopped."""
    def save_at_stop(epochs_done, position):
        save(folder, model, optimizer, scheduler, epochs_done, args, position, flat)
    return save_at_stop


def load(folder, model, optimizer, scheduler, args, flat=False):
    """--resume: every rank takes back its slices; (the epoch to start from, where a stop left it:
    None at an epoch's end). A checkpoint of another mesh is one sentence: a stop's position holds
    each rank's random states and share of the data, so a run goes on on the mesh it saved from."""
    saved = Path(folder) / sharding.ARGS_FILE
    try:
        theirs = json.loads(saved.read_text()).get("tp_layout") if saved.exists() else None
    except (OSError, ValueError):  # torn: DCP's own load below says so in its sentence
        theirs = None
    if theirs and theirs != args.tp_layout:
        raise UserError(f"checkpoint {folder} was saved by a job laid out as {theirs}, and this "
                        f"one is {args.tp_layout}: a run resumes on the mesh it was saved from; "
                        f"resume with that layout, or use another --run-name")
    epoch = sharding.load_sharded(folder, model, optimizer, scheduler, args, flat)
    return epoch, sharding.saved_position(folder)
