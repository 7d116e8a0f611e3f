"""One training job as many processes: who am I, how many are we, where do we meet, and goodbye.

The processes can be started three ways; the first that applies wins:

- torchrun (or anything that sets the env:// variables RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
  MASTER_PORT). Under `srun torchrun` (one task per node) every worker also sees its node's task's
  SLURM_PROCID (0 on the first node, 1 on the second...), the same for every worker of a node and not
  its rank, so these win over SLURM's.
- SLURM's `srun python ...`, one task per process: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
  SLURM_NNODES, SLURM_NODEID. MASTER_ADDR defaults to the job's first node, MASTER_PORT to a port
  derived from the job id (the same in every task, without talking to each other).
- plain `python script.py`: one process, world size 1, on a free port.
"""
import contextlib
import datetime
import gc
import os
import random
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from . import UserError, devices
from .meter import Meter

BACKENDS = ("auto", "gloo", "nccl")


@dataclass
class Context:
    """This process's place in the job."""
    rank: int = 0               # 0 .. world_size-1, unique in the job; rank 0 logs and checkpoints
    world_size: int = 1         # processes in the job
    local_rank: int = 0         # 0 .. local_world_size-1 on this node: which GPU this process takes
    local_world_size: int = 1   # processes on this node
    node_rank: int = 0
    nnodes: int = 1
    launcher: str = "python"    # torchrun | slurm | env (RANK etc. set by hand) | python
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    restart_count: int = 0      # torchrun --max-restarts: how many times the workers were restarted
    backend: str = "none"
    device: object = None
    timeout_s: float = 300.0

    @property
    def is_main(self):
        return self.rank == 0


