"""The plumbing of lesson 09 (_trainup_fsdp.py): what each ZeRO stage shards, how it is built, what each
rank holds, the collectives a step runs, and sharded checkpoints that reshard on load.

    --shard none        DDP: everything replicated; gradients all-reduced            (no ZeRO)
    --shard optimizer   ZeRO-1: Adam's state split over the ranks (ZeroRedundancyOptimizer)
    --shard gradients   ZeRO-2: gradients reduce-scattered too, each rank keeps its shard (GradientShards)
    --shard parameters  ZeRO-3: parameters too: FSDP2 fully_shard per block, then on the whole model
"""
import json
import math
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.distributed.optim.zero_redundancy_optimizer  # noqa: F401  before joining: see distributed.py
from torch.utils._python_dispatch import TorchDispatchMode

from . import UserError, checkpoint

# torch 2.13 names them *_single; older releases (a GPU machine's or Colab's torch) have only the old names
reduce_scatter_single = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
all_gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)

MODES = ("none", "optimizer", "gradients", "parameters")
ZERO_STAGE = {"none": 0, "optimizer": 1, "gradients": 2, "parameters": 3}
# Bytes per parameter of each state: (parameters, gradients, optimizer state)
FP32_ADAM = (4, 4, 8)          # what runs here: fp32 weights and gradients, Adam's exp_avg and exp_avg_sq
MIXED_ADAM = (2, 2, 12)        # the ZeRO paper: fp16 weights and gradients; fp32 master weights + Adam (K = 12)
SHARDED = {"none": (False, False, False), "optimizer": (False, False, True),
           "gradients": (False, True, True), "parameters": (True, True, True)}


