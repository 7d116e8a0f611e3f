"""Lesson 07, PyTorch Lightning with FSDP2: the same Trainer, the model sharded over the processes.

    torchrun --standalone --nproc-per-node 2 scripts/_trainup_lightning_fsdp.py --quick
    python scripts/_trainup_lightning_fsdp.py --quick --accelerator cpu --devices 2  # Lightning's 2

Compared with _trainup_lightning.py: ModelParallelStrategy instead of DDP, and the
LightningModule's configure_model(), where fully_shard (lesson 09's ZeRO-3) splits the model's
parameters, gradients and optimizer state over the ranks of the strategy's mesh: each layer first,
then the root, so that a rank gathers one layer's parameters at a time (the root alone would be one
unit, gathered whole for all of forward and backward). Lightning's
FSDPStrategy wraps the older FullyShardedDataParallel and refuses a CPU; this one runs wherever
gloo or NCCL does. Lightning's own checkpoint is a folder of shards, a file a rank; the course's
is gathered whole onto rank 0.
"""
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.strategies import ModelParallelStrategy
from torch.distributed.fsdp import fully_shard
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

    def configure_model(self):  # the strategy calls it on every rank once its mesh is made
        for part in [m for m in self.model.children() if list(m.parameters())] + [self.model]:
            fully_shard(part, mesh=self.device_mesh["data_parallel"])  # each layer, then the root

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


def precision(args):
    # ModelParallelStrategy refuses "64-true"; under --precision 64 the model and the data are
    # float64 already (cli.parse), and "32-true" leaves every dtype as it is
    return "32-true" if args.precision == "64" else lightning_compat.precision(args.precision)


def parse_args(argv=None):
    p = cli.parser(__doc__, lesson="lightning_fsdp", precisions=None)
    lightning_flags.add(p)  # the Trainer's: --accelerator, --devices, --num-nodes, --strategy, ...
    args = cli.parse(p, argv)
    if args.strategy != "auto":
        p.error(f"--strategy {args.strategy}: this script's strategy is ModelParallelStrategy "
                f"(FSDP2); _trainup_lightning.py takes the others")
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
        # the mesh: every process on its data-parallel side (its "auto" would make a node's
        # processes one tensor-parallel group, fed the same batches)
        strategy = ModelParallelStrategy(data_parallel_size=run.processes, tensor_parallel_size=1)
        trainer = pl.Trainer(
            accelerator=run.accelerator, devices=run.devices, num_nodes=run.nodes,
            strategy=strategy, precision=precision(args),
            max_epochs=args.epochs, logger=run.tensorboard, callbacks=run.callbacks,
            accumulate_grad_batches=args.accumulate_grad_batches,
            gradient_clip_val=args.gradient_clip_val, sync_batchnorm=args.sync_batchnorm,
            enable_progress_bar=not args.no_progress, log_every_n_steps=1,
            enable_model_summary=False, num_sanity_val_steps=0, deterministic=False)
    with run.fitting(trainer) as ckpt:  # --resume: Lightning's checkpoint; a SIGTERM saves one
        trainer.fit(model, datamodule=Digits(train_set, test_set, args.batch_size), ckpt_path=ckpt)


if __name__ == "__main__":
    main()
