"""Lesson 07, PyTorch Lightning: the DDP lesson's training, with Lightning doing the distributed parts.

    python scripts/_trainup_lightning.py --quick                                  # one process
    python scripts/_trainup_lightning.py --quick --accelerator cpu --devices 2 --strategy ddp  # Lightning starts 2
    torchrun --standalone --nproc-per-node 2 scripts/_trainup_lightning.py --quick   # Lightning reads torchrun's env
    srun python scripts/_trainup_lightning.py      # one SLURM task per process; nodes from SLURM (slurm/lightning/)
    python scripts/_trainup_lightning.py --quick --monitor            # + DeviceStatsMonitor (and nvitop on GPUs)

Compared with _trainup_ddp.py: no process group, DistributedSampler, set_epoch, DDP wrapper, all-reduce
of the metrics, rank-0 guards or autocast in this file: Lightning's Trainer does them from --strategy,
--devices, --num-nodes and --precision. What remains is the model's step (a LightningModule), the data
(a LightningDataModule) and self.log(..., sync_dist=True). The course's log and checkpoint come from one
callback (trainup/lightning_log.py); TensorBoard's from Lightning's TensorBoardLogger, in
logs/tensorboard/<run>.
"""
import importlib.util
import logging
import shutil
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_fabric.utilities.exceptions import MisconfigurationException
from pytorch_lightning.loggers import TensorBoardLogger
from pytorch_lightning.strategies import StrategyRegistry
from pytorch_lightning.utilities.exceptions import SIGTERMException
from pytorch_lightning.utilities.rank_zero import rank_zero_only
from torch.utils.data import DataLoader

from trainup import (UserError, cli, data, distributed, lightning_ckpt, lightning_compat, lightning_gpustats,
                     metrics, models, runlock)

# Lightning's banners ("GPU available: ...", "Initializing distributed ...", "`Trainer.fit` stopped") are INFO
# messages of these loggers: the course's own lines say what ran, so only warnings and errors pass.
for _name in ("pytorch_lightning", "lightning_fabric", "lightning.pytorch", "lightning.fabric"):
    logging.getLogger(_name).setLevel(logging.WARNING)
QUIET = (  # (message start, why it does not apply here)
    ("The `srun` command is available", "SLURM is installed here for lesson 04b; a run outside a job is deliberate"),
    (".*does not have many workers", "the data sets are tensors in memory: worker processes would only add start-up"),
    ("Checkpoint directory .* exists and is not empty", "the course's checkpoint folder holds other runs' files"),
    (".*`batch_size` .* ambiguous", "each batch is one (images, labels) pair; batch_size is passed anyway"),
    ("The number of training batches .* is smaller than the logging interval", "quick runs have few steps"),
    (".*isinstance\\(treespec, LeafSpec\\)` is deprecated", "inside Lightning 2.6.6 with torch 2.13, not this code"),
)
for _message, _why in QUIET:
    warnings.filterwarnings("ignore", message=_message)


class LitNet(pl.LightningModule):
    """The course's model and its training step: everything else (devices, DDP, precision) is the Trainer's."""

    def __init__(self, args, shape, num_classes):
        super().__init__()
        self.args, self.sync_dist = args, not args.no_sync_dist
        self.model = models.build(args, SimpleNamespace(shape=shape, num_classes=num_classes))
        self.train_meter, self.test_meter = metrics.Meter(), metrics.Meter()  # the course's sums (CourseLog)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.model(x)
        loss = F.cross_entropy(logits, y)
        # sync_dist=True: the epoch value is averaged over the ranks; without it rank 0 logs its own shard's
        self.log("train_loss", loss, on_step=True, on_epoch=True, sync_dist=self.sync_dist, batch_size=len(y))
        self.log("train_accuracy", (logits.argmax(1) == y).float().mean(), on_epoch=True,
                 sync_dist=self.sync_dist, batch_size=len(y))
        self.train_meter.add(loss.detach(), logits.detach(), y)
        return loss

    def validation_step(self, batch, batch_idx):  # the course's test set, after every epoch
        x, y = batch
        logits = self.model(x)
        loss = F.cross_entropy(logits.float(), y)
        self.log("test_loss", loss, sync_dist=self.sync_dist, batch_size=len(y))
        self.log("test_accuracy", (logits.argmax(1) == y).float().mean(), sync_dist=self.sync_dist,
                 batch_size=len(y))
        self.test_meter.add(loss, logits, y)

    def configure_optimizers(self):  # the course's Adadelta, its rate decayed once an epoch
        optimizer = torch.optim.Adadelta(self.parameters(), lr=self.args.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=self.args.gamma)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}


