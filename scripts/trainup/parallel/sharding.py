"""The plumbing of lesson 09 (_trainup_fsdp.py): what each ZeRO stage shards, how it is built, what each
rank holds, the collectives a step runs, and sharded checkpoints that reshard on load.

    --shard none        DDP: everything replicated; gradients all-reduced            (no ZeRO)
    --shard optimizer   ZeRO-1: Adam's state split over the ranks (ZeroRedundancyOptimizer)
    --shard gradients   ZeRO-2: gradients reduce-scattered too, each rank keeps its shard (GradientShards)
    --shard parameters  ZeRO-3: parameters too: FSDP2 fully_shard per block, then on the whole model
    --shard gradients_fsdp  ZeRO-2 as PyTorch ships it: fully_shard(reshard_after_forward=False),
                        parameters gathered from forward to the end of backward, else sharded
"""
import collections
import contextlib
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

from .. import UserError, checkpoint, cli, config, distributed

# torch 2.13 names them *_single; older releases (a GPU machine's or Colab's torch) have only the old names
reduce_scatter_single = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
all_gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)

MODES = ("none", "optimizer", "gradients", "parameters", "gradients_fsdp")
ZERO_STAGE = {"none": 0, "optimizer": 1, "gradients": 2, "parameters": 3, "gradients_fsdp": 2}
STAGES = MODES[:4]  # the ZeRO paper's stages, one mode each: what its formulas count
FULLY_SHARDED = ("parameters", "gradients_fsdp")  # fully_shard per block: the block stack only
# Bytes per parameter of each state: (parameters, gradients, optimizer state)
FP32_ADAM = (4, 4, 8)          # what runs here: fp32 weights and gradients, Adam's exp_avg and exp_avg_sq
MIXED_ADAM = (2, 2, 12)        # the ZeRO paper: fp16 weights and gradients; fp32 master weights + Adam (K = 12)
# FSDP2's MixedPrecisionPolicy(bf16, reduce fp32): fp32 shards of weights and gradients, fp32 Adam;
# the bf16 weights exist only while a unit is gathered
FSDP2_BF16 = (4, 4, 8)
# what is sharded after the step (where measure_step counts): gradients_fsdp's whole parameters
# live from forward to the end of backward only (its peak: "forward_param_bytes")
SHARDED = {"none": (False, False, False), "optimizer": (False, False, True),
           "gradients": (False, True, True), "parameters": (True, True, True),
           "gradients_fsdp": (True, True, True)}


def expected(mode, parameters, world_size, per_param=None):
    """Bytes per rank of (parameters, gradients, optimizer state) under a ZeRO stage: a state that is
    sharded is split over world_size ranks, the others are whole on every rank. per_param: by default
    FP32_ADAM, doubled in a --precision 64 run (every state in float64)."""
    per_param = per_param or tuple(b * torch.get_default_dtype().itemsize // 4 for b in FP32_ADAM)
    return tuple(b * parameters / (world_size if sharded else 1)
                 for b, sharded in zip(per_param, SHARDED[mode]))


def add_flags(p):
    """Lesson 09's flags: the ZeRO stages to run, the block stack's size, a sharded checkpoint to
    start from, the mesh's size and the device (a GPU when there is one); FSDP2's options, and
    --compile (lesson 09f, trainup/parallel/compiled.py)."""
    p.add_argument("--shard", default="parameters",
                   help="what is split over the ranks, or several comma-separated: "
                        + ", ".join(MODES))
    p.add_argument("--blocks", type=cli.positive(int), default=8,
                   help="identical blocks in the model")
    p.add_argument("--width", type=cli.positive(int), default=256, help="features of each block")
    p.add_argument("--resume-from", default=None, metavar="RUN",
                   help="start from the sharded checkpoint of run RUN (saved by a job of any "
                        "size)")
    p.add_argument("--mesh", type=cli.positive(int), default=None,
                   help="processes in the device mesh (the job's size)")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--replicate", type=cli.positive(int), default=1, metavar="R",
                   help="hybrid sharding (HSDP): R replicas, each sharded over world size / R ranks "
                        "(a 2-D mesh; --shard parameters or gradients_fsdp)")
    p.add_argument("--prefetch", type=cli.positive(int), default=None, metavar="N",
                   help="FSDP2's explicit prefetch: each block starts gathering the next N "
                        "(--shard parameters or gradients_fsdp)")
    p.add_argument("--offload", action="store_true",
                   help="FSDP2's CPUOffloadPolicy: shards, gradients and Adam's state in host "
                        "memory (--shard parameters or gradients_fsdp)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile each block before fully_shard shards it (lesson 09f; "
                        "--shard parameters or gradients_fsdp)")
    p.add_argument("--meta-init", action="store_true",
                   help="every rank but 0 builds the model on the meta device (no memory); rank "
                        "0's values are cut into each rank's shards (--shard parameters or "
                        "gradients_fsdp)")