def _slurm_first_host(nodelist):
    """The first host of a SLURM node list such as 'gpu[03-05,07]', through scontrol when it exists."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=10)
        if out.returncode == 0 and out.stdout.split():
            return out.stdout.split()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    head = nodelist.split(",")[0]
    if "[" in head:  # 'gpu[03-05]' -> 'gpu03'
        base, rest = head.split("[", 1)
        head = base + rest.split("-")[0].split(",")[0].rstrip("]")
    return head


def from_env(env=None):
    """Read rank, world size and the meeting point from what the launcher set (see the module's doc)."""
    env = os.environ if env is None else env
    get = lambda name, default=None: int(env[name]) if env.get(name, "") != "" else default  # noqa: E731
    restarts = get("TORCHELASTIC_RESTART_COUNT", 0)
    if "RANK" in env and "WORLD_SIZE" in env:
        world, local_world = get("WORLD_SIZE"), get("LOCAL_WORLD_SIZE", get("WORLD_SIZE"))
        return Context(rank=get("RANK"), world_size=world, local_rank=get("LOCAL_RANK", 0),
                       local_world_size=local_world, node_rank=get("GROUP_RANK", 0),
                       nnodes=get("GROUP_WORLD_SIZE", max(world // max(local_world, 1), 1)),
                       launcher="torchrun" if "TORCHELASTIC_RUN_ID" in env else "env",
                       master_addr=env.get("MASTER_ADDR", "127.0.0.1"), master_port=get("MASTER_PORT", 0),
                       restart_count=restarts)
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        world, nnodes = get("SLURM_NTASKS"), get("SLURM_NNODES", 1)
        addr = env.get("MASTER_ADDR") or (
            "127.0.0.1" if nnodes == 1 else _slurm_first_host(env.get("SLURM_JOB_NODELIST", "127.0.0.1")))
        port = get("MASTER_PORT") or 20000 + get("SLURM_JOB_ID", 0) % 20000
        return Context(rank=get("SLURM_PROCID"), world_size=world, local_rank=get("SLURM_LOCALID", 0),
                       local_world_size=max(world // nnodes, 1), node_rank=get("SLURM_NODEID", 0), nnodes=nnodes,
                       launcher="slurm", master_addr=addr, master_port=port, restart_count=restarts)
    return Context(master_addr=env.get("MASTER_ADDR", "127.0.0.1"), master_port=get("MASTER_PORT", 0))


def launched_by_srun(env=None):
    """True in a process that srun started (a job step); False in the sbatch script itself, which also sees
    SLURM_PROCID=0 and SLURM_NTASKS=N but is one process: as rank 0 of N it would wait for N-1 that never come."""
    env = os.environ if env is None else env
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", ""))
    return step.isdigit() and int(step) < 0xFFFFFFF0  # SLURM's batch and extern steps use ids near 2**32


_GIVEN = set()  # ports this process handed out already: a job may ask for several before any opens


def free_port(host="127.0.0.1"):
    """A TCP port nobody listens on now, chosen at random below the kernel's ephemeral range.

    Not bind(("", 0)): that port comes from the ephemeral range, where any outgoing connection
    (gloo opens one per pair of ranks) may take it as its local end before the job opens it, and
    the job would then fail on a port in use. Below the range only another chooser can take it.
    From 22000: below are Ray's workers' ports (10002-19999) and the ports a SLURM job derives
    from its id (20000 + id, for the ids a machine of its own hands out first).
    """
    low, high = _ephemeral_range()
    choices = [p for p in range(22000, 32768) if not low <= p <= high and p not in _GIVEN]
    for port in random.SystemRandom().sample(choices, min(64, len(choices))):
        if port_is_free(port, host):
            _GIVEN.add(port)
            return port
    with socket.socket() as s:  # nothing free below the range: let the kernel choose
        s.bind((host, 0))
        return s.getsockname()[1]


def _ephemeral_range():
    """Linux's ip_local_port_range; elsewhere IANA's 49152-65535 (macOS's and Windows' default)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split())
        return low, high
    except (OSError, ValueError):
        return 49152, 65535


def port_is_free(port, host=""):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is reusable
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def pick_backend(requested, device_request):
    """gloo or nccl for --backend auto|gloo|nccl; a clear sentence when NCCL cannot work here."""
    gpu = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if requested == "nccl":
        if not dist.is_nccl_available():
            raise UserError("--backend nccl needs a torch built with NCCL, and this one is not; "
                            "use --backend gloo or --backend auto")
        if not gpu:
            raise UserError("--backend nccl needs NVIDIA GPUs (NCCL only moves GPU memory), and torch sees "
                            "none on this machine; use --backend gloo or --backend auto")
        if device_request == "cpu":
            raise UserError("--backend nccl cannot work with --device cpu; use --backend gloo")
        return "nccl"
    if requested == "gloo":
        return "gloo"
    return "nccl" if gpu and device_request != "cpu" and dist.is_nccl_available() else "gloo"


# torch.distributed.nn binds the default group as a default argument (group=group.WORLD) when first
# imported. Imported after joining, as DDP's constructor imports it (through torch._dynamo), it would hold
# the run's group past destroy_process_group() into the interpreter's shutdown, and its gloo threads with
# it: one of them then ends the process with "terminate called without an active exception". Imported
# before joining, it binds None. (ZeroRedundancyOptimizer's module does the same:
# trainup/parallel/sharding.py imports it before joining.)
import torch.distributed.nn.functional  # noqa: E402,F401  (milliseconds)


def node_device(ctx, requested, flag="--device cuda", env=None):
    """(--device as this rank applies it, its GPU's number): auto becomes cuda where the node has a
    GPU for each of its processes, else cpu (rank 0 of the node says why); cuda with too few is one
    sentence on every rank, before any waits for the others."""
    env = os.environ if env is None else env
    gpus = devices.gpu_count()
    if ctx.launcher == "slurm" and gpus == 1 and (env.get("SLURM_GPUS_PER_TASK")
                                                  or env.get("SLURM_GPU_BIND")):
        return requested, 0  # srun --gpus-per-task=1 (--gpu-bind) shows a task its own GPU, as 0
    if requested == "auto" and gpus:
        requested, why = devices.auto_device(ctx.local_world_size, gpus)
        if why and ctx.local_rank == 0:
            print(f"note: {why}", file=sys.stderr)
    elif requested == "cuda" and 0 < gpus < ctx.local_world_size:
        raise UserError(f"{flag} with {ctx.local_world_size} processes on this node needs "
                        f"{ctx.local_world_size} GPUs, one each, and it has {gpus}; start at most "
                        f"{gpus} per node, or use --device auto or cpu")
    return requested, ctx.local_rank


def setup(args):
    """Join the job's process group: the Context, with this process's device pinned from LOCAL_RANK.
    Lesson 04's _trainup_ddp.py makes the same calls in the open: context, set_device, join."""
    ctx = context(args)
    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)
    with explained(ctx):
        dist.init_process_group(ctx.backend, **meeting(ctx))
    return ctx


def context(args):
    """This process's place in the job, its backend and its device, before it joins the group.

    Checks first what would otherwise hang or fail deep inside torch: a global batch that does not
    split over the processes, NCCL without GPUs, a port that is already taken. Sets MASTER_ADDR and
    MASTER_PORT for init_process_group's env://, where the launcher (srun, python) did not.
    """
    ctx = from_env()
    ctx.timeout_s = args.timeout
    if ctx.launcher == "slurm" and ctx.world_size > 1 and not launched_by_srun():
        raise UserError(f"SLURM_NTASKS={ctx.world_size} but srun did not start this process (python was run "
                        f"directly, in the batch script or an salloc shell), so the other {ctx.world_size - 1} process(es) would never "
                        f"come; start it as srun python ..., one task per process")
    # tensor parallelism splits the batch over --dp only (check_shape); context parallelism gives
    # every rank the whole batch
    if not hasattr(args, "tp") and not hasattr(args, "cp_attention"):
        per_rank_batch(args.batch_size, ctx.world_size)
    nccl = args.backend == "nccl" and args.device == "auto"  # NCCL only moves GPU memory
    requested, gpu = node_device(ctx, "cuda" if nccl else args.device,
                                 "--backend nccl" if nccl else "--device cuda")
    ctx.backend = pick_backend(args.backend, requested)
    # the caller makes it current (torch.cuda.set_device), in the open
    ctx.device = devices.pick("cuda" if ctx.backend == "nccl" else requested, gpu, set_device=False)
    if ctx.launcher == "python" and not ctx.master_port:
        ctx.master_port = free_port()
    if ctx.launcher != "torchrun" and ctx.rank == 0 and not port_is_free(ctx.master_port):
        # torchrun's agent already holds MASTER_PORT for its workers; anywhere else rank 0 must open it
        raise UserError(f"port {ctx.master_port} (MASTER_PORT) is already in use, by another job perhaps; "
                        f"set MASTER_PORT to a free port, or unset it to get one")
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = ctx.master_addr, str(ctx.master_port)
    return ctx


def meeting(ctx):
    """init_process_group's arguments but the backend: where the ranks meet, who this is, how
    long to wait. env:// (rank 0 opens a store on MASTER_PORT, the others connect), or under torchrun's
    agent store a prefix of its own for each restart."""
    timeout = datetime.timedelta(seconds=ctx.timeout_s)
    common = dict(rank=ctx.rank, world_size=ctx.world_size, timeout=timeout)
    if ctx.launcher == "torchrun" and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # The workers meet in torchrun's own store, which outlives a restart: keys of the crashed
        # attempt (the dead ranks' addresses) would still be there: each attempt has its own prefix.
        # (Agents on several nodes may count restarts differently; there, launch torchrun with
        # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, and rank 0 opens a fresh store for every attempt.)
        store = dist.PrefixStore(f"trainup/attempt_{ctx.restart_count}", dist.TCPStore(
            ctx.master_addr, ctx.master_port, ctx.world_size, is_master=False, timeout=timeout))
        return dict(common, store=store)
    return dict(common, init_method="env://")


@contextlib.contextmanager
def explained(ctx):
    """The store's errors while joining as one sentence: a taken port, or the others never came."""
    try:
        yield
    except dist.DistError as e:
        text = str(e)
        if "EADDRINUSE" in text or "already in use" in text:
            raise UserError(f"port {ctx.master_port} (MASTER_PORT) is already in use; set MASTER_PORT to a free "
                            f"port, or unset it to get one") from None
        if "timed out" in text.lower() or "timeout" in text.lower():
            raise UserError(f"rank {ctx.rank} waited {ctx.timeout_s:.0f} s for the other {ctx.world_size - 1} "
                            f"process(es) at {ctx.master_addr}:{ctx.master_port} and they did not all come; "
                            f"were all {ctx.world_size} started (srun, torchrun), with the same MASTER_ADDR "
                            f"and MASTER_PORT?") from None
        raise


def per_rank_batch(batch_size, world_size):
    """Each process's share of the global --batch-size: one sentence where it does not split evenly
    (every script's check, before any process waits for another)."""
    if batch_size % world_size:
        raise UserError(f"--batch-size {batch_size} is the global batch and cannot be split evenly "
                        f"over {world_size} processes; use a multiple of {world_size}")
    return batch_size // world_size


def node_gpus(ctx):
    """The GPUs rank 0's sampler watches: every rank's on its node (local rank i uses cuda:i), as many as
    this process sees (a SLURM task bound to one GPU sees its own only); None on CPUs."""
    import torch
    if ctx.device.type != "cuda":
        return None
    return list(range(max(1, min(ctx.local_world_size, torch.cuda.device_count()))))


def describe(ctx, args):
    """The 'ddp' log record: how the job was started, and where each rank runs."""
    me = dict(rank=ctx.rank, local_rank=ctx.local_rank, node_rank=ctx.node_rank, host=socket.gethostname(),
              device=str(ctx.device), pid=os.getpid())
    ranks = [None] * ctx.world_size
    dist.all_gather_object(ranks, me)
    fields = {k: v for k, v in asdict(ctx).items() if k not in ("rank", "local_rank", "node_rank", "device")}
    return dict(fields, per_rank_batch=args.batch_size // ctx.world_size, global_batch=args.batch_size,
                ranks=ranks)


def reduce(meter):
    """A Meter summed over every rank: loss, accuracy and samples of the whole job, not of one process."""
    t = meter.as_tensor().to(_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return Meter.from_tensor(t.cpu())


def per_rank(epoch, meter, sampler, first=8):
    """The 'ranks' log record: each rank's own loss, accuracy and samples (before reduction), and the
    first sample indices its sampler drew this epoch (its shard of the data)."""
    t = torch.cat([meter.as_tensor(), torch.tensor(list(sampler)[:first], dtype=torch.float64)])
    t = t.to(_comm_device())
    parts = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t)
    parts = [Meter.from_tensor(p.cpu()) for p in parts], [p[3:].long().tolist() for p in parts]
    return dict(epoch=epoch, rank=list(range(len(parts[0]))), loss=[m.mean_loss for m in parts[0]],
                accuracy=[m.accuracy for m in parts[0]], samples=[m.samples for m in parts[0]],
                first_indices=parts[1])


def _comm_device():
    """NCCL moves GPU tensors only; gloo takes CPU tensors."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


_LEFT = []  # the groups of a run that has left: release() destroys them


def cleanup(ctx):
    """Leave together: before_leaving(ctx), then destroy_process_group()."""
    if dist.is_initialized():
        before_leaving(ctx)
        dist.destroy_process_group()


def before_leaving(ctx):
    """A barrier, else a fast rank tearing down can abort a slow one's last step. The groups live on
    in _LEFT, so that release() destroys them, not whatever drops them last."""
    if dist.is_initialized():
        dist.barrier(**({"device_ids": [ctx.device.index]} if ctx.backend == "nccl" else {}))
        _LEFT.extend(dist.distributed_c10d._world.pg_map)  # every group, the extra ones too


def release():
    """Destroy the groups of a run that has left, once main() has returned, and join their threads.

    A gloo thread that drops a finished collective's last reference needs the GIL (its tensors have
    Python objects). Destroying the group joins those threads: with the GIL held (DDP's Reducer
    dropping the last reference when the model is freed) that deadlocks; at the interpreter's shutdown
    it aborts. Python's handle on a group releases the GIL while it destroys it, so the model goes
    first (gc) and the handles kept by cleanup() drop the last references."""
    if _LEFT:
        gc.collect()
        mesh = sys.modules.get("torch.distributed.device_mesh")
        if mesh:  # DTensor caches meshes past the run, and a mesh keeps its groups (_pg_registry)
            # by the class itself: DeviceMesh's isinstance is Python code that warns about some
            # objects (torch.distributed.reduce_op), called for every object here
            for held in (o for o in gc.get_objects() if mesh.DeviceMesh in type(o).__mro__):
                held._pg_registry.clear()
        _LEFT.clear()
