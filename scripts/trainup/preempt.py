"""Runs that lose nothing: names that cannot collide, one writer per run, and stopping to resume later.

Clusters and clouds stop jobs: SLURM sends SIGTERM at the time limit or on preemption (and a signal of
your choice ahead of it with `#SBATCH --signal=B:USR1@60`); a spot instance gets a short notice. A
script with a Stopper then finishes its current step, saves a checkpoint holding where it was inside
the epoch (the step, the epoch's sums so far, every rank's random states), logs the status "stopped",
and exits with STOPPED_EXIT. `--resume` continues from that very step, and ends with the parameters of a
run that was never stopped.

In a job of many processes, all ranks must stop at the same step (one saving alone would leave the
others waiting in their next all-reduce), whichever of them got the signal. An all-reduce of the flag
after every step would agree, but it is one more collective in every step, and it would show in every
timing and profile of the course. On the CPU the ranks move in lockstep (a step's gradients are
all-reduced before any rank starts the next), so the first rank asked posts "stop after the next step"
on the job's key-value store, and every rank reads the store after each step: no collective. On a GPU a
rank's CPU runs steps ahead of its GPU, so no such bound holds: there the flag is all-reduced every 20
steps (each check makes the CPU wait for the GPU). STOP_CHECK holds that choice.
"""
import itertools
import os
import random
import signal
import socket
import time

import torch
from torch.utils.data import DataLoader

from . import UserError, checkpoint, config
from .meter import Meter

STOPPED_EXIT = 75  # sysexits.h's EX_TEMPFAIL, "try again later": stopped, resumable (the SLURM template requeues)
SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)  # what --stop-signal may name
# device -> (how the ranks agree on a stop, steps between checks); a job of one process stops at once
STOP_CHECK = {"cpu": ("store", 1), "cuda": ("all_reduce", 20)}
STOP_KEY = "trainup/stop_after"  # "<epoch>:<step>", posted once by the first rank asked to stop
WALL_BEFORE = {}  # epoch -> its training seconds before a stop, added to the resumed epoch's wall_s by RunLog.epoch


# --- Talking to the other ranks (torch.distributed, or Horovod) -------------------------------------------

GONE = ("this rank ends here, and --resume continues from the last checkpoint")


def _asking_store(ask):
    """The job's store is served by torchrun's agent (or rank 0): when it stops answering, the launcher is
    gone (killed, out of memory), and a rank left alone would train on as an orphan."""
    try:
        return ask()
    except (RuntimeError, OSError):  # torch's DistNetworkError and DistStoreError are RuntimeErrors
        raise UserError(f"the job's key-value store stopped answering (its launcher, or rank 0, is gone): "
                        f"{GONE}") from None


class Alone:
    """A job of one process."""
    world_size, rank = 1, 0
    store = None  # the job's key-value store (ranks > 1)

    def any(self, flag):
        return flag

    def post(self, key, value):
        """Put value under key unless a rank already did; returns the value that stays."""
        return _asking_store(lambda: self.store.compare_set(key, "", value).decode())

    def read(self, key):
        return _asking_store(lambda: self.store.get(key).decode() if self.store.check([key]) else None)

    def gather(self, obj):
        return [obj]

    def broadcast(self, obj):
        return obj

    def close(self):
        pass


class TorchDistributed(Alone):
    """The DDP script's ranks, through torch.distributed (gloo or NCCL)."""

    def __init__(self, ctx):
        import torch.distributed as dist
        self.world_size, self.rank, self.ctx = ctx.world_size, ctx.rank, ctx
        # the store the ranks met in (under torchrun, this attempt's part of the agent's store)
        self.store = dist.distributed_c10d._get_default_store() if self.world_size > 1 else None

    def any(self, flag):
        if self.world_size == 1:  # a job of one (Fabric's one device) joins no process group
            return flag
        import torch.distributed as dist
        device = self.ctx.device if self.ctx.backend == "nccl" else "cpu"
        t = torch.tensor([int(flag)], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def gather(self, obj):
        if self.world_size == 1:
            return [obj]
        import torch.distributed as dist
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj):
        if self.world_size == 1:
            return obj
        import torch.distributed as dist
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def close(self):
        from . import distributed
        distributed.cleanup(self.ctx)