def check_flags(p, args):
    """args with --shard split into its modes; p.error on modes, resumes and precisions that do not
    go together. Returns args."""
    args = config.replaced(args, shard=tuple(args.shard.split(",")))
    unknown = [m for m in args.shard if m not in MODES]
    if unknown or len(set(args.shard)) != len(args.shard):
        p.error(f"--shard takes {', '.join(MODES)} (each once, comma-separated), "
                f"got {','.join(args.shard)}")
    if (args.resume or args.resume_from) and not set(args.shard) <= set(RESUMABLE):
        p.error(f"--resume: sharded checkpoints are written for --shard {', '.join(RESUMABLE)} "
                f"only (ZeRO-2 by hand, GradientShards, has no checkpoint format)")
    blocks_only = ("gradients", *FULLY_SHARDED)
    if args.model != "blocks" and set(blocks_only) & set(args.shard):
        p.error(f"--shard {'/'.join(m for m in args.shard if m in blocks_only)} "
                f"is shown on the block stack (fully_shard per block), and --model {args.model} "
                f"has no blocks; use --model blocks")
    if args.replicate > 1 and not set(args.shard) <= set(FULLY_SHARDED):
        p.error(f"--replicate builds fully_shard's 2-D mesh: use it with --shard "
                f"{' or '.join(FULLY_SHARDED)} only, got --shard {','.join(args.shard)}")
    for flag, value in (("--prefetch", args.prefetch), ("--offload", args.offload)):
        if value and not set(args.shard) <= set(FULLY_SHARDED):
            p.error(f"{flag} is an option of FSDP2's fully_shard: use it with --shard "
                    f"{' or '.join(FULLY_SHARDED)} only, got --shard {','.join(args.shard)}")
    if args.compile and not set(args.shard) <= set(FULLY_SHARDED):
        p.error(f"--compile compiles each block before fully_shard shards it: use it with --shard "
                f"{' or '.join(FULLY_SHARDED)} only, got --shard {','.join(args.shard)}")
    if args.meta_init and not set(args.shard) <= set(FULLY_SHARDED):
        p.error(f"--meta-init hands each rank its shards of fully_shard's parameters: use it with "
                f"--shard {' or '.join(FULLY_SHARDED)} only, got --shard {','.join(args.shard)}")
    if args.precision == "bf16" and args.shard != ("parameters",):
        p.error("--precision bf16 is FSDP's MixedPrecisionPolicy here: use it with --shard "
                "parameters alone")
    return args


BUILT = {}  # what this rank's model held when built, before shard(): "bytes" (log_run's record)


def building(args, ctx):
    """Where this rank builds the model: with --meta-init every rank but 0 builds it on the meta
    device (shapes, no memory; a model too large for one rank's memory can still be sharded), and
    shard() hands out rank 0's values; else in memory, the same on every rank (same seed)."""
    meta = args.meta_init and ctx.rank > 0
    return torch.device("meta") if meta else contextlib.nullcontext()


def check_job(args, world_size):
    """What the job must be for these flags (--mesh, --replicate, bf16's GPU); before anyone waits."""
    check_mesh(args.mesh, world_size)
    if args.replicate > 1 and (world_size % args.replicate or world_size == args.replicate):
        raise UserError(f"--replicate {args.replicate} splits the job's {world_size} process(es) "
                        f"into {args.replicate} replicas of at least 2 ranks each: start a multiple "
                        f"of {args.replicate} processes, at least {2 * args.replicate}")
    if args.precision == "bf16" and not torch.cuda.is_available():
        raise UserError("--precision bf16 shards with FSDP's MixedPrecisionPolicy on GPUs, and "
                        "this machine has none: on the CPU every state stays fp32 (use "
                        "--precision 32)")


