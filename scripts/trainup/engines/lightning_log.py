"""The course's run log and checkpoint for a Lightning run: one small Callback.

Lightning logs to TensorBoard through self.log; the course's lessons read logs/<run>.jsonl (one schema
for every script, logs/README.md) and checkpoints/<run>.pt. This callback writes both from the job's
true numbers: each rank's loss, accuracy and sample count summed over all ranks (as
trainup.distributed.reduce does for the plain DDP script), whatever self.log was told to do. Beside
them, a 'lightning_sync' record holds what self.log reported on rank 0, so a run with and a run without
sync_dist=True show the difference.
"""
import time

import torch
import torch.distributed as dist
from pytorch_lightning import Callback

from .. import checkpoint, devices, metrics, preempt


def _gathered(pl_module, meter):
    """One Meter per rank, in rank order: the sums all-gathered (on the GPU for NCCL, gloo takes CPU tensors)."""
    t = meter.as_tensor()
    if not dist.is_available() or not dist.is_initialized():
        return [meter]
    t = t.to(pl_module.device if dist.get_backend() == "nccl" else "cpu")
    parts = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t)
    return [metrics.Meter.from_tensor(p.cpu()) for p in parts]


class _Saved:
    """A state already gathered, where checkpoint.save asks for .state_dict()."""

    def __init__(self, state):
        self.state = state

    def state_dict(self):
        return self.state


def _whole(model, optimizer):
    """What rank 0 saves: the model and its optimizer; or, where fully_shard sharded them (FSDP2
    under ModelParallelStrategy: DTensors, a shard on each rank), their whole states,
    gathered from every rank's shards onto rank 0's CPU: every rank must call it."""
    from torch.distributed.fsdp import FSDPModule
    if not isinstance(model, FSDPModule):  # fully_shard made the model's class a subclass of it
        return model, optimizer
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    whole, state = get_state_dict(model, optimizer, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))
    return _Saved(whole), _Saved(state)


def _summed(meters):
    return metrics.Meter.from_tensor(torch.stack([m.as_tensor() for m in meters]).sum(0))


class CourseLog(Callback):
    """logs/<run>.jsonl (config, env, epoch, lightning_sync, summary) and checkpoints/<run>.pt, by rank 0."""

    def __init__(self, args, script, extra_records=()):
        self.args, self.script, self.extra_records = args, script, list(extra_records)
        self.ckpt = checkpoint.path_for(args)  # made and checked writable now, before any training

    def setup(self, trainer, pl_module, stage):
        strategy = trainer.strategy
        backend = getattr(strategy, "process_group_backend", None) or getattr(
            strategy, "_process_group_backend", None) or "none"
        # not self.log: Lightning sets every callback's `log` to the module's self.log
        self.run_log = metrics.RunLog(self.args, self.script, pl_module.device, trainer.world_size, backend,
                                      enabled=trainer.is_global_zero, tensorboard=False)  # Lightning's own
        for kind, fields in self.extra_records:
            self.run_log.write(kind, **fields)
        self.run_log.write("lightning", strategy=type(strategy).__name__, accelerator=type(trainer.accelerator).__name__,
                       precision=str(trainer.precision), world_size=trainer.world_size, num_nodes=trainer.num_nodes,
                       devices=trainer.num_devices,
                       sync_dist=bool(pl_module.sync_dist), launcher=type(strategy.cluster_environment).__name__
                       if getattr(strategy, "cluster_environment", None) else "none")

    def on_train_start(self, trainer, pl_module):
        """Also where a run stopped inside an epoch goes on (Lightning calls no
        on_train_epoch_start then): the epoch's sums and seconds before the stop, so that its log
        line covers all of it."""
        self.tick = self.tock = time.perf_counter()
        saved, self.resumed = getattr(self, "resumed", None), None
        if saved and saved["epoch"] == trainer.current_epoch + 1 and saved["trained"]:
            meters = saved["meters"]
            pl_module.train_meter = metrics.Meter.from_tensor(
                torch.tensor(meters[trainer.global_rank] if trainer.global_rank < len(meters) else
                             [0.0] * len(meters[0]), dtype=torch.float64))
            preempt.WALL_BEFORE[saved["epoch"]] = saved["wall_s"]

    def on_train_epoch_start(self, trainer, pl_module):
        pl_module.train_meter = metrics.Meter()
        self.tick = self.tock = time.perf_counter()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        """Every rank: where the epoch stands, for a run stopped inside it (on_train_start)."""
        loader = trainer.train_dataloader
        checkpoint["trainup"] = dict(
            epoch=trainer.current_epoch + 1, trained=getattr(loader, "trained", 0),
            meters=[m.as_tensor().tolist() for m in _gathered(pl_module, pl_module.train_meter)],
            wall_s=preempt.WALL_BEFORE.get(trainer.current_epoch + 1, 0.0) + self.tock - self.tick)

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        self.resumed = checkpoint.get("trainup")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.tock = time.perf_counter()  # the last batch's end: training only, the test set is not timed

    def on_validation_epoch_start(self, trainer, pl_module):
        devices.synchronize(pl_module.device)
        pl_module.test_meter = metrics.Meter()

    def on_train_epoch_end(self, trainer, pl_module):
        epoch = trainer.current_epoch + 1  # Lightning counts from 0, the course's logs from 1
        ranks = _gathered(pl_module, pl_module.train_meter)
        train, test = _summed(ranks), _summed(_gathered(pl_module, pl_module.test_meter))
        logged = trainer.callback_metrics.get("train_loss_epoch")
        self.run_log.write("lightning_sync", epoch=epoch, sync_dist=bool(pl_module.sync_dist),
                       logged_loss=float(logged) if logged is not None else None, job_loss=train.mean_loss,
                       rank_loss=[m.mean_loss for m in ranks], rank_samples=[m.samples for m in ranks],
                       sampler=type(getattr(trainer.train_dataloader, "sampler", None)).__name__)
        self.run_log.epoch(epoch, train, test, max(self.tock - self.tick, 1e-9))
        model, optimizer = _whole(pl_module.model, trainer.optimizers[0])  # on every rank
        if trainer.is_global_zero:  # one writer; the others would race for the same file
            scheduler = trainer.lr_scheduler_configs[0].scheduler if trainer.lr_scheduler_configs else None
            checkpoint.save(self.ckpt, model, optimizer, scheduler, epoch, self.args)

    def on_fit_end(self, trainer, pl_module):
        self.run_log.summary(checkpoint=self.ckpt)

    def on_exception(self, trainer, pl_module, exception):
        if getattr(self, "run_log", None) is not None and self.run_log.enabled and not self.run_log._file.closed:
            stopped = type(exception).__name__ == "SIGTERMException"  # Lightning's stop: resumable, not failed
            self.run_log.summary(checkpoint=None, status="stopped" if stopped else "failed")
