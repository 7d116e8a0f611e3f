"""nn.DataParallel: which GPUs a run uses, and what each phase of one of its steps costs.

One process drives every GPU. Each training step, DataParallel
  1. scatters: cuts the batch into one piece per GPU and copies each piece over;
  2. replicates: copies the model from the first GPU to every other GPU (every step, again);
  3. applies: runs the pieces forward, one Python thread per GPU (the threads share one GIL);
  4. gathers: collects the outputs on the first GPU, where the loss is computed;
then backward sums every replica's gradients back into the model on the first GPU.
DistributedDataParallel runs one process per GPU instead: no replica copies, no shared GIL.
"""
import time

import torch
import torch.nn.functional as F
from torch import nn

from .. import devices


def visible_gpus():
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def choose(gpus=None):
    """(device, device_ids, sentence) for --gpus N; None means every visible GPU, or the CPU if there is none."""
    count = visible_gpus()
    if gpus is None and count == 0:
        return torch.device("cpu"), [], ("No GPU here, so this run trains on the CPU: nn.DataParallel "
                                         "without GPUs simply calls the model.")
    ids = devices.require_gpus(count if gpus is None else gpus)
    device = devices.pick("cuda", ids[0])  # the model and every batch start on the first GPU
    return device, ids, f"nn.DataParallel over {len(ids)} GPU(s) {ids}: every batch is split {len(ids)} ways."


class Autocast(nn.Module):
    """Runs the model under mixed precision from inside its forward. Autocast's state is per
    thread, and DataParallel runs each replica in a thread of its own: parallel_apply enters
    autocast again there with the on/off switch only, so the dtype falls back to the default
    (fp16 on CUDA) and bf16 would silently become fp16."""

    def __init__(self, net, precision):
        super().__init__()
        self.net, self.precision = net, precision

    def forward(self, x):
        with devices.autocast(x.device, self.precision):
            return self.net(x)


def time_phases(module, x, y, ids, steps=10):
    """Seconds per step of each phase of a DataParallel training step, done by hand as DataParallel does it.

    module, x and y are on the first GPU; ids are the GPUs (2 or more: with one, DataParallel skips it all).
    """
    from torch.nn.parallel import gather, parallel_apply, replicate, scatter_kwargs

    def clock():
        for i in ids:  # wait for every GPU, so that each phase is timed whole
            torch.cuda.synchronize(i)
        return time.perf_counter()

    names = ("scatter_s", "replicate_s", "forward_s", "gather_s", "backward_s")
    totals = dict.fromkeys(names, 0.0)
    for step in range(steps + 1):  # step 0 warms up
        marks = [clock()]
        inputs, kwargs = scatter_kwargs((x,), {}, ids)
        marks.append(clock())
        replicas = replicate(module, ids[:len(inputs)])
        marks.append(clock())
        outputs = parallel_apply(replicas, inputs, kwargs, ids[:len(inputs)])
        marks.append(clock())
        logits = gather(outputs, ids[0])
        marks.append(clock())
        F.cross_entropy(logits, y).backward()  # the replicas' gradients are summed into module's
        marks.append(clock())
        module.zero_grad(set_to_none=True)
        if step:
            for name, start, end in zip(names, marks, marks[1:]):
                totals[name] += end - start
    return {name: total / steps for name, total in totals.items()}