def dcp_folder(args):
    """Where a run's sharded checkpoint lives: one folder, a file per rank."""
    return checkpoint.path_for(args).with_suffix(".dcp")


def runs(args):
    """(run, the sharded checkpoint it starts from or None) for each --shard mode in turn: run is
    args for that mode alone (--run-name suffixed with the mode when there are several)."""
    for mode in args.shard:
        name = args.run_name if len(args.shard) == 1 else f"{args.run_name}_{mode}"
        run = config.replaced(args, run_name=name, shard=mode)
        source = dcp_folder(run)
        if args.resume_from:
            source = source.with_name(f"{name.replace(args.run_name, args.resume_from, 1)}.dcp")
            if not source.exists():
                raise UserError(f"--resume-from {args.resume_from}: no sharded checkpoint "
                                f"{source.name} in {source.parent}")
        yield run, (source if args.resume or args.resume_from else None)


def test_batches(n, ctx, batch_size=1000):
    """This rank's batches of the n test samples: every sample once over the ranks, and as many
    batches on every rank, since under FSDP each forward gathers with the others (a rank with a
    batch fewer would leave them waiting)."""
    batches = math.ceil(math.ceil(n / ctx.world_size) / batch_size)
    return [b.tolist() for b in torch.arange(ctx.rank, n, ctx.world_size).tensor_split(batches)]


def log_run(log, model, ctx, args, start_epoch):
    """The "ddp" record (how the job was started) and the "sharding" one (this run's stage)."""
    log.write("ddp", **distributed.describe(ctx, args))
    built = [None] * ctx.world_size  # each rank's bytes when built: 0 where --meta-init
    dist.all_gather_object(built, BUILT.get("bytes"))
    log.write("sharding", shard=args.shard, zero_stage=ZERO_STAGE[args.shard], mesh=ctx.world_size,
              precision=args.precision, parameters=parameter_count(model), blocks=args.blocks,
              width=args.width, start_epoch=start_epoch, meta_init=args.meta_init,
              built_bytes=built, replicate=args.replicate, prefetch=args.prefetch,
              offload=args.offload)


def parameter_count(model):
    """The whole model's parameters (a DTensor's numel is the whole tensor's)."""
    return sum(p.numel() for p in model.parameters())


