"""The Horovod script's job of many processes, in the shape of trainup/distributed.py's calls.

    hvd_group.before_init(args)   # Horovod built (else one sentence); --timeout for its gloo
    hvd.init()                    # in the script: the lesson
    ctx = hvd_group.setup(args)   # the DDP script's Context, from Horovod's rank, size, local rank
    hvd_group.describe(ctx, args), hvd_group.per_rank(...), hvd_group.reduce(meter)  # log records

Horovod is built from source for the course (tools/build_horovod.sh); where `import horovod.torch`
fails, `hvd` is None and before_init() says how to build it.
"""
import os
import socket
import sys

import torch

from . import UserError, cli
from .distributed import Context
from .meter import Meter

try:
    import horovod.torch as hvd
except ImportError as e:  # not built, or built against another torch
    hvd, HOROVOD_MISSING = None, str(e).splitlines()[0] if str(e) else "no module named horovod"


def add_flags(p):
    """--fp16-allreduce, and the group's flags but --backend: Horovod picks its own (gloo, MPI,
    NCCL)."""
    p.add_argument("--fp16-allreduce", action="store_true",
                   help="compress gradients to float16 for the all-reduce")
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
    if args.batch_size % ctx.world_size:
        raise UserError(f"--batch-size {args.batch_size} is the global batch and cannot be split "
                        f"evenly over {ctx.world_size} processes; use a multiple of "
                        f"{ctx.world_size}")
    return ctx


def gpu_ops(requested):
    """The device, where this Horovod can all-reduce on it: a build without NCCL moves only CPU
    tensors (on a CUDA tensor it stops with its own "not compiled with CUDA")."""
    if requested == "cpu" or hvd.nccl_built() or not torch.cuda.is_available():
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
