"""The Horovod script's job of many processes, in the shape of trainup/distributed.py's calls.

    hvd_group.before_init(args)   # Horovod built (else one sentence); --timeout for its gloo
    hvd.init()                    # in the script: the lesson
    ctx = hvd_group.setup(args)   # the DDP script's Context, from Horovod's rank, size, local rank
    hvd_group.describe(ctx, args), hvd_group.per_rank(...), hvd_group.reduce(meter)  # log records
    step = hvd_group.Accumulation(optimizer, loader)  # --accumulate: when to step, and the mean

Horovod is built from source for the course (tools/build_horovod.sh); where `import horovod.torch`
fails, `hvd` is None and before_init() says how to build it.
"""
import os
import socket
import sys

import torch

from .. import UserError, cli, devices
from ..cli import positive
from ..distributed import Context, per_rank_batch
from ..meter import Meter

try:
    import horovod.torch as hvd
except ImportError as e:  # not built, or built against another torch
    hvd, HOROVOD_MISSING = None, str(e).splitlines()[0] if str(e) else "no module named horovod"


def add_flags(p):
    """--fp16-allreduce, --accumulate, and the group's flags but --backend: Horovod picks its own
    (gloo, MPI, NCCL)."""
    p.add_argument("--fp16-allreduce", action="store_true",
                   help="compress gradients to float16 for the all-reduce")
    p.add_argument("--accumulate", type=positive(int), default=None,
                   help="split each rank's batch into K micro-batches; Horovod all-reduces once "
                        "a step, after the K-th backward pass (backward_passes_per_step)")
    cli.add_group(p, backend=False)


def before_init(args):
    """What hvd.init() needs first: Horovod itself (else how to build it), --timeout for gloo."""
    if hvd is None:
        raise UserError(f"Horovod is not installed in this Python ({HOROVOD_MISSING}); build and "
                        f"install it with tools/build_horovod.sh (a few minutes, once)")
    os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(int(args.timeout)))  # read by init()


