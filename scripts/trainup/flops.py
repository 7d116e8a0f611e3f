"""What a training step computes, counted by PyTorch, and how much of the device that is (MFU).

    log.flops(model, train_set)           # RunLog: counted once, then FLOP/s (and MFU) each epoch
    flops.per_sample(model, (1, 28, 28))  # a sample's forward + backward, counted on a meta copy
    flops.mfu(flops_per_s, "NVIDIA A100-SXM4-80GB", "bf16", devices=8)  # None: peak not known

The count is torch.utils.flop_counter.FlopCounterMode's (2 FLOPs a multiply-add, matrix products
and convolutions; backward as it runs: the first layer computes no gradient for its input). It runs
on a copy of the model on the meta device: no memory, no time, and the model itself is untouched.
"""

import copy

import torch

# Dense peak TFLOP/s by GPU and precision, from NVIDIA's datasheets: A100 (SXM4, 2021), H100 and
# H200
# (SXM5, dense), V100 (SXM2), T4, L4. "32" is plain float32 (no TF32 tensor cores). A GPU not
# listed, and
# every CPU, gets FLOP/s without MFU.
PEAK_TFLOPS = {
    "H200": {"32": 67.0, "16": 989.0, "bf16": 989.0},
    "H100": {"32": 67.0, "16": 989.0, "bf16": 989.0},
    "A100": {"32": 19.5, "16": 312.0, "bf16": 312.0},
    "V100": {"32": 15.7, "16": 125.0},
    "L4": {"32": 30.3, "16": 121.0, "bf16": 121.0},
    "T4": {"32": 8.1, "16": 65.0},
}


def per_sample(model, sample_shape):
    """FLOPs of one sample's forward and backward pass through this model (its architecture, not
    its weights: counted on a meta-device copy, so nothing runs and nothing of the model
    changes)."""
    from torch.utils.flop_counter import FlopCounterMode

    # eval mode: a SyncBatchNorm copy must not gather
    # the copy's tensors are made on the meta device from the start: a deepcopy of a GPU model
    # would first hold a second copy of its weights on the GPU
    memo = {id(t): torch.empty_like(t, device="meta") for t in model.buffers()}
    memo.update({id(p): torch.nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad)
                 for p in model.parameters()})
    meta = copy.deepcopy(model, memo).train(False)
    # 2: BatchNorm in training refuses a batch of 1
    x = torch.empty(2, *sample_shape, device="meta")
    with FlopCounterMode(display=False) as counter:
        meta(x).float().sum().backward()
    return counter.get_total_flops() // 2


def peak_tflops(device_name, precision):
    """The datasheet peak for a GPU by its name (torch.cuda.get_device_name), or None."""
    for gpu, peaks in PEAK_TFLOPS.items():
        if gpu in str(device_name).upper().split() or f" {gpu}-" in f" {str(device_name).upper()}":
            return peaks.get(str(precision))
    return None


def mfu(flops_per_s, device_name, precision, devices=1):
    """Model FLOPs utilisation: achieved FLOP/s over the peak of all devices; None where it is
    unknown."""
    peak = peak_tflops(device_name, precision)
    return None if peak is None else flops_per_s / (peak * 1e12 * devices)