class Horovod(Alone):
    """The Horovod script's ranks."""

    def __init__(self, hvd):
        self.hvd, self.world_size, self.rank = hvd, hvd.size(), hvd.rank()
        if self.world_size > 1:  # Horovod has no store of its own to share: rank 0 serves torch's
            import torch.distributed as dist
            mine = dist.TCPStore(socket.gethostname(), 0, self.world_size, is_master=True,
                                 wait_for_workers=False) if self.rank == 0 else None
            host, port = hvd.broadcast_object((socket.gethostname(), mine.port if mine else 0), root_rank=0)
            self.store = mine or dist.TCPStore(host, port, self.world_size, is_master=False)

    def any(self, flag):
        return bool(self.hvd.allreduce(torch.tensor([int(flag)]), op=self.hvd.Max, name="stop").item())

    def gather(self, obj):
        return self.hvd.allgather_object(obj)

    def broadcast(self, obj):
        return self.hvd.broadcast_object(obj, root_rank=0)

    def close(self):
        self.hvd.barrier()
        self.hvd.shutdown()


# --- Random states ------------------------------------------------------------------------------------------

def rng_state():
    import numpy as np
    kind, keys, pos, has_gauss, gauss = np.random.get_state()  # as plain lists: torch.load(weights_only) reads them
    state = dict(torch=torch.get_rng_state(), python=random.getstate(),
                 numpy=[kind, keys.tolist(), pos, has_gauss, gauss])
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state):
    import numpy as np
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --- The stopper --------------------------------------------------------------------------------------------

class Stopper:
    """Catches SIGTERM and --stop-signal; at the next step boundary that all ranks agree on, saves the run
    where it is (rank 0 writes, atomically) and exits with STOPPED_EXIT.

        stop = preempt.Stopper(args)                 # first: the run's name is settled here
        args = stop.args
        ...checkpoint.load, RunLog...
        stop.watch(ckpt, log, model, optimizer, scheduler, scaler)
        train_epoch(model, stop.batches(train_loader, epoch), ...)   # train_epoch: meter = preempt.meter(loader)
    """

    def __init__(self, args, comm=None, catch=True):
        """catch=False: the signals are another process's to catch, which passes the stop on (a Ray
        worker's loop runs in a thread, where Python sets no handler: Ray's driver catches them)."""
        self.comm = comm or Alone()
        self.signal, self.pid = None, os.getpid()
        # under torchrun (its agent is this process's parent): watched at each stop check
        self.launcher = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None
        if getattr(args, "run_name_default", False):  # rank 0's default name, for every rank
            args = config.replaced(args, run_name=self.comm.broadcast(args.run_name))
        self.args = args  # the script goes on with this one: args = stop.args
        for sig in {signal.SIGTERM, getattr(signal, f"SIG{args.stop_signal}")} if catch else ():
            signal.signal(sig, self._requested)
        self.position, self.watched, self.how, self.posted = None, None, "", None

    def _requested(self, signum, frame):
        if os.getpid() != self.pid:  # a forked child (a DataLoader worker), hit by a signal to the whole
            # group (SLURM's time limit, scancel --signal, kill -TERM -PGID): the stop is the main process's.
            # Dying here would fail the main process's next batch; it shuts its workers down as it exits.
            signal.signal(signum, signal.SIG_IGN)
            return
        self.signal = signal.Signals(signum).name  # only a flag: the step in progress finishes first

    def watch(self, ckpt, log, model, optimizer, scheduler, scaler=None, save=None, saved=None,
              **extra):
        """What a stop saves; on --resume, where the checkpoint says the run stopped. extra: more objects with
        state_dict() (a warm-up schedule), saved and restored with the position. A sharded model
        saves itself: save(epochs_done, position) runs on every rank, and saved is the position
        its checkpoint held (None: rank 0 writes checkpoint.save's one file)."""
        self.watched = dict(ckpt=ckpt, log=log, model=model, optimizer=optimizer, scheduler=scheduler,
                            scaler=scaler, extra=extra, save=save)
        self.position = (saved if save else checkpoint.position(ckpt)) if self.args.resume else None
        if self.position:
            for name, obj in extra.items():
                if obj is not None and name in self.position["extra"]:
                    obj.load_state_dict(self.position["extra"][name])
                    if isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
                        # a scheduler made afresh (a warm-up) set its first rate on the
                        # optimizer; the rate at the stop is the one its last step set
                        for group, lr in zip(obj.optimizer.param_groups, obj.get_last_lr()):
                            group["lr"] = lr
        return self

    def batches(self, loader, epoch):
        """The epoch's batches, from where a stopped run left off; a stop saves and exits between two steps."""
        device = self.watched["model"].parameters().__next__().device.type if self.watched else "cpu"
        self.how, every = STOP_CHECK.get(device, STOP_CHECK["cuda"]) if self.comm.world_size > 1 else ("", 1)
        position = self.position if self.position and self.position["epoch"] == epoch else None
        self.position = None  # used once
        if position and position["world_size"] != self.comm.world_size:
            position = resized(position, self.comm.world_size, loader, self.watched["ckpt"])
        return Steps(self, loader, epoch, position, every * (getattr(self.args, "accumulate", None) or 1))

    def check(self):
        """True when some rank was asked to stop (all-reduced: every rank gets the same answer)."""
        return self.comm.any(self.signal is not None)

    def due(self, epoch, step, every):
        """After a step that ends a check's interval: whether every rank stops now (the same answer on all)."""
        if self.launcher and os.getppid() != self.launcher:  # torchrun's agent died: no orphans
            raise UserError(f"torchrun (process {self.launcher}), which started this rank, is gone: {GONE}")
        if self.comm.world_size == 1:
            return self.signal is not None
        if self.how == "all_reduce":
            return self.check()
        if self.signal is not None and not self.posted:  # the others are at most one interval behind
            self.posted = self.comm.post(STOP_KEY, f"{epoch}:{step + every}")
        return self.comm.read(STOP_KEY) == f"{epoch}:{step}"

    def after_epoch(self, epoch):
        """Between epochs: a stop asked for during evaluation (or in Hogwild, whose workers train a whole epoch
        at a time; or, ranks agreeing through the store, in an epoch's last step, whose posted
        "stop after the next step" that epoch does not have) exits here, saved as any stop is:
        with the random states, at step 0 of the next epoch."""
        if self.check():
            self._exit(*self._save(epoch + 1, 0, Meter(), 0.0), f"stopped after epoch {epoch}")

    def stop(self, epoch, step, meter, wall_s):
        """Save where the run is, log it, leave the job together, and exit STOPPED_EXIT."""
        self._exit(*self._save(epoch, step, meter, wall_s), f"stopped in epoch {epoch} after step {step}")

    def _save(self, epoch, step, meter, wall_s):
        w = self.watched
        mine = dict(rng=rng_state(), meter=meter.as_tensor().tolist())
        ranks = self.comm.gather(mine)  # every rank's random states, for rank 0 to save
        position = dict(epoch=epoch, step=step, wall_s=wall_s, world_size=self.comm.world_size, ranks=ranks,
                        extra={k: v.state_dict() for k, v in w["extra"].items() if v is not None})
        if w["save"]:  # every rank writes its shards
            w["save"](epoch - 1, position)
        elif self.comm.rank == 0:
            checkpoint.save(w["ckpt"], w["model"], w["optimizer"], w["scheduler"], epoch - 1, self.args,
                            w["scaler"], position=position)
        return w["ckpt"], w["log"]

    def _exit(self, ckpt, log, where):
        if self.comm.rank == 0:
            print(f"{self.signal or 'a signal on another rank'}: {where}; --resume continues from {ckpt}")
        log.summary(checkpoint=ckpt, status="stopped")
        self.comm.close()
        raise SystemExit(STOPPED_EXIT)