def setup(args):
    """After hvd.init(): rank, size and local rank from horovodrun (or mpirun), as the DDP script's
    Context; the device is the script's to pin, from hvd.local_rank()."""
    mpi = hvd.mpi_enabled()
    ctx = Context(rank=hvd.rank(), world_size=hvd.size(), local_rank=hvd.local_rank(),
                  local_world_size=hvd.local_size(), node_rank=hvd.cross_rank(),
                  nnodes=hvd.cross_size(),
                  launcher="horovodrun" if "HOROVOD_RANK" in os.environ else
                  "mpirun" if mpi else "python",
                  master_addr=os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1"),
                  master_port=int(os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT", 0)),
                  backend="horovod-" + ("mpi" if mpi else "gloo"), timeout_s=args.timeout)
    per_rank = per_rank_batch(args.batch_size, ctx.world_size)
    if args.accumulate and per_rank % args.accumulate:
        raise UserError(f"--accumulate {args.accumulate} must divide each process's batch "
                        f"({per_rank} samples)")
    if args.accumulate and args.sweep:
        raise UserError("--accumulate and --sweep do not go together: a sweep times whole steps")
    return ctx


def micro_batch(args, ctx):
    """What the loader gives each rank at a time: its share of the global batch, cut in K with
    --accumulate K (K backward passes a step)."""
    return args.batch_size // ctx.world_size // (args.accumulate or 1)


class Accumulation:
    """--accumulate K under Horovod. hvd.DistributedOptimizer(backward_passes_per_step=K) counts
    each gradient's backward passes and starts its all-reduce at the K-th only: the K passes add up
    in .grad locally, then ONE all-reduce AVERAGES the sums over the ranks. It divides by the ranks
    alone, never by K, and optimizer.zero_grad() between passes fails (an all-reduce might be in
    flight), so the loop zeroes after the step. Each micro-batch's mean loss is weighted by its
    share of a whole step's samples (n_i / (K * micro-batch)) before backward, and a step that saw
    fewer (an epoch's short end) is scaled up after: the mean over the whole step, as one process's
    batch gives. Weighing before the all-reduce keeps what it carries at a mean gradient's size:
    --fp16-allreduce casts it to float16 (at most 65504), and GradScaler has already multiplied
    it by its scale (65536 at first). (DDP's no_sync, lesson 04a2, is the same idea:
    _trainup_ddp_tuned.py.)
    With K = 1 it steps every batch and weighs nothing."""

    def __init__(self, optimizer, loader):
        self.optimizer, self.k = optimizer, optimizer.backward_passes_per_step
        # the epoch's last batch ends a step however many passes it had; a sweep's batches have no
        # len(), and it never accumulates
        self.batches = len(loader) if self.k > 1 else None
        self.whole = None  # a full step's samples: K times the epoch's first micro-batch (whole)
        self.passes = self.seen = 0

    def weigh(self, loss, samples):
        """The loss to backward: its share of a full step's samples when accumulating."""
        if self.k == 1:
            return loss
        self.whole = self.whole or self.k * samples
        self.passes, self.seen = self.passes + 1, self.seen + samples
        return loss * (samples / self.whole)

    def last(self):
        """True at the step's last backward pass: K of them, or the epoch's end."""
        return self.passes % self.k == 0 or self.passes == self.batches

    def average(self):
        """After optimizer.synchronize(): the ranks' average of the weighted sums is the mean
        gradient over the step's global batch once a short step (fewer samples than a full one, the
        same on every rank: DistributedSampler pads the shards evenly) is scaled up to its own."""
        if self.k > 1 and self.seen != self.whole:
            for group in self.optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.mul_(self.whole / self.seen)
        self.seen = 0


def gpu_ops(requested):
    """The device, where this Horovod can all-reduce on it: a build without NCCL moves only CPU
    tensors (on a CUDA tensor it stops with its own "not compiled with CUDA")."""
    if requested == "cpu" or not torch.cuda.is_available():
        return requested
    if hvd.nccl_built():
        if requested == "auto":  # a GPU for each of the node's ranks, else the CPU (devices.py)
            requested, why = devices.auto_device(hvd.local_size())
            if why and hvd.local_rank() == 0:
                print(f"note: {why}", file=sys.stderr)
        return requested
    build = "HOROVOD_GPU_OPERATIONS=NCCL tools/build_horovod.sh on this GPU machine"
    if requested == "cuda":
        raise UserError(f"--device cuda needs a Horovod built with NCCL, and this one all-reduces "
                        f"CPU tensors only: rebuild it with {build}, or use --device cpu")
    print(f"note: running on the CPU: this Horovod was built without NCCL ({build} builds one for "
          f"GPUs)", file=sys.stderr)
    return "cpu"


def describe(ctx, args):
    """The 'ddp' log record (the DDP script's fields): how the job started, where each rank is."""
    me = dict(rank=ctx.rank, local_rank=ctx.local_rank, node_rank=ctx.node_rank,
              host=socket.gethostname(), device=str(ctx.device), pid=os.getpid())
    fields = {k: getattr(ctx, k) for k in ("launcher", "world_size", "local_world_size", "nnodes",
                                            "master_addr", "master_port", "restart_count",
                                            "backend", "timeout_s")}
    return dict(fields, per_rank_batch=args.batch_size // ctx.world_size,
                global_batch=args.batch_size, ranks=hvd.allgather_object(me))


def reduce(meter):
    """A Meter summed over every rank with hvd.allreduce: the job's loss, accuracy and samples."""
    return Meter.from_tensor(hvd.allreduce(meter.as_tensor(), op=hvd.Sum, name="meter"))


def per_rank(epoch, meter, sampler, first=8):
    """The 'ranks' record: each rank's own numbers and first sample indices (hvd.allgather)."""
    t = torch.cat([meter.as_tensor(), torch.tensor(list(sampler)[:first], dtype=torch.float64)])
    parts = hvd.allgather(t.unsqueeze(0), name="ranks")
    meters = [Meter.from_tensor(p) for p in parts]
    return dict(epoch=epoch, rank=list(range(len(meters))), loss=[m.mean_loss for m in meters],
                accuracy=[m.accuracy for m in meters], samples=[m.samples for m in meters],
                first_indices=[p[3:].long().tolist() for p in parts])


def cleanup(ctx):
    """Leave together, as the DDP script does: a barrier, then hvd.shutdown()."""
    hvd.barrier()
    hvd.shutdown()
