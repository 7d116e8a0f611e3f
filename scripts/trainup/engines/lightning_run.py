"""What the course adds around a Lightning run, so that the lesson's script shows the
LightningModule, the LightningDataModule and the Trainer: the callbacks (the course's log and
checkpoint, --monitor's, Lightning's own checkpoint), TensorBoard's folder, devices and num_nodes
from the launcher, the checks made once the Trainer knows its world size, and Lightning's refusals
and SIGTERM answered as every course script answers them (one sentence; a checkpoint saved whole
and exit status 75).
"""
import contextlib
import logging
import shutil
import warnings
from pathlib import Path

from lightning_fabric.utilities.exceptions import MisconfigurationException
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.loggers import TensorBoardLogger
from pytorch_lightning.utilities.exceptions import SIGTERMException
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from .. import UserError, distributed, runlock
from . import lightning_callbacks, lightning_ckpt, lightning_flags, lightning_gpustats
from .lightning_log import CourseLog

# Lightning's banners ("GPU available: ...", "Initializing distributed ...", "`Trainer.fit`
# stopped") are INFO messages of these loggers (pytorch_lightning's import, above, set them to
# INFO): the course's own lines say what ran, so only warnings and errors pass.
for _name in ("pytorch_lightning", "lightning_fabric", "lightning.pytorch", "lightning.fabric"):
    logging.getLogger(_name).setLevel(logging.WARNING)
QUIET = (  # (message start, why it does not apply here)
    ("The `srun` command is available",
     "SLURM is installed here for lesson 04b; a run outside a job is deliberate"),
    (".*does not have many workers",
     "the data sets are tensors in memory: worker processes would only add start-up"),
    ("Checkpoint directory .* exists and is not empty",
     "the course's checkpoint folder holds other runs' files"),
    (".*`batch_size` .* ambiguous",
     "each batch is one (images, labels) pair; batch_size is passed anyway"),
    ("The number of training batches .* is smaller than the logging interval",
     "quick runs have few steps"),
    (".*isinstance\\(treespec, LeafSpec\\)` is deprecated",
     "inside Lightning 2.6.6 with torch 2.13, not this code"),
)
for _message, _why in QUIET:
    warnings.filterwarnings("ignore", message=_message)


class Run:
    """One Lightning run's plumbing: its devices, nodes, tensorboard and callbacks are the
    Trainer's."""

    def __init__(self, args, script):
        self.args, self.lock = args, None
        log_dir = Path(args.log_dir)
        if rank_zero_only.rank == 0 and not args.resume:  # a fresh run, a fresh TensorBoard...
            log_dir.mkdir(parents=True, exist_ok=True)  # ...once it holds the run's lock (RunLog's
            # own): a live run's folder stays
            self.lock = runlock.Lock(log_dir / f"{args.run_name}.lock", f"run {args.run_name!r}")
            shutil.rmtree(log_dir / "tensorboard" / args.run_name, ignore_errors=True)
            shutil.rmtree(lightning_callbacks.best_dir(args), ignore_errors=True)  # --keep-best's
        # the device decided once (a GPU for each of a node's processes), or one sentence
        self.accelerator = accelerator = lightning_flags.accelerator(args)
        watchers, self.skipped = lightning_gpustats.monitors(args, accelerator)
        records = [("monitor", dict(callbacks=[type(c).__name__ for c in watchers],
                                    skipped=self.skipped))] if args.monitor else []
        course_log = CourseLog(args, script, records)
        self.devices, self.nodes = lightning_flags.devices_and_nodes(args)
        self.tensorboard = TensorBoardLogger(save_dir=str(log_dir / "tensorboard"), version="",
                                             name=args.run_name, default_hp_metric=False)
        own_ckpt = ModelCheckpoint(dirpath=args.checkpoint_dir, enable_version_counter=False,
                                   filename=f"{args.run_name}-lightning")  # Lightning's, by rank 0
        self.callbacks = [course_log, *watchers, own_ckpt, *lightning_callbacks.callbacks(args),
                          lightning_ckpt.StopSignal(args.stop_signal)]  # SIGTERM, --stop-signal
        self.ckpt = Path(args.checkpoint_dir) / f"{args.run_name}-lightning.ckpt"

    @property
    def processes(self):
        """devices x num_nodes: every process of the job, where --devices is a count."""
        if not isinstance(self.devices, int):
            raise UserError(f"--devices {self.devices}: give a number of processes a node here "
                            f"(the strategy's mesh is made before Lightning counts them)")
        return self.devices * self.nodes

    def release(self):
        """The run's lock let go: inside a notebook's kernel the process lives on after the run."""
        if self.lock:
            self.lock.release()

    @contextlib.contextmanager
    def refusals(self):
        """Around the Trainer's making: a flag Lightning refuses is one sentence, no traceback."""
        try:
            yield
        except (MisconfigurationException, ImportError, ValueError, RuntimeError, TypeError) as e:
            self.release()
            raise UserError(f"Lightning refuses these flags: {str(e).splitlines()[0]}") from None

    @contextlib.contextmanager
    def fitting(self, trainer):
        """Around Trainer.fit. First, once the Trainer knows its world size and before Lightning
        starts the other processes: the global batch must split evenly; --monitor's note; `with`
        gives the checkpoint to resume from (checked readable: lightning_ckpt), or None.
        Then Lightning's refusals in one sentence; a SIGTERM or --stop-signal (every rank stops
        before the same step: lightning_ckpt.StopSignal) saves its checkpoint whole and exits 75
        (lightning_ckpt.stopped); at the end, where TensorBoard's files are."""
        args, world = self.args, trainer.world_size
        try:
            distributed.per_rank_batch(args.batch_size, world)
            if self.skipped and trainer.is_global_zero:
                print(self.skipped)
            resume = args.resume and self.ckpt.exists()
            if resume:
                lightning_ckpt.readable(self.ckpt)
            yield str(self.ckpt) if resume else None
        except (ValueError, RuntimeError) as e:
            if not str(e).startswith(("Lightning", "You ", "`")):  # Lightning's refusals read so
                raise
            raise UserError(f"Lightning stopped: {str(e).splitlines()[0]}") from None
        except SIGTERMException:
            lightning_ckpt.stopped(trainer, self.ckpt)
        finally:
            self.release()
        if trainer.is_global_zero:
            print(f"TensorBoard: tensorboard --logdir {Path(args.log_dir) / 'tensorboard'}")
