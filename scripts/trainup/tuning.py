"""Lesson 04's tuning of DDP (_trainup_ddp_tuned.py): its flags and their refusals, and the
counter of gradient all-reduces that shows what --accumulate saves. The tuning itself (no_sync,
SGD, the warm-up, SyncBatchNorm) is in the script."""
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from . import UserError, distributed
from .cli import positive


def add_flags(p):
    """--accumulate, --optimizer, --warmup-steps and --sync-bn."""
    p.add_argument("--accumulate", type=positive(int), default=None,
                   help="split each rank's batch into K micro-batches, all-reduced once (no_sync), "
                        "and count all-reduces")
    p.add_argument("--optimizer", default="adadelta", choices=("adadelta", "sgd"),
                   help="sgd: momentum 0.9, the optimizer of the linear scaling rule "
                        "(set --lr, e.g. 0.01)")
    p.add_argument("--warmup-steps", type=positive(int), default=None,
                   help="raise the learning rate linearly from lr/N to lr over the first N steps")
    p.add_argument("--sync-bn", action="store_true",
                   help="BatchNorm statistics over the whole global batch (GPUs)")


def check(args, p):
    """Refused at parsing, before any process group: --accumulate must divide each process's batch,
    and times no --sweep."""
    per_rank = args.batch_size // max(distributed.from_env().world_size, 1)
    if args.accumulate and per_rank % args.accumulate:
        p.error(f"--accumulate {args.accumulate} must divide each process's batch "
                f"({per_rank} samples)")
    if args.accumulate and args.sweep:
        p.error("--accumulate and --sweep do not go together: a sweep times whole steps")


def check_sync_bn(model, device):
    """--sync-bn needs a BatchNorm layer to convert, and GPUs (SyncBatchNorm's own limit)."""
    if not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        raise UserError("--sync-bn changes nothing here: the model has no BatchNorm layer "
                        "(try --model cnn_bn)")
    if device.type != "cuda":
        raise UserError(f"--sync-bn needs GPUs: torch's SyncBatchNorm refuses modules on "
                        f"{device.type} (DDP raises 'SyncBatchNorm layers only work with GPU "
                        "modules')")


class AllReduces:
    """The gradient all-reduces of a DDP model, counted epoch by epoch."""

    def __init__(self):
        self.calls = 0

    def hook(self, state, bucket):
        """A communication hook doing DDP's own mean, counting each call."""
        self.calls += 1
        return default_hooks.allreduce_hook(None, bucket)

    def write(self, log, epoch, accumulate, micro_batch, micro_batches):
        """The epoch's "accumulate" record; then counting starts again for the next epoch."""
        log.write("accumulate", epoch=epoch, accumulate=accumulate, micro_batch=micro_batch,
                  micro_batches=micro_batches, allreduce_calls=self.calls)
        self.calls = 0


def count_allreduces(model):
    """--accumulate: count the gradient all-reduces (a communication hook doing DDP's own mean)."""
    counter = AllReduces()
    model.register_comm_hook(None, counter.hook)
    return counter
