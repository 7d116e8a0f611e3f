"""Checkpoints that survive a crash: written by one process, to a temporary file, then renamed.

os.replace is atomic on POSIX: a reader (or a restarted run) sees the old checkpoint or the new
one, never half of one.
"""
import os
from pathlib import Path

import torch


def path_for(args):
    return Path(args.checkpoint_dir) / f"{args.run_name}.pt"


def save(path, model, optimizer, scheduler, epoch, args):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "epoch": epoch,
                "args": {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool, type(None)))}},
               tmp)
    os.replace(tmp, path)
    return path


def load(path, model, optimizer, scheduler, map_location="cpu"):
    """Restore a checkpoint if there is one; the epoch to start from (1 when there is none)."""
    path = Path(path)
    if not path.exists():
        return 1
    state = torch.load(path, map_location=map_location, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return state["epoch"] + 1
