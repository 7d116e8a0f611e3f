"""Lightning's own checkpoint, treated as the course treats every checkpoint: a damaged one to
resume from is one sentence, and a SIGTERM leaves one written whole and exit status 75
(resumable), as every script does. A run stopped inside an epoch goes on from the step it stopped
after, with the random states it had there (Loader): it ends with the parameters of a run never
stopped."""
import os
import shutil
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader

from .. import UserError, preempt


def readable(ckpt):
    """A checkpoint to resume from that Lightning can read: else one sentence before any process starts
    (Lightning would stop with a traceback from torch.load). A folder is a checkpoint of shards
    (ModelParallelStrategy's): whole once torch.distributed.checkpoint's .metadata (written last)
    and Lightning's meta.pt (the epoch, the loops) are in it."""
    if Path(ckpt).is_dir():
        lost = [f for f in (".metadata", "meta.pt") if not (Path(ckpt) / f).is_file()]
        if lost:
            raise UserError(f"checkpoint {ckpt} cannot be read (a folder of shards without "
                            f"{' and '.join(lost)}): it is damaged or not Lightning's; delete it, "
                            f"or run without --resume")
        return
    try:
        state = torch.load(ckpt, map_location="cpu", weights_only=False)  # Lightning's own files hold more
        assert isinstance(state, dict) and "state_dict" in state and "loops" in state
    except Exception as e:  # noqa: BLE001  damaged bytes fail in many ways (zip, pickle, EOF...)
        raise UserError(f"checkpoint {ckpt} cannot be read ({type(e).__name__}): it is damaged or not "
                        f"Lightning's; delete it, or run without --resume") from None


SIGNAL = ["SIGTERM"]  # the signal that stopped the run


class StopSignal(Callback):
    """SIGTERM and --stop-signal, as the course's other scripts answer them: every rank stops
    before the same step, whichever rank was signalled (preempt's agreement: the job's store on
    CPUs, an all-reduced flag on GPUs), and fitting() saves and exits 75. It replaces, as training
    starts, the handler Lightning set as fit began: that one broadcasts from inside the handler
    and signals the ranks it started once more, so ranks signalled together (a scheduler signals
    the job's whole group) run unequal collectives and hang; and it stops only where rank 0 was
    signalled."""

    def __init__(self, stop_signal):
        self.signals = {signal.SIGTERM, getattr(signal, f"SIG{stop_signal}")}
        self.pid, self.signal, self.posted, self.steps = os.getpid(), None, None, 0

    def on_train_start(self, trainer, pl_module):
        for sig in self.signals:
            signal.signal(sig, self._requested)
        device, world = trainer.strategy.root_device, trainer.world_size
        backend = dist.get_backend() if dist.is_initialized() else "none"
        self.comm = (preempt.TorchDistributed(SimpleNamespace(
            world_size=world, rank=trainer.global_rank, device=device, backend=backend))
            if world > 1 else preempt.Alone())
        self.how, self.every = (preempt.STOP_CHECK.get(device.type, preempt.STOP_CHECK["cuda"])
                                if world > 1 else ("", 1))

    def _requested(self, signum, frame):
        if os.getpid() == self.pid:  # not a loader worker forked from this process
            self.signal = signal.Signals(signum).name

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps += 1

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        """Before a step, after the steps before it are whole (Lightning's progress counts them):
        stop here when the ranks agree, as preempt.Stopper.due does after a step."""
        if self.steps % self.every or trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            return  # the epoch's last step is next: its progress would count it taken
        if self.comm.world_size == 1:
            stop = self.signal is not None
        elif self.how == "all_reduce":
            stop = self.comm.any(self.signal is not None)
        else:
            if self.signal is not None and not self.posted:  # no rank is past the next check
                self.posted = self.comm.post(preempt.STOP_KEY, str(self.steps + self.every))
            posted = self.comm.read(preempt.STOP_KEY)  # every rank skips the same steps: the
            stop = posted is not None and int(posted) <= self.steps  # first check past it agrees
        if stop:
            SIGNAL[0] = self.signal or "a signal on another rank"
            raise SIGTERMException


def stopped(trainer, ckpt):
    """A SIGTERM (a scheduler's time limit, scancel): Lightning's checkpoint of where the run stood, written
    whole (every rank joins, rank 0 writes, then a rename), and exit 75 as every course script: resumable."""
    tmp = ckpt.with_name(f".{ckpt.name}.tmp")
    loader = trainer.train_dataloader
    if isinstance(loader, Loader):  # the steps of this epoch already taken (none: it ended)
        progress = trainer.fit_loop.epoch_loop.batch_progress
        loader.trained = 0 if progress.is_last_batch else progress.current.completed
    trainer.save_checkpoint(tmp)  # every rank's shards, under ModelParallelStrategy
    if trainer.is_global_zero:
        replace(tmp, ckpt)
        print(f"stopped by {SIGNAL[0]} at epoch {trainer.current_epoch + 1}, step {trainer.global_step}: "
              f"{ckpt.name} saved; run again with --resume to go on", file=sys.stderr)
    sys.exit(preempt.STOPPED_EXIT)


def replace(tmp, ckpt):
    """os.replace, also for a folder of shards (a folder cannot replace a folder that holds
    files): the old one is moved aside, the new one put in its place, then the old one removed."""
    if Path(tmp).is_dir() and Path(ckpt).exists():
        old = ckpt.with_name(f".{ckpt.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(ckpt, old)
        os.replace(tmp, ckpt)
        shutil.rmtree(old)
    else:
        os.replace(tmp, ckpt)


class Loader(DataLoader):
    """A DataLoader that a run stopped inside an epoch goes on from. Lightning keeps a loader's
    state_dict() in its checkpoint and hands it back (load_state_dict) when it resumes inside an
    epoch; without one it would start the epoch's batches again from the first, in another order.

    Iterating a DataLoader draws from the global random generator (its base seed, and the order of
    shuffle=True), so the state of that generator as the epoch began is kept. On resume the epoch
    starts again from it (the same order), skips the batches already trained, then takes the state
    the stop saved (dropout's next masks). Lightning seeds every rank alike and each draws as much,
    so one rank's states are every rank's. Under a distributed strategy Lightning makes this class
    again with its own DistributedSampler."""

    epoch_rng, resume, trained = None, None, 0

    def __iter__(self):
        resume, self.resume = self.resume, None  # used once
        if resume:
            preempt.set_rng_state(resume["epoch_rng"])
            if resume.get("sampler_epoch") is not None:  # Lightning's DistributedSampler: a
                # resumed fit iterates before it sets the epoch, and the skip below draws now
                self.sampler.set_epoch(resume["sampler_epoch"])
        self.epoch_rng = preempt.rng_state()
        batches = super().__iter__()
        if resume:
            for _ in range(resume["trained"]):  # in memory: a few milliseconds a batch
                next(batches)
            preempt.set_rng_state(resume["rng"])
        return batches

    def state_dict(self):
        """Where the epoch stands; trained: its steps taken, set by stopped() before it saves."""
        return dict(epoch_rng=self.epoch_rng, rng=preempt.rng_state(), trained=self.trained,
                    sampler_epoch=getattr(self.sampler, "epoch", None))

    def load_state_dict(self, state):
        self.resume = state if state.get("trained") and state.get("epoch_rng") else None