class Digits(pl.LightningDataModule):
    """The course's data sets. The loaders are plain: under a distributed strategy Lightning swaps in a
    DistributedSampler (and calls its set_epoch every epoch)."""

    def __init__(self, train_set, test_set, batch_size):
        super().__init__()
        self.train_set, self.test_set, self.batch_size = train_set, test_set, batch_size

    def train_dataloader(self):
        per_process = self.batch_size // self.trainer.world_size  # --batch-size is the global batch, as in lesson 04
        return DataLoader(self.train_set, batch_size=per_process, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.test_set, batch_size=1000)


def parse_args(argv=None):
    p = cli.parser(__doc__, lesson="lightning", precisions=None)
    t = p.add_argument_group("Lightning's Trainer")
    t.add_argument("--accelerator", default="auto", help="cpu, gpu (cuda), auto, ...")
    t.add_argument("--devices", default=None, help="processes per node (default: torchrun's or SLURM's, else 1)")
    t.add_argument("--num-nodes", type=cli.positive(int), default=None, help="default: torchrun's or SLURM's, else 1")
    t.add_argument("--strategy", default="auto", help="auto, ddp, ddp_spawn, fsdp, deepspeed, ... (this Lightning's)")
    t.add_argument("--max-epochs", type=cli.positive(int), default=None, help="Lightning's name for --epochs")
    t.add_argument("--precision", default="32", help="32, 64 (64-true: float64, for the proofs), 16 (16-mixed), bf16 (bf16-mixed), or Lightning's names")
    t.add_argument("--no-sync-dist", action="store_true", help="self.log without sync_dist: rank 0 logs its shard")
    t.add_argument("--monitor", action="store_true", help="DeviceStatsMonitor (and the course's GPU statistics callback, nvitop's readings, on GPUs)")
    old = p.add_argument_group("Lightning 1.x flags, answered with what Lightning 2 wants")
    old.add_argument("--gpus", default=None, help="removed in Lightning 2")
    old.add_argument("--num-processes", default=None, help="removed in Lightning 2")
    old.add_argument("--tpu-cores", default=None, help="removed in Lightning 2")
    args = cli.parse(p, argv)
    if args.max_epochs is not None:
        args.epochs = args.max_epochs
    return args


def trainer_flags(args):
    """devices and num_nodes: the flags, else what torchrun or SLURM set (Lightning checks they agree)."""
    ctx = distributed.from_env()
    devices = args.devices or (str(ctx.local_world_size) if ctx.launcher in ("torchrun", "slurm") else "1")
    nodes = args.num_nodes or (ctx.nnodes if ctx.launcher in ("torchrun", "slurm") else 1)
    return (int(devices) if devices.lstrip("-").isdigit() else devices), nodes


def monitors(args, accelerator):
    """--monitor: Lightning's DeviceStatsMonitor, and nvitop's GPU readings where a GPU and nvitop exist
    (nvitop's own Lightning callback if this nvitop has one, else the course's: trainup/lightning_gpustats.py)."""
    if not args.monitor:
        return [], None
    from pytorch_lightning.callbacks import DeviceStatsMonitor
    callbacks = [DeviceStatsMonitor()]
    if accelerator != "cuda":
        return callbacks, "--monitor on the CPU: DeviceStatsMonitor logs CPU statistics; nvitop's GPU readings skipped (no GPU)"
    if importlib.util.find_spec("nvitop") is None:
        return callbacks, "--monitor: nvitop is not installed (pip install nvitop), so DeviceStatsMonitor alone logs the GPU"
    nvitop_logger = lightning_gpustats.nvitop_callback()
    return callbacks + [nvitop_logger() if nvitop_logger else lightning_gpustats.NvitopGpuStats()], None