def resized(position, world, loader, ckpt):
    """A position saved inside an epoch by a job of another size, for this one (elastic torchrun:
    nodes come and go). With the global batch kept and no sample repeated to even out the ranks'
    shares, step k takes the same samples at any size (DistributedSampler deals them out in turn:
    rank r of W gets every W-th), so the epoch goes on from the same step. The sums so far go to
    rank 0 (the job's totals are what is logged); random states start afresh (a gone rank's dropout
    masks have nowhere to go)."""
    old, n = position["world_size"], len(loader.dataset)
    if n % old or n % world:
        raise UserError(f"checkpoint {ckpt} was stopped inside an epoch by a job of {old} "
                        f"process(es), and this one has {world}: {n} samples do not split evenly "
                        f"over both, so the rest of the epoch would not be the same samples; resume "
                        f"with {old}, or from an epoch's end")
    total = [sum(column) for column in zip(*(r["meter"] for r in position["ranks"]))]
    ranks = [dict(rng=None, meter=total if r == 0 else [0.0] * len(total)) for r in range(world)]
    return dict(position, world_size=world, ranks=ranks)


def leave_to_main(args):
    """In a worker process (Hogwild's): SIGTERM and --stop-signal are the main process's to act on, also
    when they reach the whole process group (SLURM's time limit): it stops between epochs and then ends
    the workers itself (next_epoch returns None)."""
    for sig in {signal.SIGTERM, getattr(signal, f"SIG{args.stop_signal}")}:
        signal.signal(sig, signal.SIG_IGN)


