"""Lightning 1.x flags met in old tutorials, answered in one sentence each with what Lightning 2 wants.

Lightning 2.0 removed the Trainer's device-count flags (gpus, num_processes, tpu_cores: all became
`devices`) and the strategies dp (torch's DataParallel) and horovod; precision 16 became '16-mixed'.
The sentences name the new spelling, or the course's lesson for what was removed.
"""
from .. import UserError

# Trainer flags Lightning 2 removed: the flag (as this script spells it) -> what to write now.
REMOVED_FLAGS = {
    "gpus": "Lightning 2 removed Trainer(gpus=N): write --accelerator gpu --devices {value} "
            "(Trainer(accelerator='gpu', devices={value}))",
    "num_processes": "Lightning 2 removed Trainer(num_processes=N): write --accelerator cpu --devices {value} "
                     "(Trainer(accelerator='cpu', devices={value}))",
    "tpu_cores": "Lightning 2 removed Trainer(tpu_cores=N): write --accelerator tpu --devices {value}",
}

# Strategies Lightning 2 removed -> the sentence that answers them.
REMOVED_STRATEGIES = {
    "dp": "Lightning 2 removed strategy 'dp' (torch's DataParallel, one process driving all GPUs): use "
          "--strategy ddp, one process per device, also on one machine (lesson 03: why DDP replaced DataParallel)",
    "horovod": "Lightning 2 removed strategy 'horovod': use --strategy ddp, or Horovod itself without Lightning "
               "(lesson 05, scripts/_trainup_horovod.py)",
    "ddp2": "Lightning 2 has no strategy 'ddp2' (removed in the 1.x series): use --strategy ddp",
    "ddp_sharded": "Lightning 2 removed strategy 'ddp_sharded' (FairScale): the course's sharded run "
                   "is scripts/_trainup_lightning_fsdp.py (FSDP2)",
}

# Precision spellings Lightning 1.x used -> Lightning 2's names (Lightning 2 still takes the old ones, warning).
PRECISIONS = {"32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed", "64": "64-true"}


def check_removed(args):
    """Raise UserError (one sentence) for a Lightning 1.x flag or strategy; nothing for Lightning 2 ones."""
    for flag, sentence in REMOVED_FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            raise UserError(sentence.format(value=value))
    if args.strategy in REMOVED_STRATEGIES:
        raise UserError(REMOVED_STRATEGIES[args.strategy])


def check_sharded(name):
    """Lightning's FSDPStrategy (fsdp, fsdp_cpu_offload): one sentence. It needs GPUs, and this
    script's log callback saves the model from rank 0 alone, which under FullyShardedDataParallel
    holds rank 0's shards only (gathering them needs every rank): the sharded script does that."""
    if name.startswith("fsdp"):
        raise UserError(f"--strategy {name}: Lightning's FSDPStrategy needs GPUs and its shards "
                        f"gathered by every rank; the course's sharded Lightning run is "
                        f"scripts/_trainup_lightning_fsdp.py (FSDP2 under ModelParallelStrategy), "
                        f"on any machine")


def check_strategy(name, available):
    """A strategy name this Lightning knows, or one sentence listing those it does."""
    if name != "auto" and name not in available:
        raise UserError(f"this Lightning has no strategy {name!r}; it offers auto, {', '.join(sorted(available))}")


def precision(text):
    """Lightning 2's name for a precision given the course's (or 1.x's) way: 16 -> 16-mixed."""
    return PRECISIONS.get(text, text)
