"""Lessons 11 to 11a2: the performance model (lessons/perfmodel.py) fitted on this machine's
all-reduce sweep (11) and on published runs (11a1), its predictions checked against the runs it
was not fitted on, and the failures a run of many GPUs must expect (11a2).

Every published number here carries its source; every prediction is computed, and so is its error.
"""

import math

import pandas as pd

from .. import perfmodel as pm
from ..hardware import NODES

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


# The costs a fit may put the published runs' time in, beyond the images a GPU trains (seconds a
# unit; what each multiplies, for a run of `gpus` GPUs at `batch` a GPU):
# - epoch_start: each epoch's first batch. The course's scripts (code/parallelize: DataModule's
#   DataLoader(num_workers=cpus-per-task), no persistent workers) start the loader's workers again
#   every epoch, and the first step waits until one worker has built a whole batch alone: a cost
#   per epoch that grows with the batch a GPU takes, not with the images it trains;
# - sync: each step of several ranks, beyond the all-reduce the hardware predicts (waiting for the
#   slowest rank, DDP's hooks);
# - fixed: once a job (start-up, the last checkpoint).
JSC_COSTS = {
    "epoch_start": lambda gpus, batch: JSC_EPOCHS * batch,
    "sync": lambda gpus, batch: jsc_steps(gpus, batch) * (gpus > 1),
    "fixed": lambda gpus, batch: 1.0,
}
# The alternative two-point fit (every excess of the 4-GPU run on its steps), and the three-point
# fit that a run on several nodes allows.
PER_STEP = dict(costs=("sync",))
THREE_POINTS = dict(on=(1, 4, 16), costs=("sync", "fixed"))


def jsc_fit(runs, grad_bytes, buckets, on=(1, 4), costs=("epoch_start",)):
    """Fit the model on some of the published runs (on: GPU counts), one unknown a run: the time
    an image takes on a GPU, and the costs named (JSC_COSTS), each in seconds a unit. The
    all-reduce is not fitted: the hardware predicts it. Returns {"per_sample_s", cost: seconds},
    0 for the costs not fitted."""
    import numpy as np

    if len(on) != 1 + len(costs):
        raise ValueError(f"{len(on)} runs fit {len(on)} unknowns: the time an image takes and "
                         f"{len(on) - 1} cost(s), not {len(costs)}")
    first = runs[runs["gpus"] == 1].iloc[0]
    guess = first["minutes"] * 60 / (JSC_EPOCHS * IMAGENET_TRAIN)  # for overlap only
    rows, times = [], []
    for _, r in runs[runs["gpus"].isin(on)].iterrows():
        gpus, batch = int(r["gpus"]), int(r["per_gpu_batch"])
        steps = jsc_steps(gpus, batch)
        comm = jsc_comm(gpus, grad_bytes) if gpus > 1 else 0.0
        exposed = pm.exposed(comm, 2 / 3 * guess * batch, buckets)
        rows.append([steps * batch] + [JSC_COSTS[c](gpus, batch) for c in costs])
        times.append(r["minutes"] * 60 - steps * exposed)
    x = np.linalg.solve(np.array(rows, float), np.array(times, float))
    fit = dict.fromkeys(JSC_COSTS, 0.0)
    fit.update(per_sample_s=float(x[0]), **{c: float(v) for c, v in zip(costs, x[1:])})
    return fit


def jsc_minutes(fit, gpus, batch, comm_s, buckets):
    """Minutes of the job on `gpus` GPUs at `batch` a GPU: every step's compute and the
    communication backward does not hide, plus the fitted costs."""
    step = pm.step_time(fit["per_sample_s"] * batch, comm_s, buckets=buckets)
    extra = sum(fit[c] * unit(gpus, batch) for c, unit in JSC_COSTS.items())
    return (step * jsc_steps(gpus, batch) + extra) / 60


def jsc_predictions(runs, grad_bytes, buckets, on=(1, 4), costs=("epoch_start",)):
    """Every published run against the model fitted on some of them (on: GPU counts)."""
    fit = jsc_fit(runs, grad_bytes, buckets, on, costs)
    rows = []
    for _, r in runs.iterrows():
        batch, gpus = int(r["per_gpu_batch"]), int(r["gpus"])
        comm = jsc_comm(gpus, grad_bytes) if gpus > 1 else 0.0
        predicted = jsc_minutes(fit, gpus, batch, comm, buckets)
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


def jsc_sensitivity(runs, grad_bytes, buckets, moved=4, by=0.02, at=(64, 128), **fit):
    """How far the fit's predictions move when one fitted run's time moves: {gpus: (prediction
    with that run's time x (1 - by), x (1 + by)), each as a change of the prediction} for the
    GPU counts `at`. A fit whose unknowns come from the difference of two runs amplifies that
    run's error."""
    out = {}
    base = jsc_predictions(runs, grad_bytes, buckets, **fit).set_index("gpus")["predicted_min"]
    for sign in (-1, 1):
        r = runs.copy()
        r.loc[r["gpus"] == moved, "minutes"] *= 1 + sign * by
        t = jsc_predictions(r, grad_bytes, buckets, **fit).set_index("gpus")["predicted_min"]
        for g in at:
            out.setdefault(g, []).append(t[g] / base[g] - 1)
    return {g: tuple(v) for g, v in out.items()}


def implied_fixed_minutes(table):
    """What the misses imply: the published minus the predicted time of each held-out run."""
    held = table[~table["fitted"]]
    return (held["published_min"] - held["predicted_min"]).tolist()


def worker_image_bound_s(runs, gpus=4, workers_per_gpu=24):
    """The most a loader worker may take an image in steady state without slowing the published
    run on `gpus` GPUs (its script: 24 CPUs a task, one worker each): workers over the images a
    GPU trained a second. The epoch start's fitted cost an image compares with it."""
    r = runs[runs["gpus"] == gpus].iloc[0]
    per_gpu_rate = JSC_EPOCHS * IMAGENET_TRAIN / gpus / (r["minutes"] * 60)
    return workers_per_gpu / per_gpu_rate


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


# This machine: alpha and beta from lesson 04a1's all-reduce sweep

def fit_alpha_beta(sweep, op="all_reduce"):
    """alpha and beta of one collective on this machine from lesson 04a1's sweep (allreduce_bw
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
    one = jsc_minutes(fit, 1, batch, 0.0, buckets)
    for label, node in nodes.items():
        for n in gpus_list:
            comm = jsc_comm(n, grad_bytes, node) if n > 1 else 0.0
            minutes = jsc_minutes(fit, n, batch, comm, buckets)
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
