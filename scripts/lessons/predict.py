"""Lesson 11: the performance model (lessons/perfmodel.py) fitted on published runs, its
predictions checked against the runs it was not fitted on, and the failures a run of many GPUs
must expect.

Every published number here carries its source; every prediction is computed, and so is its error.
"""

import math

import pandas as pd

from . import perfmodel as pm
from .hardware import NODES

IMAGENET_TRAIN = 1_281_167  # ILSVRC-2012's training images
JSC_EPOCHS = 10  # the supercomputer course's scripts: pl.Trainer(max_epochs=10)
JSC_GOAL = 0.20  # each held-out time within 20 %
HOROVOD_GOAL = 10  # each efficiency within 10 points

# Horovod's docs (benchmarks): 512 GPUs, tf_cnn_benchmarks, batch 64 a GPU, scaling efficiency.
HOROVOD_512 = {"inception_v3": 0.90, "resnet101": 0.90, "vgg16": 0.68}
HOROVOD_BATCH = 64
HOROVOD_FUSION_BYTES = 64 * 2**20  # Horovod's tensor fusion buffer (HOROVOD_FUSION_THRESHOLD)
# One P100 (DGX-1), tf_cnn_benchmarks, batch 64, synthetic data, images/s: TensorFlow's performance
# guide ("Benchmarks", May 2017). ResNet-101 is not in it: interpolate() places it by FLOPs.
P100_IMAGES_PER_S = {"inception_v3": 142.0, "resnet50": 219.0, "resnet152": 91.8, "vgg16": 154.0}
# Meta's Llama 3 report (arXiv 2407.21783): 419 unexpected interruptions, 54 days, 16,384 H100s.
LLAMA3 = dict(interruptions=419, days=54, gpus=16_384)


def model_facts(name):
    """Parameters and FLOPs of one image's forward and backward (lesson 08's FlopCounterMode
    count), of torchvision's build of a published architecture: counted on the meta device."""
    import torch
    import torchvision
    from trainup import flops

    kwargs = dict(aux_logits=False, init_weights=False) if name == "inception_v3" else {}
    with torch.device("meta"):
        model = getattr(torchvision.models, name)(**kwargs)
    side = 299 if name == "inception_v3" else 224
    return dict(
        params=sum(p.numel() for p in model.parameters()),
        flops=flops.per_sample(model, (3, side, side)),
    )


def interpolate(flops_of, rate_a, rate_b, flops_a, flops_b):
    """Images/s of a model between two measured ones of the same family, time per image taken as
    linear in FLOPs."""
    t_a, t_b = 1 / rate_a, 1 / rate_b
    return 1 / (t_a + (t_b - t_a) * (flops_of - flops_a) / (flops_b - flops_a))


# The supercomputer course's ResNet-50 runs (JSC)


def jsc_steps(gpus, batch):
    return JSC_EPOCHS * math.ceil(IMAGENET_TRAIN / (gpus * batch))


def jsc_comm(gpus, grad_bytes, node=NODES["juwels_booster"]):
    """One step's gradient all-reduce on JUWELS Booster: NVLink inside a node, a hierarchical
    all-reduce over InfiniBand across nodes."""
    g = min(gpus, node.gpus)
    nodes = gpus // g
    if nodes == 1:
        return pm.ring_all_reduce(grad_bytes, g, *node.intra_link())
    return pm.hierarchical_all_reduce(grad_bytes, nodes, g, node.intra_link(), node.inter_link())


def jsc_fit(runs, grad_bytes, buckets, on=(1, 4)):
    """Fit the model on some of the published runs (by GPU count). Unknowns: the time a sample
    takes, and a cost per step that several ranks add beyond the all-reduce the hardware predicts
    (waiting for the slowest rank, DDP's hooks: whatever a multi-GPU run shows); with a third run,
    also a fixed cost per job (start-up, data loaders, validation). Returns a dict of them."""
    import numpy as np

    first = runs[runs["gpus"] == 1].iloc[0]
    guess = (
        first["minutes"] * 60 / (JSC_EPOCHS * IMAGENET_TRAIN)
    )  # for overlap only: comm is small
    rows, times = [], []
    for _, r in runs[runs["gpus"].isin(on)].iterrows():
        steps, several = jsc_steps(r["gpus"], r["per_gpu_batch"]), r["gpus"] > 1
        comm = (
            pm.exposed(
                jsc_comm(r["gpus"], grad_bytes), 2 / 3 * guess * r["per_gpu_batch"], buckets
            )
            if several
            else 0.0
        )
        rows.append([steps * r["per_gpu_batch"], steps * several] + ([1.0] if len(on) > 2 else []))
        times.append(r["minutes"] * 60 - steps * comm)
    x = np.linalg.solve(np.array(rows, float), np.array(times, float))
    return dict(per_sample_s=x[0], sync_s=x[1], fixed_s=x[2] if len(on) > 2 else 0.0)


