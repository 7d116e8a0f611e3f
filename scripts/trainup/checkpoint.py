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

from . import UserError, config


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
    values = config.as_dict(args).items()
    return {k: v for k, v in values if isinstance(v, (int, float, str, bool, type(None)))}


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


# --- Every rank's own part (a pipeline stage, experts): one file per rank -------------------------

RUN_FILE = "run.pt"  # rank 0's, beside the ranks' files: the epoch, flags, layout, position


def ranks_folder(args):
    """Where a run whose ranks hold different parts of the model keeps them: a file per rank."""
    return path_for(args).with_suffix(".ranks")


def save_ranks(folder, state, epoch, args, layout, position=None):
    """Each rank writes its own state (what it holds, and its optimizer's); rank 0 the epoch, the
    flags, the layout (flag -> value: which part each rank holds) and, for a stop inside an epoch,
    where it stopped (preempt.Stopper's position, every rank's random states in it), once. Written
    into a temporary folder that rank 0 renames when every rank's file is whole: a reader sees the
    old checkpoint or the new one."""
    import torch.distributed as dist
    folder = Path(folder)
    tmp, rank = folder.with_name(f".{folder.name}.tmp"), dist.get_rank()
    failed = None
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir(parents=True)
        except OSError as e:
            failed = f"checkpoint {folder} could not be written ({e.strerror or e})"
    failed = _first(dist, failed)  # also the barrier: the folder is there for every rank
    if failed is None:
        try:
            mine = tmp / f"rank{rank}.pt"
            with whole(folder, mine):
                torch.save(dict(state, epoch=epoch), mine)
            if rank == 0:
                with whole(folder, tmp / RUN_FILE):
                    torch.save({"epoch": epoch, "args": plain(args), "layout": layout,
                                "position": position}, tmp / RUN_FILE)
        except UserError as e:
            failed = str(e)
        failed = _first(dist, failed)  # every rank learns of any rank's failure
    if rank == 0:
        if failed is None:
            old = folder.with_name(f".{folder.name}.old")
            if folder.exists():
                os.replace(folder, old)
            os.replace(tmp, folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if failed is not None:
        raise UserError(failed)
    dist.barrier()  # the folder renamed before any rank goes on (and may stop, and be resumed)


def _first(dist, failed):
    """The first rank's failure (a sentence), or None: the same answer on every rank."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, failed)
    return next((f for f in everyone if f), None)


def load_ranks(folder, layout, args):
    """(this rank's state, the epoch to start from, the position inside it) from save_ranks's
    folder; (None, 1, None) when there is none. A folder saved with other flags or another layout
    is refused in one sentence: each rank's file holds the part that rank held."""
    import torch.distributed as dist
    folder = Path(folder)
    if not folder.exists():
        return None, 1, None
    run = _read_part(folder / RUN_FILE, folder)
    same_run(folder, run.get("args") or {}, args)
    if run.get("layout") != layout:
        said = " ".join(f"{k} {v}" for k, v in (run.get("layout") or {}).items())
        mine = " ".join(f"{k} {v}" for k, v in layout.items())
        raise UserError(f"checkpoint {folder} was saved by a job laid out as "
                        f"{said or 'another layout'}, and this one is {mine}: each rank's file "
                        f"holds the part that rank held; resume with the layout it was saved "
                        f"with, or use another --run-name")
    mine = _read_part(folder / f"rank{dist.get_rank()}.pt", folder)
    return mine, run["epoch"] + 1, run.get("position")


def _read_part(path, folder):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001  missing, torn or foreign: many exception types
        raise UserError(f"checkpoint {folder}: {path.name} cannot be read "
                        f"({type(e).__name__}): it is damaged or not a trainup checkpoint; "
                        f"delete it, or run without --resume") from None