def expected(mode, parameters, world_size, per_param=None):
    """Bytes per rank of (parameters, gradients, optimizer state) under a ZeRO stage: a state that is
    sharded is split over world_size ranks, the others are whole on every rank. per_param: by default
    FP32_ADAM, doubled in a --precision 64 run (every state in float64)."""
    per_param = per_param or tuple(b * torch.get_default_dtype().itemsize // 4 for b in FP32_ADAM)
    return tuple(b * parameters / (world_size if sharded else 1)
                 for b, sharded in zip(per_param, SHARDED[mode]))


def check_mesh(mesh, world_size):
    """--mesh must be the job's size (one dimension: every rank holds one shard); before anyone waits."""
    if mesh is not None and mesh != world_size:
        raise UserError(f"--mesh {mesh} does not match the job's {world_size} process(es): a 1-D device mesh "
                        f"holds every rank once; start {mesh} processes or leave out --mesh")


def check_model(mode, model):
    """ZeRO-3 here shards per block: the model must be the block stack (--model blocks)."""
    if mode == "parameters" and not hasattr(model, "blocks"):
        raise UserError(f"--shard parameters wraps each block of the model in fully_shard, and --model "
                        f"{type(model).__name__} has no blocks; use --model blocks (or --shard none|optimizer|gradients)")


class GradientShards:
    """ZeRO-2 by hand: parameters stay whole on every rank; as soon as a parameter's gradient is complete
    (a post-accumulate hook during backward) it is reduce-scattered and the whole gradient freed, so each
    rank keeps only its slice of every gradient. Adam steps on this rank's slices of the parameters (views
    of the same memory), then every rank all-gathers the updated slices back into whole parameters."""

    def __init__(self, model, optimizer_class, **optimizer_args):
        self.world, rank = dist.get_world_size(), dist.get_rank()
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.slices = []
        for p in self.params:
            per = math.ceil(p.numel() / self.world)  # padded so every rank's slice has the same length
            start, end = min(rank * per, p.numel()), min((rank + 1) * per, p.numel())
            self.slices.append((nn.Parameter(p.detach().view(-1)[start:end]), per))  # a view: no copy
            p.register_post_accumulate_grad_hook(self._reduce_scatter)
        self.index = {id(p): i for i, p in enumerate(self.params)}
        self.optimizer = optimizer_class([s for s, _ in self.slices], **optimizer_args)

    @torch.no_grad()
    def _reduce_scatter(self, p):
        piece, per = self.slices[self.index[id(p)]]
        full = torch.zeros(per * self.world, dtype=p.grad.dtype, device=p.grad.device)
        full[:p.numel()] = p.grad.view(-1)
        mine = torch.empty(per, dtype=p.grad.dtype, device=p.grad.device)
        reduce_scatter_single(mine, full)  # summed over the ranks, this rank's slice only
        piece.grad = mine[:piece.numel()].div_(self.world)  # the mean, as DDP's all-reduce gives
        p.grad = None  # the whole gradient is freed: ZeRO-2's saving

    @torch.no_grad()
    def step(self):
        self.optimizer.step()
        for p, (piece, per) in zip(self.params, self.slices):
            mine = torch.zeros(per, dtype=p.dtype, device=p.device)
            mine[:piece.numel()] = piece
            full = torch.empty(per * self.world, dtype=p.dtype, device=p.device)
            all_gather_single(full, mine)
            p.view(-1).copy_(full[:p.numel()])

    def zero_grad(self):
        self.optimizer.zero_grad()

    @property
    def param_groups(self):  # for the learning-rate scheduler
        return self.optimizer.param_groups

    def grads(self):
        return [s.grad for s, _ in self.slices]

    @property
    def state(self):
        return self.optimizer.state


def shard(model, mode, device, precision="32", optimizer_args=None):
    """(model, optimizer) for a ZeRO stage: model wrapped as the stage needs, Adam over what this rank updates."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP
    check_model(mode, model)
    optimizer_args = optimizer_args or {}
    ids = [device.index] if device.type == "cuda" else None
    if mode == "none":
        model = DDP(model, device_ids=ids)
        return model, torch.optim.Adam(model.parameters(), **optimizer_args)
    if mode == "optimizer":
        model = DDP(model, device_ids=ids)  # gradients all-reduced whole; only Adam's state is split
        return model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, **optimizer_args)
    if mode == "gradients":
        shards = GradientShards(model, torch.optim.Adam, **optimizer_args)
        return model, shards
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    # bf16 on the GPU: computed and all-gathered in bf16, gradients reduced and the master weights kept in fp32
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if precision == "bf16" else MixedPrecisionPolicy())
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)  # one all-gather per block, just before it runs
    fully_shard(model, mesh=mesh, mp_policy=policy)      # the rest (stem, head) as one group
    return model, torch.optim.Adam(model.parameters(), **optimizer_args)


def local_bytes(t):
    """Bytes this rank holds of a tensor: a DTensor's local shard only."""
    if t is None:
        return 0
    if hasattr(t, "to_local"):
        t = t.to_local()
    return t.numel() * t.element_size()


def held(model, optimizer):
    """(parameters, gradients, optimizer state) bytes this rank holds now. Adam's `step` counters (one
    number per tensor) are left out: they do not grow with the model."""
    params = list(model.parameters())
    grads = optimizer.grads() if isinstance(optimizer, GradientShards) else [p.grad for p in params]
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps the local Adam in .optim
    state = [v for s in inner.state.values() for k, v in s.items() if torch.is_tensor(v) and k != "step"]
    return (sum(local_bytes(p) for p in params), sum(local_bytes(g) for g in grads),
            sum(local_bytes(v) for v in state))


NAMES = {"allreduce_": "all_reduce", "broadcast_": "broadcast", "_allgather_base_": "all_gather",
         "allgather_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
         "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_": "reduce_scatter",
         "reduce_scatter_tensor_coalesced_": "reduce_scatter", "allreduce_coalesced_": "all_reduce"}


def _tensor_bytes(arg):
    if torch.is_tensor(arg):
        return local_bytes(arg)
    if isinstance(arg, (list, tuple)):
        return sum(_tensor_bytes(a) for a in arg)
    return 0


class Collectives(TorchDispatchMode):
    """Counts the collectives this rank runs while active, and their size: every c10d operation goes
    through the dispatcher, DDP's C++ all-reduce and FSDP2's all-gathers included. The bytes of a call
    are its whole (unsharded) buffer: the all-gather's output, the reduce-scatter's input."""

    def __init__(self):
        super().__init__()
        self.ops = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            base = func.__name__.split(".")[0]
            name = NAMES.get(base, base)
            if name in ("all_reduce", "broadcast", "all_gather", "reduce_scatter"):
                size = max(_tensor_bytes(a) for a in args[:2])
                calls, total = self.ops.get(name, (0, 0))
                self.ops[name] = (calls + 1, total + size)
        return func(*args, **(kwargs or {}))

    def record(self):
        return {k: {"calls": c, "bytes": b} for k, (c, b) in sorted(self.ops.items())}


def full_state(model):
    """The whole model's parameters on rank 0's CPU (gathered from the shards; empty elsewhere)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def save_full(path, state, epoch, args):
    """The whole model as one file, atomically: what checks.same_parameters reads."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with checkpoint.whole(path, tmp):
        torch.save({"model": state, "epoch": epoch, "args": checkpoint.plain(args)}, tmp)
        os.replace(tmp, path)


RESUMABLE = ("none", "parameters")  # get_state_dict knows DDP and FSDP2, not ZeroRedundancyOptimizer nor GradientShards


ARGS_FILE = "trainup_args.json"  # beside DCP's files: the flags of the run that saved, for a resume to check


def save_sharded(folder, model, optimizer, scheduler, epoch, args=None):
    """A torch.distributed.checkpoint (DCP) folder: every rank writes its own shards, with metadata that
    lets a job of any size load it, and rank 0 the run's flags (ARGS_FILE). Written to a temporary
    folder, then renamed by rank 0: a reader sees the old checkpoint or the new one."""
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict
    folder = Path(folder)
    tmp = folder.with_name(f".{folder.name}.tmp")
    if dist.get_rank() == 0 and tmp.exists():
        shutil.rmtree(tmp)
    dist.barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    try:
        dcp.save({"model": model_state, "optim": optim_state, "scheduler": scheduler.state_dict(), "epoch": epoch},
                 checkpoint_id=str(tmp))
    except (OSError, RuntimeError, CheckpointException) as e:  # every rank's failure, gathered: every rank gets it
        if isinstance(e, RuntimeError) and not any(m in str(e) for m in checkpoint.TORN):
            raise  # not a write that fell short: a defect, shown whole
        why = _why(e)
        full = checkpoint.no_room(folder.parent) or any(m in why for m in (*checkpoint.TORN, "No space"))
        if dist.get_rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(f"checkpoint {folder} could not be written ("
                        + ("the disk is full" if full else why) + "); the last whole checkpoint is "
                        "kept, nothing half-written is left") from None
    if dist.get_rank() == 0 and args is not None:
        with checkpoint.whole(folder, tmp):
            (tmp / ARGS_FILE).write_text(json.dumps(checkpoint.plain(args)))
    dist.barrier()
    if dist.get_rank() == 0:
        old = folder.with_name(f".{folder.name}.old")
        if folder.exists():
            os.replace(folder, old)
        os.replace(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def _why(e):
    """The first underlying failure of a CheckpointException (one per rank), else the error itself."""
    failures = getattr(e, "failures", None) or {}
    first = next(iter(failures.values()), e)
    first = first[0] if isinstance(first, tuple) else first  # DCP keeps (exception, its traceback) per rank
    return f"{type(first).__name__}: {getattr(first, 'strerror', None) or str(first).splitlines()[0][:120]}"


def load_sharded(folder, model, optimizer, scheduler, args=None):
    """Restore a DCP checkpoint into this job, whatever its size; the epoch to start from (1 if none).
    args: this run's flags, checked against those the saving run wrote (checkpoint.SAME_ON_RESUME)."""
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    if not Path(folder).exists():
        return 1
    saved = Path(folder) / ARGS_FILE
    if args is not None and saved.exists():
        try:
            checkpoint.same_run(folder, json.loads(saved.read_text()), args)
        except ValueError:  # torn or foreign: DCP's own load below says whether the rest is whole
            pass
    model_state, optim_state = get_state_dict(model, optimizer)  # this job's layout: DCP fills it from the files
    state = {"model": model_state, "optim": optim_state, "scheduler": scheduler.state_dict(), "epoch": 0}
    try:
        dcp.load(state, checkpoint_id=str(folder))
    except (Exception, CheckpointException) as e:  # DCP's, every rank's failure in one: a BaseException
        raise UserError(f"checkpoint {folder} cannot be loaded into this run ({_why(e)}): it is damaged, or "
                        f"holds another model or mode; resume with the flags it was saved with") from None
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    scheduler.load_state_dict(state["scheduler"])
    return state["epoch"] + 1
