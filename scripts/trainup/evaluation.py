"""The test-set pass every script makes after each epoch: loss and accuracy summed in a Meter
(the caller all-reduces it across ranks). One copy for every script: only the model changes."""
import torch
import torch.nn.functional as F

from . import devices
from .meter import Meter, whole


@torch.no_grad()
def evaluate(model, loader, device="cpu", precision="32"):
    model.eval()
    meter = Meter()
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with devices.autocast(device, precision):
            logits = whole(model(x))  # tensor parallelism's scores, cut by class: gathered
        # the loss in fp32 from half-precision logits, as autocast computes it; float64 kept
        full = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
        meter.add(F.cross_entropy(full, y), logits, y)
    return meter
