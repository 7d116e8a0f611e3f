"""Lightning's own checkpoint, treated as the course treats every checkpoint: a damaged one to resume from is
one sentence, and a SIGTERM leaves one written whole and exit status 75 (resumable), as every script does."""
import os
import sys

import torch

from . import UserError, preempt


def readable(ckpt):
    """A checkpoint to resume from that Lightning can read: else one sentence before any process starts
    (Lightning would stop with a traceback from torch.load)."""
    try:
        state = torch.load(ckpt, map_location="cpu", weights_only=False)  # Lightning's own files hold more
        assert isinstance(state, dict) and "state_dict" in state and "loops" in state
    except Exception as e:  # noqa: BLE001  damaged bytes fail in many ways (zip, pickle, EOF...)
        raise UserError(f"checkpoint {ckpt} cannot be read ({type(e).__name__}): it is damaged or not "
                        f"Lightning's; delete it, or run without --resume") from None


def stopped(trainer, ckpt):
    """A SIGTERM (a scheduler's time limit, scancel): Lightning's checkpoint of where the run stood, written
    whole (every rank joins, rank 0 writes, then a rename), and exit 75 as every course script: resumable."""
    tmp = ckpt.with_name(f".{ckpt.name}.tmp")
    trainer.save_checkpoint(tmp)
    if trainer.is_global_zero:
        os.replace(tmp, ckpt)
        print(f"stopped by SIGTERM at epoch {trainer.current_epoch + 1}, step {trainer.global_step}: "
              f"{ckpt.name} saved; run again with --resume to go on", file=sys.stderr)
    sys.exit(preempt.STOPPED_EXIT)