def build_trainer(args, callbacks):
    from pytorch_lightning.callbacks import ModelCheckpoint
    devices, nodes = trainer_flags(args)
    tensorboard = TensorBoardLogger(save_dir=str(Path(args.log_dir) / "tensorboard"), name=args.run_name,
                                    version="", default_hp_metric=False)
    own_ckpt = ModelCheckpoint(dirpath=args.checkpoint_dir, filename=f"{args.run_name}-lightning",
                                     enable_version_counter=False)  # Lightning's own, rank 0 writes it
    try:
        trainer = pl.Trainer(accelerator=args.accelerator, devices=devices, num_nodes=nodes, strategy=args.strategy,
                             precision=lightning_compat.precision(args.precision), max_epochs=args.epochs,
                             logger=tensorboard, callbacks=[*callbacks, own_ckpt], log_every_n_steps=1,
                             enable_model_summary=False, enable_progress_bar=not args.no_progress,
                             num_sanity_val_steps=0, deterministic=False)
    except (MisconfigurationException, ImportError, ValueError, RuntimeError, TypeError) as e:
        raise UserError(f"Lightning refuses these flags: {str(e).splitlines()[0]}") from None
    return trainer


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    lightning_compat.check_removed(args)
    lightning_compat.check_strategy(args.strategy, StrategyRegistry.available_strategies())
    if args.threads:
        torch.set_num_threads(args.threads)
    # Lightning counts epochs from 0 and its DistributedSampler shuffles with seed + epoch; the course counts
    # from 1 with the same formula. Seeding Lightning with seed + 1 gives both the same order every epoch.
    pl.seed_everything(args.seed + 1, verbose=False)
    train_set, test_set = data.load(args)
    module = LitNet(args, train_set.shape, train_set.num_classes)
    if rank_zero_only.rank == 0 and not args.resume:  # a fresh run starts a fresh TensorBoard folder...
        Path(args.log_dir).mkdir(parents=True, exist_ok=True)  # ...once it holds the run's lock (RunLog's own):
        runlock.Lock(Path(args.log_dir) / f"{args.run_name}.lock", f"run {args.run_name!r}")  # a live run's stays
        shutil.rmtree(Path(args.log_dir) / "tensorboard" / args.run_name, ignore_errors=True)
    from trainup.lightning_log import CourseLog
    accelerator = "cuda" if args.accelerator in ("gpu", "cuda") or (
        args.accelerator == "auto" and torch.cuda.is_available()) else args.accelerator
    if accelerator == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--accelerator {args.accelerator} needs an NVIDIA GPU, and torch sees none on this machine; "
                        f"use --accelerator cpu (or auto)")
    watchers, skipped = monitors(args, accelerator)
    records = [("monitor", dict(callbacks=[type(c).__name__ for c in watchers], skipped=skipped))] if args.monitor else []
    course_log = CourseLog(args, __file__, records)
    trainer = build_trainer(args, [course_log, *watchers])
    if args.batch_size % trainer.world_size:  # checked before Lightning starts the other processes
        raise UserError(f"--batch-size {args.batch_size} is the global batch and cannot be split evenly over "
                        f"{trainer.world_size} processes; use a multiple of {trainer.world_size}")
    if skipped and trainer.is_global_zero:
        print(skipped)
    ckpt = Path(args.checkpoint_dir) / f"{args.run_name}-lightning.ckpt"
    if args.resume and ckpt.exists():
        lightning_ckpt.readable(ckpt)
    try:
        trainer.fit(module, datamodule=Digits(train_set, test_set, args.batch_size),
                    ckpt_path=str(ckpt) if args.resume and ckpt.exists() else None)
    except (ValueError, RuntimeError) as e:
        if not str(e).startswith(("Lightning", "You ", "`")):  # Lightning's own refusals read like this
            raise
        raise UserError(f"Lightning stopped: {str(e).splitlines()[0]}") from None
    except SIGTERMException:  # Lightning stops every rank after the step; alone it would exit 0, unsaved
        lightning_ckpt.stopped(trainer, ckpt)
    if trainer.is_global_zero:
        print(f"TensorBoard: tensorboard --logdir {Path(args.log_dir) / 'tensorboard'}")


if __name__ == "__main__":
    main()