def measure_step(log, model, optimizer, steps, args):
    """Hooks that measure one training step: the second (DDP's buckets are set by then), or the
    only one. The collectives it runs (from its forward to the end of optimizer.step) and the bytes
    each rank holds after it, gradients still held: the "shard_memory" and "shard_comm" records;
    and the parameters in use at the end of its forward (FSDP2: whole while a unit is gathered)."""
    parameters, world = parameter_count(model), dist.get_world_size()
    collectives, seen, hooks, in_forward = Collectives(), [], [], []

    def start(module, inputs):
        if module.training:
            seen.append(None)
            if len(seen) - 1 == min(1, steps - 1):
                collectives.__enter__()
                hooks.append(model.register_forward_hook(end_of_forward))  # after FSDP's own
                hooks.append(optimizer.register_step_post_hook(finish))

    def end_of_forward(*_):
        if not in_forward:
            in_forward.append(sum(local_bytes(p) for p in model.parameters()))

    def finish(*_):
        collectives.__exit__(None, None, None)
        everyone = [None] * world  # every rank's bytes, gathered to rank 0's log
        dist.all_gather_object(everyone, (*held(model, optimizer), in_forward[0]))
        log.write("shard_memory", shard=args.shard, world_size=world, parameters=parameters,
                  param_bytes=[h[0] for h in everyone], grad_bytes=[h[1] for h in everyone],
                  optim_bytes=[h[2] for h in everyone],
                  expected_bytes=list(expected(args.shard, parameters, world // args.replicate)),
                  forward_param_bytes=[h[3] for h in everyone])
        log.write("shard_comm", shard=args.shard, world_size=world, parameters=parameters,
                  ops=collectives.record())
        for h in hooks:
            h.remove()

    hooks.append(model.register_forward_pre_hook(start, prepend=True))  # before FSDP's gathers


def check_mesh(mesh, world_size):
    """--mesh must be the job's size (one dimension: every rank holds one shard); before anyone waits."""
    if mesh is not None and mesh != world_size:
        raise UserError(f"--mesh {mesh} does not match the job's {world_size} process(es): a 1-D device mesh "
                        f"holds every rank once; start {mesh} processes or leave out --mesh")


def check_model(mode, model):
    """fully_shard here shards per block: the model must be the block stack (--model blocks)."""
    if mode in FULLY_SHARDED and not hasattr(model, "blocks"):
        raise UserError(f"--shard {mode} wraps each block of the model in fully_shard, and "
                        f"--model {type(model).__name__} has no blocks; use --model blocks "
                        f"(or --shard none|optimizer|gradients)")


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
        self.post_hooks = collections.OrderedDict()  # a RemovableHandle holds it weakly

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
        for hook in list(self.post_hooks.values()):
            hook(self, (), {})

    def register_step_post_hook(self, hook):
        """As torch.optim.Optimizer's: hook(optimizer, args, kwargs) after every step."""
        handle = torch.utils.hooks.RemovableHandle(self.post_hooks)
        self.post_hooks[handle.id] = hook
        return handle

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


def shard(model, mode, device, optimizer_args, args):
    """(model, optimizer) for a ZeRO stage: model wrapped as the stage needs, Adam over what this
    rank updates. From args: precision; meta_init (the model was built on the meta device on every
    rank but 0: building); replicate (HSDP's replicas: mesh); prefetch and offload (FSDP2's)."""
    precision, meta_init, replicate = args.precision, args.meta_init, args.replicate
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP
    check_model(mode, model)
    BUILT["bytes"] = sum(local_bytes(p) for p in model.parameters() if not p.is_meta)
    # --meta-init: rank 0's whole values, kept before fully_shard moves them into its shards
    full = model.state_dict() if meta_init and dist.get_rank() == 0 else {}
    if not meta_init:
        model = model.to(device)
    optimizer_args = optimizer_args or {}
    ids = [device.index] if device.type == "cuda" else None
    # .grad a view of DDP's all-reduce buckets: otherwise DDP keeps the buckets beside the
    # gradients, a second copy of them (4 bytes a parameter more in fp32) that held() would not see
    if mode == "none":
        model = DDP(model, device_ids=ids, gradient_as_bucket_view=True)
        return model, torch.optim.Adam(model.parameters(), **optimizer_args)
    if mode == "optimizer":
        # gradients all-reduced whole; only Adam's state is split
        model = DDP(model, device_ids=ids, gradient_as_bucket_view=True)
        return model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, **optimizer_args)
    if mode == "gradients":
        shards = GradientShards(model, torch.optim.Adam, **optimizer_args)
        return model, shards
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = device_mesh(device, replicate)
    # bf16 on the GPU: computed and all-gathered in bf16, gradients reduced and the master weights kept in fp32
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if precision == "bf16" else MixedPrecisionPolicy())
    # ZeRO-3 frees each block's gathered parameters after its forward and gathers them again for
    # backward; gradients_fsdp keeps them to the end of backward: one all-gather a step, ZeRO-2's
    again = mode == "parameters"
    offload = offload_policy(args.offload, device)
    for block in model.blocks:  # one all-gather per block, just before it runs
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=again,
                    offload_policy=offload)
    # the rest (stem, head) as one group; FSDP2's default keeps the root gathered for backward
    fully_shard(model, mesh=mesh, mp_policy=policy, offload_policy=offload)
    prefetch(list(model.blocks), args.prefetch, device)
    if meta_init:  # offloaded shards live in host memory
        materialize(model, full, torch.device("cpu") if args.offload else device)
    return model, torch.optim.Adam(model.parameters(), **optimizer_args)


