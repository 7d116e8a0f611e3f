"""Checkpoints that survive a crash: written by one process, to a temporary file, then renamed.

A run stopped inside an epoch (trainup/preempt.py) also saves its position there: the epoch, the steps
taken, the epoch's sums so far and every rank's random states; load() then starts at that epoch.

os.replace is atomic on POSIX: a reader (or a restarted run) sees the old checkpoint or the new
one, never half of one. A checkpoint that cannot be read, or holds another model, is one sentence.
"""
import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path

import torch

from . import UserError


def path_for(args):
    """Where this run's checkpoint goes; the folder is made and checked writable now, before any training."""
    folder = Path(args.checkpoint_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):  # root passes os.access even on a read-only file system
            pass
    except OSError as e:
        raise UserError(f"--checkpoint-dir {folder} cannot be created or written ({e.strerror or e}); "
                        f"point --checkpoint-dir at a folder you can write") from None
    _ARGS[str(folder / f"{args.run_name}.pt")] = args  # what load() checks a resumed checkpoint against
    return folder / f"{args.run_name}.pt"


# What a resumed run must share with the run that saved: another value would train another model, or other
# samples (a changed batch size re-trains or skips part of an epoch). The rest (epochs, lr, ...) may change.
SAME_ON_RESUME = ("lesson", "model", "dataset", "train_size", "batch_size", "precision")
_ARGS = {}  # checkpoint path -> this run's arguments (path_for)
_POSITIONS = {}  # checkpoint path -> the position inside an epoch that load() found there (None: an epoch's end)


def save(path, model, optimizer, scheduler, epoch, args, scaler=None, position=None):
    """epoch: the last whole epoch; position: where a stopped run was inside the next one (preempt.Stopper)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with whole(path, tmp):
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "epoch": epoch,
                    # fp16's loss scale, learned over the run: without it a resumed run starts again at 65536
                    "scaler": scaler.state_dict() if scaler is not None else {},
                    "position": position,
                    "args": plain(args)}, tmp)
        os.replace(tmp, path)
    return path


@contextlib.contextmanager
def whole(path, tmp):
    """Writing path through tmp: a write that fails (a full disk) leaves no half-written tmp behind, the
    last whole checkpoint in place, and one sentence."""
    try:
        yield
    except (OSError, RuntimeError) as e:
        if isinstance(e, RuntimeError) and not any(m in str(e) for m in TORN):
            raise
        full = getattr(e, "errno", None) in FULL or no_room(Path(path).parent)  # before tmp's bytes are freed
        shutil.rmtree(tmp, ignore_errors=True) if Path(tmp).is_dir() else Path(tmp).unlink(missing_ok=True)
        why = (e.strerror if isinstance(e, OSError) and e.strerror else
               os.strerror(errno.ENOSPC) if full else str(e).splitlines()[0][:80])
        raise UserError(f"checkpoint {path} could not be written ({why}); "
                        + ("the disk is full: " if full else "")
                        + "the last whole checkpoint is kept, nothing half-written is left") from None


FULL = (errno.ENOSPC, errno.EDQUOT)  # no space left, or over the quota
# torch.save's zip writer turns a write that fell short (a full disk) into a RuntimeError, not an
# OSError; so does its C++ stream when the file's buffer is flushed ("basic_ios::clear")
TORN = ("unexpected pos", "PytorchStreamWriter failed writing", "basic_ios::clear")


def no_room(folder, least=1 << 20):
    """Less than a MiB free where the file was going: what a full disk (or quota) looks like from here."""
    try:
        return shutil.disk_usage(folder).free < least
    except OSError:
        return False


def load(path, model, optimizer, scheduler, map_location="cpu", scaler=None):
    """Restore a checkpoint if there is one; the epoch to start from (1 when there is none)."""
    path = Path(path)
    if not path.exists():
        return 1
    state = read(path, map_location)
    epoch = state["epoch"] + 1  # stopped inside it (a position) or the next whole one
    _POSITIONS[str(path)] = state.get("position")
    same_run(path, state.get("args") or {}, _ARGS.get(str(path)))
    try:
        model.load_state_dict(state["model"])
    except RuntimeError:
        saved = state.get("args", {}).get("model", "another model")
        raise UserError(f"checkpoint {path} holds a {saved} whose weights do not fit this run's model; resume "
                        f"with the flags it was saved with, or use another --run-name") from None
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    return epoch


# What every checkpoint of save() holds; Lightning's .ckpt files hold this key instead
KEYS = ("model", "optimizer", "scheduler", "epoch")
LIGHTNING_KEY = "pytorch-lightning_version"


def read(path, map_location="cpu"):
    """The checkpoint in path, checked to be one of save()'s; else one sentence saying what it
    is."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001  torch's unpickler meets bytes that are not a
        # checkpoint with many exception types (IndexError, KeyError, UnpicklingError, ...)
        raise UserError(f"checkpoint {path} cannot be read ({type(e).__name__}): it is damaged "
                        f"or not a trainup checkpoint; delete it, or run without --resume"
                        ) from None
    if isinstance(state, dict) and LIGHTNING_KEY in state:
        raise UserError(f"checkpoint {path} is a Lightning checkpoint (.ckpt), not one of this "
                        f"script's: resume it with _trainup_lightning.py, or use another "
                        f"--run-name")
    if (not isinstance(state, dict) or not all(k in state for k in KEYS)
            or not isinstance(state["epoch"], int)):
        raise UserError(f"checkpoint {path} holds no trainup checkpoint (its model, optimizer, "
                        f"scheduler and epoch): delete it, or run without --resume")
    return state


def plain(args):
    """The run's flags that a checkpoint keeps: the plain values (what same_run compares on resume)."""
    return {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool, type(None)))}


def same_run(path, saved, args):
    """Refuses, in one sentence naming the flag, a resume whose flags would train another model or other
    samples than the run that saved path (SAME_ON_RESUME)."""
    if args is None:
        return
    for key in SAME_ON_RESUME:
        mine = getattr(args, key, None)
        if key in saved and mine is not None and saved[key] != mine:
            if key == "model":
                raise UserError(f"checkpoint {path} holds a {saved[key]} whose weights do not fit this run's "
                                f"model ({mine}); resume with the flags it was saved with, or use another --run-name")
            flag = "the script" if key == "lesson" else f"--{key.replace('_', '-')}"
            raise UserError(f"checkpoint {path} was saved by a run with {flag} {saved[key]}, and this run has "
                            f"{mine}: resume with the flags it was saved with, or use another --run-name")


def position(path):
    """Where the run saved in path stopped inside an epoch, as load() read it; None at an epoch's end."""
    return _POSITIONS.get(str(path))
