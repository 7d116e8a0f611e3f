"""What the Fabric script (lesson 07) needs around Fabric itself, so that its diff against lesson
04's shows Fabric's calls: Fabric made from the course's flags (a refusal is one sentence), the
GradScaler it keeps, its backend, the record of what it chose, and leaving the group together."""
import logging
import warnings
from types import SimpleNamespace

import torch.distributed as dist

from .. import UserError, distributed
from . import lightning_compat, lightning_flags


def make(args):
    """Fabric from --accelerator, --devices, --num-nodes, --strategy and --precision; devices and
    nodes from torchrun or SLURM when the flags leave them out (as the Trainer's)."""
    from lightning_fabric import Fabric
    from lightning_fabric.utilities.exceptions import MisconfigurationException

    # Fabric's banners ("Initializing distributed: ...") are INFO: the course's lines say what ran
    logging.getLogger("lightning_fabric").setLevel(logging.WARNING)
    # SLURM may be installed here for lesson 04b: a run outside a job is deliberate
    warnings.filterwarnings("ignore", message="The `srun` command is available")
    devices, nodes = lightning_flags.devices_and_nodes(args)
    try:
        return Fabric(accelerator=lightning_flags.accelerator(args), devices=devices,
                      num_nodes=nodes, strategy=args.strategy,
                      precision=lightning_compat.precision(args.precision))
    except (MisconfigurationException, ValueError, RuntimeError, TypeError) as e:
        raise UserError(f"Fabric refuses these flags: {str(e).splitlines()[0]}") from None


def scaler(fabric):
    """--precision 16's GradScaler: Fabric's own (fabric.backward scales the loss, the optimizer's
    step unscales), saved and restored with the checkpoint as lesson 04's."""
    return getattr(fabric.strategy.precision, "scaler", None)


def backend(fabric):
    return dist.get_backend() if dist.is_initialized() else "none"


def describe(fabric, loader):
    """What Fabric chose, for the log: its strategy, launcher and world, and the train loader's
    sampler (a DistributedSampler once the strategy is distributed)."""
    environment = getattr(fabric.strategy, "cluster_environment", None)
    return dict(strategy=type(fabric.strategy).__name__,
                accelerator=type(fabric.accelerator).__name__,
                precision=type(fabric.strategy.precision).__name__, world_size=fabric.world_size,
                num_nodes=getattr(fabric.strategy, "num_nodes", 1),
                devices=getattr(fabric.strategy, "num_processes", 1),
                launcher=type(environment).__name__ if environment else "none",
                sampler=type(loader.sampler).__name__)


def context(fabric):
    """The job as lesson 04's helpers read it (rank, world size, device, backend): the stop signal
    (preempt.TorchDistributed) agrees on a step through the group Fabric joined."""
    return SimpleNamespace(world_size=fabric.world_size, rank=fabric.global_rank,
                           device=fabric.device, backend=backend(fabric))


def leave(fabric):
    """Leave together, as lesson 04's scripts do: a barrier, then the group destroyed where
    gloo's threads cannot deadlock on the interpreter's lock (distributed.cleanup)."""
    distributed.cleanup(context(fabric))