def offload_policy(offload, device):
    """--offload: CPUOffloadPolicy, each rank's shards, their gradients and Adam's state in host
    memory; a unit is copied to the device to be gathered and its gradient shard copied back, and
    Adam steps on the CPU. Pinned host memory only where a GPU copies from it."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy
    return CPUOffloadPolicy(pin_memory=device.type == "cuda") if offload else OffloadPolicy()


def prefetch(blocks, n, device):
    """--prefetch N: each block's forward starts the all-gathers of the next N blocks, and its
    backward those of the N before it, so they travel while it computes. Without it FSDP2 uses
    its defaults: in forward it issues a unit's all-gather on a CUDA stream of its own, so on a
    GPU it runs ahead of the compute queued before it (implicit prefetch); in backward it
    prefetches one unit, in the reverse of forward's order. A CPU has no streams and gloo's calls
    wait: there the gathers are started as async ops (gloo's threads move the bytes) and waited
    for where the unit is used."""
    if not n:
        return
    for i, block in enumerate(blocks):
        block.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + n])
        block.set_modules_to_backward_prefetch(blocks[max(i - n, 0):i][::-1])
        if device.type == "cpu":  # private in torch 2.13 (FSDPModule._set_unshard_async_op)
            block._set_unshard_async_op(True)


def device_mesh(device, replicate=1):
    """fully_shard's mesh: 1-D, every rank one shard (FSDP); or 2-D, replicate x shard (HSDP):
    each unit all-gathered and reduce-scattered inside a row of world/replicate ranks (a node's fast
    links, on a cluster), its gradients then all-reduced between the rows' counterparts."""
    from torch.distributed.device_mesh import init_device_mesh
    world = dist.get_world_size()
    if replicate == 1:
        return init_device_mesh(device.type, (world,))
    return init_device_mesh(device.type, (replicate, world // replicate),
                            mesh_dim_names=("replicate", "shard"))


def materialize(model, full, device):
    """Memory for this rank's shards only (to_empty: uninitialised), then rank 0's whole values,
    broadcast and cut into each rank's shards: how torchtitan and torchtune load a checkpoint into
    a model built on the meta device. full: rank 0's state_dict, {} on the others."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    model.to_empty(device=device)
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True,
                                                               broadcast_from_rank0=True))


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


# DCP's get_state_dict knows DDP and FSDP2; ZeroRedundancyOptimizer's state is consolidated on rank 0
# beside DCP's files (ZERO1_FILE); GradientShards (ZeRO-2 by hand) keeps no checkpoint format
RESUMABLE = ("none", "optimizer", "parameters")
ZERO1_FILE = "zero1_optimizer.pt"


ARGS_FILE = "trainup_args.json"  # beside DCP's files: the flags of the run that saved, for a resume to check
POSITION_FILE = "trainup_position.pt"  # beside them after a stop: the step, every rank's random states


def save_sharded(folder, model, optimizer, scheduler, epoch, args=None, position=None, flat=False):
    """A torch.distributed.checkpoint (DCP) folder: every rank writes its own shards, with metadata that
    lets a job of any size load it, and rank 0 the run's flags (ARGS_FILE) and, for a stop inside
    an epoch, where it stopped (POSITION_FILE: preempt.Stopper's position). Written to a temporary
    folder, then renamed by rank 0: a reader sees the old checkpoint or the new one. flat: the
    optimizer's state keyed by parameter name (states)."""
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    folder = Path(folder)
    tmp = folder.with_name(f".{folder.name}.tmp")
    if dist.get_rank() == 0 and tmp.exists():
        shutil.rmtree(tmp)
    dist.barrier()
    model_state, optim_state = states(model, optimizer, flat)
    if is_zero1(optimizer):  # every rank sends its part of Adam's state to rank 0 (a collective)
        optimizer.consolidate_state_dict(to=0)
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
            if is_zero1(optimizer):  # the whole state, as one process's Adam would save it
                torch.save(optimizer.state_dict(), tmp / ZERO1_FILE)
            if position is not None:
                torch.save(position, tmp / POSITION_FILE)
    dist.barrier()
    if dist.get_rank() == 0:
        old = folder.with_name(f".{folder.name}.old")
        if folder.exists():
            os.replace(folder, old)
        os.replace(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def saver(args, model, optimizer, scheduler):
    """What a stop (preempt.Stopper) calls on every rank: the run's DCP checkpoint with where it
    stopped; ZeRO-2 by hand keeps no checkpoint, so its stop is refused in one sentence."""
    def save(epochs_done, position):
        if args.shard not in RESUMABLE:
            raise UserError(f"stopped in epoch {epochs_done + 1}, without a checkpoint: --shard "
                            f"{args.shard} (ZeRO-2 by hand) has no checkpoint format; --shard "
                            f"{' or '.join(RESUMABLE)} can stop and resume")
        save_sharded(dcp_folder(args), model, optimizer, scheduler, epochs_done, args, position)
    return save


def saved_position(folder):
    """Where the run whose DCP checkpoint is folder stopped inside an epoch; None at an epoch's end
    (or no checkpoint)."""
    path = Path(folder) / POSITION_FILE if folder is not None else None
    if path is None or not path.exists():
        return None
    try:
        return torch.load(path, weights_only=True)
    except Exception:  # torn or foreign: one sentence, as the shards' own load says
        raise UserError(f"checkpoint {folder}: {POSITION_FILE} cannot be read (damaged); resume "
                        f"from another checkpoint, or start the run again") from None


def is_zero1(optimizer):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    return isinstance(optimizer, ZeroRedundancyOptimizer)


def states(model, optimizer, flat=False):
    """(model, optimizer) state dicts for DCP, in this job's layout; ZeRO-1's optimizer state goes
    apart (ZERO1_FILE): DCP's get_state_dict does not know ZeroRedundancyOptimizer. flat: every
    value of the optimizer's state and param_groups under its parameter's name (torchtitan's
    flatten_optimizer_state_dict), for ranks that hold different parameters (pipeline stages):
    DCP writes a key that several ranks save once, and unflattened, every stage's param_groups
    would go under the same keys, one stage's kept for all."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict
    if is_zero1(optimizer):
        return get_model_state_dict(model), {}
    return get_state_dict(model, optimizer, options=_options(flat))


def _options(flat):
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    return StateDictOptions(flatten_optimizer_state_dict=flat)


def _why(e):
    """The first underlying failure of a CheckpointException (one per rank), else the error itself."""
    failures = getattr(e, "failures", None) or {}
    first = next(iter(failures.values()), e)
    first = first[0] if isinstance(first, tuple) else first  # DCP keeps (exception, its traceback) per rank
    said = getattr(first, "strerror", None) or str(first).splitlines()[0]
    said = said.split(". ")[0] if len(said) > 120 else said  # torch's first sentence, whole
    return f"{type(first).__name__}: {said}"


def load_sharded(folder, model, optimizer, scheduler, args=None, flat=False):
    """Restore a DCP checkpoint into this job, whatever its size; the epoch to start from (1 if
    none: folder None or absent).
    args: this run's flags, checked against those the saving run wrote (checkpoint.SAME_ON_RESUME);
    flat: as save_sharded saved it."""
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict
    if folder is None or not Path(folder).exists():
        return 1
    saved = Path(folder) / ARGS_FILE
    if args is not None and saved.exists():
        try:
            checkpoint.same_run(folder, json.loads(saved.read_text()), args)
        except ValueError:  # torn or foreign: DCP's own load below says whether the rest is whole
            pass
    try:  # DCP's own load would fall back to other metadata files, printing each failure's traceback
        dcp.FileSystemReader(str(folder)).read_metadata()
    except Exception as e:  # noqa: BLE001  damaged bytes fail in many ways (pickle, EOF, missing)
        raise UserError(f"checkpoint {folder} cannot be read (its .metadata: {type(e).__name__}): "
                        f"it is damaged or not a DCP checkpoint; delete it, or start without "
                        f"--resume") from None
    # this job's layout: DCP fills it from the files
    model_state, optim_state = states(model, optimizer, flat)
    state = {"model": model_state, "optim": optim_state, "scheduler": scheduler.state_dict(), "epoch": 0}
    try:
        dcp.load(state, checkpoint_id=str(folder))
    except (Exception, CheckpointException) as e:  # DCP's, every rank's failure in one: a BaseException
        raise UserError(f"checkpoint {folder} cannot be loaded into this run ({_why(e)}): it is damaged, or "
                        f"holds another model or mode; resume with the flags it was saved with") from None
    if is_zero1(optimizer):  # each rank keeps its partition of the whole state, for this job's size
        set_model_state_dict(model, state["model"])
        optimizer.load_state_dict(torch.load(Path(folder) / ZERO1_FILE, weights_only=True))
    else:
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"], options=_options(flat))
    scheduler.load_state_dict(state["scheduler"])
    return state["epoch"] + 1
