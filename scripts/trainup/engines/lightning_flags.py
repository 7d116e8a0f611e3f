"""The Lightning script's flags: the Trainer's own (--accelerator, --devices, --num-nodes,
--strategy, --precision...), Lightning 1.x's answered in one sentence (lightning_compat), and where
devices and num_nodes come from when the flags are left out (torchrun's or SLURM's variables)."""
import os
import sys

from .. import UserError, cli, config, distributed
from . import lightning_callbacks, lightning_compat
from .. import devices as trainup_devices


def add_launch(t):
    """Where the processes run, as Fabric and the Trainer both take it."""
    t.add_argument("--accelerator", default="auto", help="cpu, gpu (cuda), auto, ...")
    t.add_argument("--devices", default=None,
                   help="processes per node (default: torchrun's or SLURM's, else 1)")
    t.add_argument("--num-nodes", type=cli.positive(int), default=None,
                   help="default: torchrun's or SLURM's, else 1")
    t.add_argument("--strategy", default="auto",
                   help="auto, ddp, ddp_spawn, fsdp, deepspeed, ... (this Lightning's)")


def add(p):
    """The Trainer's flags, and Lightning 1.x's (check() answers them), on the course's parser."""
    t = p.add_argument_group("Lightning's Trainer")
    add_launch(t)
    t.add_argument("--max-epochs", type=cli.positive(int), default=None,
                   help="Lightning's name for --epochs")
    t.add_argument("--precision", default="32",
                   help="32, 64 (64-true: float64, for the proofs), 16 (16-mixed), "
                        "bf16 (bf16-mixed), or Lightning's names")
    t.add_argument("--no-sync-dist", action="store_true",
                   help="self.log without sync_dist: rank 0 logs its shard")
    t.add_argument("--monitor", action="store_true",
                   help="DeviceStatsMonitor (and the course's GPU statistics callback, "
                        "nvitop's readings, on GPUs)")
    t.add_argument("--accumulate-grad-batches", type=cli.positive(int), default=1, metavar="K",
                   help="one optimizer step every K batches, --batch-size split into them "
                        "(lesson 04a2's --accumulate: the K-1 others skip DDP's all-reduce)")
    t.add_argument("--gradient-clip-val", type=float, default=None, metavar="NORM",
                   help="clip the gradients' total norm to NORM before each step")
    t.add_argument("--sync-batchnorm", action="store_true",
                   help="BatchNorm's statistics over every rank's batch (SyncBatchNorm; GPUs only, "
                        "a model with BatchNorm: --model cnn_bn)")
    lightning_callbacks.add_flags(t)  # --keep-best, --early-stop
    old = p.add_argument_group("Lightning 1.x flags, answered with what Lightning 2 wants")
    old.add_argument("--gpus", default=None, help="removed in Lightning 2")
    old.add_argument("--num-processes", default=None, help="removed in Lightning 2")
    old.add_argument("--tpu-cores", default=None, help="removed in Lightning 2")


def check(args):
    """--max-epochs is --epochs; a Lightning 1.x flag or strategy, or a strategy this Lightning
    lacks, is one sentence (UserError) before any work. Returns the configuration to go on with."""
    from pytorch_lightning.strategies import StrategyRegistry
    if args.max_epochs is not None:
        args = config.replaced(args, epochs=args.max_epochs)
    lightning_compat.check_removed(args)
    if args.batch_size % args.accumulate_grad_batches:
        raise UserError(f"--accumulate-grad-batches {args.accumulate_grad_batches} must divide "
                        f"--batch-size {args.batch_size}: a step's batch is split into that many")
    if args.gradient_clip_val is not None and args.gradient_clip_val <= 0:
        raise UserError(f"--gradient-clip-val {args.gradient_clip_val}: a norm to clip to is "
                        f"positive")
    lightning_compat.check_sharded(args.strategy)
    lightning_compat.check_strategy(args.strategy, StrategyRegistry.available_strategies())
    if args.sync_batchnorm and args.model == "cnn":
        raise UserError("--sync-batchnorm changes nothing here: the model has no BatchNorm layer "
                        "(try --model cnn_bn)")
    return args


def accelerator(args):
    """What --accelerator names: 'cuda' for gpu, and for auto where this node has a GPU for each of
    its processes (trainup/devices.py's decision: else 'cpu', and why); one sentence where it asks
    for a GPU this machine lacks, or --sync-batchnorm runs elsewhere."""
    import torch
    name = "cuda" if args.accelerator in ("gpu", "cuda") else args.accelerator
    if args.accelerator == "auto" and torch.cuda.is_available():
        devices, _ = devices_and_nodes(args)
        name, why = trainup_devices.auto_device(devices if isinstance(devices, int) else 1)
        if why and os.environ.get("LOCAL_RANK", "0") == "0":  # Lightning's children get theirs
            print(f"note: {why}", file=sys.stderr)
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--accelerator {args.accelerator} needs an NVIDIA GPU, and torch sees "
                        f"none on this machine; use --accelerator cpu (or auto)")
    if getattr(args, "sync_batchnorm", False) and name != "cuda":
        raise UserError("--sync-batchnorm needs GPUs: torch's SyncBatchNorm refuses tensors on the "
                        f"{name} (the Trainer would fail at the first step); leave it out here")
    return name


def devices_and_nodes(args):
    """devices and num_nodes: the flags, else what torchrun or SLURM set (Lightning checks they
    agree), else 1."""
    ctx = distributed.from_env()
    launched = ctx.launcher in ("torchrun", "slurm")
    devices = args.devices or (str(ctx.local_world_size) if launched else "1")
    nodes = args.num_nodes or (ctx.nnodes if launched else 1)
    return (int(devices) if devices.lstrip("-").isdigit() else devices), nodes
