"""Lesson 07, PyTorch Lightning: the DDP lesson's training, with Lightning doing the distributed parts.

    python scripts/_trainup_lightning.py --quick                                  # one process
    python scripts/_trainup_lightning.py --quick --accelerator cpu --devices 2 --strategy ddp  # Lightning starts 2
    torchrun --standalone --nproc-per-node 2 scripts/_trainup_lightning.py --quick   # Lightning reads torchrun's env
    srun python scripts/_trainup_lightning.py      # one SLURM task per process; nodes from SLURM (slurm/lightning/)
    python scripts/_trainup_lightning.py --quick --monitor            # + DeviceStatsMonitor (and nvitop on GPUs)

Compared with _trainup_fabric.py: the loop is the Trainer's too (the epochs, backward, the
optimizer's and scheduler's steps, the test set, the rank-0 guards, the checkpoint). What remains is
the model's step (a LightningModule), the data (a LightningDataModule) and self.log(...,
sync_dist=True) where fabric.all_reduce summed the metrics. The course's log and checkpoint come
from one callback (trainup/engines/lightning_log.py); TensorBoard's from Lightning's logger, in
logs/tensorboard/<run>. The flags and the rest of the plumbing: trainup/engines/lightning_*.py.
"""
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torchmetrics.classification import MulticlassAccuracy

from trainup import cli, data, metrics, models
from trainup.engines import lightning_ckpt, lightning_compat, lightning_flags, lightning_run


class LitNet(pl.LightningModule):
    """The course's model and its training step: everything else (devices, DDP, precision) is the Trainer's."""

    def __init__(self, args, train_set):
        super().__init__()
        self.args, self.sync_dist = args, not args.no_sync_dist
        self.model = models.build(args, train_set)
        # a Metric keeps counts (correct, seen) and sums them over the ranks itself at the epoch's end
        self.test_accuracy = MulticlassAccuracy(train_set.num_classes, average="micro")
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
        self.test_accuracy(logits, y)
        self.log("test_accuracy", self.test_accuracy)  # the job's, with sync_dist or without
        self.test_meter.add(loss, logits, y)

    def configure_optimizers(self):  # the course's Adadelta, its rate decayed once an epoch
        optimizer, scheduler = optimizer_for(self, self.args)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}


class Digits(pl.LightningDataModule):
    """The course's data sets, in DataLoaders (the training one resumable inside an epoch): under
    a distributed strategy Lightning swaps in a DistributedSampler (and calls its set_epoch every
    epoch)."""

    def __init__(self, train_set, test_set, batch_size):
        super().__init__()
        self.train_set, self.test_set, self.batch_size = train_set, test_set, batch_size

    def train_dataloader(self):
        # --batch-size is the global batch of a step, as in lesson 04, cut into the accumulated ones
        per_process = self.batch_size // self.trainer.world_size // self.trainer.accumulate_grad_batches
        # a DataLoader that a run stopped inside an epoch goes on from, after its last step
        return lightning_ckpt.Loader(self.train_set, batch_size=per_process, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.test_set, batch_size=1000)


def optimizer_for(model, args):
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)


def parse_args(argv=None):
    p = cli.parser(__doc__, lesson="lightning", precisions=None)
    lightning_flags.add(p)  # the Trainer's: --accelerator, --devices, --num-nodes, --strategy, ...
    args = cli.parse(p, argv)
    return args


@cli.main_guard
def main(argv=None):
    args = parse_args(argv)
    args = lightning_flags.check(args)  # Lightning 1.x's flags and strategies: one sentence each
    if args.threads:
        torch.set_num_threads(args.threads)
    # Lightning counts epochs from 0 and its DistributedSampler shuffles with seed + epoch; the course counts
    # from 1 with the same formula. Seeding Lightning with seed + 1 gives both the same order every epoch.
    pl.seed_everything(args.seed + 1, verbose=False)
    train_set, test_set = data.load(args)
    model = LitNet(args, train_set)
    run = lightning_run.Run(args, __file__)  # the course's log and checkpoint; TensorBoard
    with run.refusals():  # a flag Lightning refuses: one sentence
        trainer = pl.Trainer(
            accelerator=run.accelerator, devices=run.devices, num_nodes=run.nodes,
            strategy=args.strategy, precision=lightning_compat.precision(args.precision),
            max_epochs=args.epochs, logger=run.tensorboard, callbacks=run.callbacks,
            accumulate_grad_batches=args.accumulate_grad_batches,
            gradient_clip_val=args.gradient_clip_val, sync_batchnorm=args.sync_batchnorm,
            enable_progress_bar=not args.no_progress, log_every_n_steps=1,
            enable_model_summary=False, num_sanity_val_steps=0, deterministic=False)
    with run.fitting(trainer) as ckpt:  # --resume: Lightning's checkpoint; a SIGTERM saves one
        trainer.fit(model, datamodule=Digits(train_set, test_set, args.batch_size), ckpt_path=ckpt)


if __name__ == "__main__":
    main()