def jsc_predictions(runs, grad_bytes, buckets, on=(1, 4)):
    """Every published run against the model fitted on some of them (on: GPU counts)."""
    fit = jsc_fit(runs, grad_bytes, buckets, on)
    rows = []
    for _, r in runs.iterrows():
        batch, gpus = r["per_gpu_batch"], r["gpus"]
        compute = fit["per_sample_s"] * batch
        comm = jsc_comm(gpus, grad_bytes) if gpus > 1 else 0.0
        step = pm.step_time(compute, comm, buckets=buckets) + (fit["sync_s"] if gpus > 1 else 0.0)
        predicted = (step * jsc_steps(gpus, batch) + fit["fixed_s"]) / 60
        rows.append(
            dict(
                gpus=gpus,
                nodes=r["nodes"],
                per_gpu_batch=batch,
                published_min=r["minutes"],
                predicted_min=predicted,
                error=predicted / r["minutes"] - 1,
                fitted=gpus in on,
                comm_ms=comm * 1e3,
                steps=jsc_steps(gpus, batch),
            )
        )
    return pd.DataFrame(rows)


def implied_fixed_minutes(table):
    """What the misses imply: the published minus the predicted time of each held-out run, a cost
    the two single-node runs cannot separate from the per-step costs (start-up, data loaders
    started each epoch, validation)."""
    held = table[~table["fitted"]]
    return (held["published_min"] - held["predicted_min"]).tolist()


# Horovod's 512-GPU benchmark


def horovod_predictions(facts, gpus=512, node=NODES["horovod_2017"]):
    """Each model's scaling efficiency at 512 GPUs from published hardware alone: compute from one
    P100's images/s, a ring all-reduce across the servers' network per fused buffer, overlapped
    with backward bucket by bucket."""
    rate = dict(P100_IMAGES_PER_S)
    rate["resnet101"] = interpolate(
        facts["resnet101"]["flops"],
        rate["resnet50"],
        rate["resnet152"],
        facts["resnet50"]["flops"],
        facts["resnet152"]["flops"],
    )
    alpha_in, _ = node.intra_link()
    alpha_net, beta_net = node.inter_link()
    nodes = gpus // node.gpus
    rows = []
    for name, published in HOROVOD_512.items():
        grad = facts[name]["params"] * 4  # float32 gradients
        buffers = math.ceil(grad / HOROVOD_FUSION_BYTES)
        # one flat ring over every GPU: each step a latency (network hops between servers, PCIe
        # inside), and every byte through each server's network link (nodes > 1)
        hops = 2 * (gpus - 1)
        net_hops = 2 * (nodes - 1)
        latency = (hops - net_hops) * alpha_in + net_hops * alpha_net
        comm = buffers * latency + pm.RING["all_reduce"](gpus) * grad / beta_net
        compute = HOROVOD_BATCH / rate[name]
        eff = pm.efficiency(compute, pm.step_time(compute, comm, buckets=buffers))
        rows.append(
            dict(
                model=name,
                params_m=facts[name]["params"] / 1e6,
                images_per_s=rate[name],
                compute_ms=compute * 1e3,
                comm_ms=comm * 1e3,
                buffers=buffers,
                published=published,
                predicted=eff,
                points=100 * (eff - published),
            )
        )
    return pd.DataFrame(rows)


# Failures at scale