def loader_worker_init(worker_id, owner=None):
    """A DataLoader worker leaves SIGTERM and the stop signals to the main process, also when they reach
    the whole process group (SLURM's time limit, scancel --signal): torch's own handler would end the
    worker (unless its parent sent it), and the main process's next batch would fail. The main process
    ends its workers itself as it exits; they also end when it dies, even by SIGKILL (end_with).
    owner: the main process's id (data.loader binds it)."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if owner is not None:
        end_with(owner)


def end_with(owner):
    """This process ends as soon as process `owner` does (Linux). A worker started by a fork server
    is the server's child, not the main process's: torch's watchdog and a parent-death signal
    (prctl's PR_SET_PDEATHSIG) watch the server, and the server lives on while any worker holds its
    pipe. So a thread waits on a pidfd of the main process, which turns readable when it ends."""
    import select
    import threading
    try:
        fd = os.pidfd_open(owner)
    except ProcessLookupError:  # gone already
        os._exit(1)
    except (AttributeError, OSError):  # not Linux (or older than 5.3): torch's watchdog alone
        return

    def wait():
        select.select([fd], [], [])
        os._exit(1)
    threading.Thread(target=wait, name="trainup-end-with-main", daemon=True).start()


def next_epoch(go, parent):
    """A worker waits for the main process's next epoch; None: stop (told so, or the main process died)."""
    import queue
    while True:
        try:
            return go.get(timeout=1)
        except queue.Empty:
            if os.getppid() != parent:  # orphaned: the main process is gone, and its signal was ignored
                return None


class Steps:
    """An epoch's batches for the Stopper: skips the steps a stopped run already took, and checks for a stop
    after each step (every `every` steps in a multi-process job)."""

    def __init__(self, stopper, loader, epoch, position, every):
        self.stopper, self.loader, self.epoch, self.every = stopper, loader, epoch, every
        self.skip = position["step"] if position else 0
        self.rank_state = position["ranks"][stopper.comm.rank] if position else None
        self.meter, self.wall_before = Meter(), 0.0
        if position:  # the epoch's sums and seconds so far, so that its log line covers the whole epoch
            self.meter = Meter.from_tensor(torch.tensor(self.rank_state["meter"], dtype=torch.float64))
            self.wall_before = WALL_BEFORE[epoch] = position.get("wall_s", 0.0)

    def __len__(self):
        return len(self.loader) - self.skip

    def __iter__(self):
        started = time.perf_counter()
        # A DataLoader draws its base seed from the random generator when iterated: a stop at an epoch's
        # start was saved before that draw, one inside an epoch after it, so the states go back in that order.
        rng = self.rank_state and self.rank_state["rng"]  # none after a resize (resized)
        if rng and not self.skip:
            set_rng_state(rng)
        batches = iter(_skipped(self.loader, self.skip))
        if rng and self.skip:
            # a loader whose __iter__ is a generator (Fabric's) starts, and draws its seed, at the
            # first batch asked for: ask for it before the states go back
            batches = itertools.chain([first] if (first := next(batches, None)) is not None else [],
                                      batches)
            set_rng_state(rng)
        for step, batch in enumerate(batches, self.skip + 1):
            yield batch  # the script trains one step on it
            if step % self.every == 0 and self.stopper.due(self.epoch, step, self.every):
                self.stopper.stop(self.epoch, step, self.meter, self.wall_before + time.perf_counter() - started)


def _skipped(loader, skip):
    """The loader without its first `skip` batches, without loading them where it can (a DataLoader)."""
    if not skip:
        return loader
    if isinstance(loader, DataLoader) and loader.batch_size and loader.sampler is not None:
        rest = list(loader.sampler)[skip * loader.batch_size:]  # the sampler's order, after set_epoch
        return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=rest, num_workers=loader.num_workers,
                          pin_memory=loader.pin_memory, collate_fn=loader.collate_fn, drop_last=loader.drop_last,
                          generator=loader.generator, worker_init_fn=loader.worker_init_fn,
                          multiprocessing_context=loader.multiprocessing_context)  # as it started
    return itertools.islice(loader, skip, None)


def _steps(loader):
    while not isinstance(loader, Steps) and hasattr(loader, "loader"):
        loader = loader.loader  # through wrappers such as the profiler's steps
    return loader if isinstance(loader, Steps) else None


def meter(loader):
    """The Meter a training epoch adds its steps to: a stopped run's sums so far when it resumes mid-epoch."""
    steps = _steps(loader)
    return steps.meter if steps is not None else Meter()


def first_step(loader):
    """The number of an epoch's first step in this run: 1, or the step after the one a stopped run
    took last, when it resumes mid-epoch (so that per-step records number on, not from 1 again)."""
    steps = _steps(loader)
    return steps.skip + 1 if steps is not None else 1
