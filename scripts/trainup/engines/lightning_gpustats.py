"""GPU utilisation and memory into the run's TensorBoard, beside the loss: a Lightning callback reading nvitop.

nvitop once shipped such a callback (nvitop.callbacks.lightning.GpuStatsLogger); nvitop 1.7 has none, so
where it is missing this one does the same with nvitop's Device API (trainup.gpumon reads the GPUs the same
way for the plain scripts). Rank 0 reads its own GPU every `every` training steps. monitors() picks
the callbacks --monitor adds.
"""
import importlib.util

from pytorch_lightning import Callback

from .. import gpumon


def nvitop_callback():
    """nvitop's own Lightning callback class where this nvitop has one, else None."""
    try:
        from nvitop.callbacks.lightning import GpuStatsLogger
    except ImportError:
        return None
    return GpuStatsLogger


def monitors(args, accelerator):
    """--monitor: ([callbacks], what was skipped or None): Lightning's DeviceStatsMonitor, and
    nvitop's GPU readings where a GPU and nvitop exist (nvitop's own Lightning callback if this
    nvitop has one, else the course's NvitopGpuStats)."""
    if not args.monitor:
        return [], None
    from pytorch_lightning.callbacks import DeviceStatsMonitor
    callbacks = [DeviceStatsMonitor()]
    if accelerator != "cuda":
        return callbacks, ("--monitor on the CPU: DeviceStatsMonitor logs CPU statistics; "
                           "nvitop's GPU readings skipped (no GPU)")
    if importlib.util.find_spec("nvitop") is None:
        return callbacks, ("--monitor: nvitop is not installed (pip install nvitop), so "
                           "DeviceStatsMonitor alone logs the GPU")
    nvitop_logger = nvitop_callback()
    return callbacks + [nvitop_logger() if nvitop_logger else NvitopGpuStats()], None


class NvitopGpuStats(Callback):
    """Logs gpu<i>/utilization_pct and gpu<i>/memory_used_mb through the Trainer's logger (TensorBoard)."""

    def __init__(self, every=1, source=None):
        self.every, self.source = every, source  # source: trainup.gpumon.nvitop_source([...]); set in setup

    def setup(self, trainer, pl_module, stage):
        device = pl_module.device  # this process's GPU, known only once the Trainer placed the model
        if self.source is None and device.type == "cuda":
            self.source = gpumon.nvitop_source([device.index or 0])  # None where NVML cannot read it

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.source is None or not trainer.is_global_zero or trainer.logger is None or trainer.global_step % self.every:
            return
        metrics = {}
        for r in self.source():
            for key in ("utilization_pct", "memory_used_mb"):
                if r[key] is not None:  # a GPU that does not report a value: left out, not logged as 0
                    metrics[f"gpu{r['gpu']}/{key}"] = r[key]
        if metrics:
            trainer.logger.log_metrics(metrics, step=trainer.global_step)