def reliability(gpus_list, checkpoint_s, restart_s, rate=None):
    """For runs of each size: mean time between failures at Llama 3's rate per GPU, the Young/Daly
    checkpoint interval for a checkpoint that takes checkpoint_s, and the share of time lost."""
    rate = rate or pm.failure_rate_per_gpu_hour(**LLAMA3)
    rows = []
    for n in gpus_list:
        mtbf_s = pm.mtbf_hours(n, rate) * 3600
        tau = pm.young_daly_interval(checkpoint_s, mtbf_s)
        rows.append(
            dict(
                gpus=n,
                mtbf_h=mtbf_s / 3600,
                interval_min=tau / 60,
                lost=pm.expected_overhead(tau, checkpoint_s, mtbf_s, restart_s),
            )
        )
    return pd.DataFrame(rows)


# This machine: alpha and beta from lesson 04's all-reduce sweep

def fit_alpha_beta(sweep, op="all_reduce"):
    """alpha and beta of one collective on this machine from lesson 04's sweep (allreduce_bw
    records, or collective_bw's for the other ops): the op's formula (perfmodel.COLLECTIVES) is
    A(N) alpha + B(N) S / beta, a straight line in S, fitted to every size by least squares on
    the relative error (a 1 KB and a 4 MB message weigh alike). For the ring all-reduce A = 2(N-1)
    and B = 2(N-1)/N. Returns alpha, beta and the sweep with each size's predicted time and
    error."""
    import numpy as np

    formula = pm.COLLECTIVES[op]
    n = int(sweep["world_size"].iloc[0])
    per_alpha, per_byte = formula(0, n, 1.0, 1.0), formula(1, n, 0.0, 1.0)
    size, time = sweep["size_bytes"].to_numpy(float), sweep["time_s"].to_numpy(float)
    # (a + b S) / t = 1 for every size: rows divided by t weigh each size by its relative error
    rows = np.stack([1 / time, size / time], 1)
    (a, b), *_ = np.linalg.lstsq(rows, np.ones_like(time), rcond=None)
    if a < 0:  # a busy machine's noise can tilt the line below the origin: no latency is
        # physical then; the best line through the origin (a = 0), as non-negative least squares
        a, b = 0.0, float(rows[:, 1].sum() / (rows[:, 1] ** 2).sum())
    elif b <= 0:  # or tilt it down (small messages slower than large ones): no cost per byte
        # shows then; the best flat line (b = 0, beta infinite), as non-negative least squares
        a, b = float(rows[:, 0].sum() / (rows[:, 0] ** 2).sum()), 0.0
    alpha, beta = a / per_alpha, (per_byte / b if b > 0 else math.inf)
    table = sweep.sort_values("size_bytes").assign(
        predicted_s=lambda t: [formula(s, n, alpha, beta) for s in t["size_bytes"]]
    )
    table["error"] = table["predicted_s"] / table["time_s"] - 1
    return alpha, beta, table


# What if: the fitted ResNet-50 job on other machines and sizes

def what_if(fit, grad_bytes, gpus_list, nodes, buckets=4, batch=128, price_per_gpu_hour=2.0):
    """The JSC job (the model fitted on its runs) on n GPUs of each node type: minutes, efficiency
    against n times one GPU, and cost. Only the links change: the per-sample time is the A100's."""
    rows = []
    one = (fit["per_sample_s"] * batch * jsc_steps(1, batch) + fit["fixed_s"]) / 60
    for label, node in nodes.items():
        for n in gpus_list:
            comm = jsc_comm(n, grad_bytes, node) if n > 1 else 0.0
            step = pm.step_time(fit["per_sample_s"] * batch, comm, buckets=buckets)
            step += fit["sync_s"] if n > 1 else 0.0
            minutes = (step * jsc_steps(n, batch) + fit["fixed_s"]) / 60
            rows.append(dict(node=label, gpus=n, minutes=minutes, efficiency=one / (n * minutes),
                             cost=pm.cost(n, minutes / 60, price_per_gpu_hour)))
    return pd.DataFrame(rows)


def checkpoint_seconds(params, folder):
    """Seconds to write a checkpoint of this many float32 parameters here, as trainup's are written
    (torch.save to a temporary file, then a rename), measured once."""
    import os
    import time

    import torch

    folder.mkdir(parents=True, exist_ok=True)
    state = {"weights": torch.zeros(int(params))}
    tmp, path = folder / "predict_probe.pt.tmp", folder / "predict_probe.pt"
    tick = time.perf_counter()
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())  # on the disk, not in the page cache: what a crash would keep
    os.replace(tmp, path)
    seconds = time.perf_counter() - tick
    path.unlink()
    return seconds
