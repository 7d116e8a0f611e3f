"""Lesson 11's performance model: a training step's time as arithmetic over measured and published
numbers, and what failures cost at scale.

    step = compute + communication not hidden behind backward + pipeline bubble + fixed costs

Communication follows the alpha-beta (Hockney) model: a message of n bytes over a link costs
alpha + n / beta (alpha: latency, seconds; beta: bandwidth, bytes/s). Each collective's formula
names its source; the published link and GPU figures are in lessons/hardware.py.
"""

import math

# bytes a rank sends per byte of a collective's buffer, in a ring (lesson 09's counts)
RING = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
        "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: (n - 1) / n}


def bubble_share(p, m, v=1):
    """The bubble's share of the time for p ranks, m micro-batches and v stages per rank, with equal
    stages and free sends: (p-1)/(v*m+p-1) for m >= p (GPipe's paper for v = 1; Megatron-LM's
    interleaved 1F1B, arXiv 2104.04473 section 2.2, for v > 1, derived for m a multiple of p).

    With m < p the micro-batches cannot fill the loop of v*p virtual stages: each passes them one
    after another, forward then backward, so the step lasts (v*p+m-1) pieces of 1/v of a rank's work
    per micro-batch, and a rank is busy v*m of them: the bubble is 1 - v*m/(v*p+m-1), which is
    (p-1)/p at m = 1 whatever v is, and the formula above at m = p (for v = 1 the two agree)."""
    if m >= p:
        return (p - 1) / (v * m + p - 1)
    return 1 - v * m / (v * p + m - 1)


def p2p(n_bytes, alpha, beta):
    """One message: alpha + n/beta (Hockney, Parallel Computing 20(3), 1994)."""
    return alpha + n_bytes / beta


def ring_all_reduce(n_bytes, p, alpha, beta):
    """Ring all-reduce of an n-byte buffer over p ranks: a reduce-scatter, then an all-gather;
    2(p-1) steps of n/p bytes each: 2(p-1) alpha + 2(p-1)/p n/beta. Bandwidth-optimal (Patarasuk
    and Yuan, JPDC 69(2), 2009); the ring NCCL uses for large messages."""
    if p == 1:
        return 0.0
    return 2 * (p - 1) * alpha + RING["all_reduce"](p) * n_bytes / beta


def tree_all_reduce(n_bytes, p, alpha, beta):
    """Binomial-tree all-reduce (a reduce to one rank, then a broadcast): 2 ceil(log2 p) (alpha +
    n/beta) (Thakur, Rabenseifner and Gropp, IJHPCA 19(1), 2005). Fewer latencies than the ring,
    more bytes: it wins for small messages on many ranks."""
    if p == 1:
        return 0.0
    return 2 * math.ceil(math.log2(p)) * (alpha + n_bytes / beta)


def ring_all_gather(n_bytes, p, alpha, beta):
    """Ring all-gather into an n-byte output (each rank brings n/p): (p-1) alpha + (p-1)/p n/beta
    (Thakur et al. 2005). A reduce-scatter of an n-byte input costs the same."""
    if p == 1:
        return 0.0
    return (p - 1) * alpha + RING["all_gather"](p) * n_bytes / beta


ring_reduce_scatter = ring_all_gather


def tree_broadcast(n_bytes, p, alpha, beta):
    """Binomial-tree broadcast of n bytes from one rank: ceil(log2 p) (alpha + n/beta) (Thakur et
    al. 2005): on 2 ranks one message, whose every byte the root sends."""
    if p == 1:
        return 0.0
    return math.ceil(math.log2(p)) * (alpha + n_bytes / beta)


COLLECTIVES = {"all_reduce": ring_all_reduce, "all_gather": ring_all_gather,
               "reduce_scatter": ring_reduce_scatter, "broadcast": tree_broadcast}


def collectives(ops, p, alpha, beta):
    """Seconds of the collectives of one step, one after another: ops as lesson 09's shard_comm
    record counts them, {op: {"calls": k, "bytes": b}} (b: every call's buffer, summed). Each call
    pays its latency; the formulas are linear in the bytes, so k calls cost k times one call of
    b/k bytes. alpha and beta: one link's, or {op: value} where each op was measured apart (a
    library may run one op slower than its formula says, gloo's reduce-scatter for one)."""
    def of(value, op):
        return value.get(op, value["all_reduce"]) if isinstance(value, dict) else value
    return sum(c["calls"] * COLLECTIVES[op](c["bytes"] / c["calls"], p, of(alpha, op), of(beta, op))
               for op, c in ops.items() if c.get("calls"))


def hierarchical_all_reduce(n_bytes, nodes, gpus_per_node, intra, inter):
    """All-reduce over nodes x gpus_per_node GPUs as NCCL does it across nodes: a reduce-scatter
    inside each node, then gpus_per_node all-reduces of n/g bytes across the nodes at once (sharing
    the node's network: each gets inter.beta / g, so the g of them together cost an all-reduce of
    n bytes at the node's bandwidth), then an all-gather inside the node. intra and inter are
    (alpha, beta) pairs; inter's beta is the node's total network bandwidth."""
    g = gpus_per_node
    inside = 2 * ring_reduce_scatter(n_bytes, g, *intra)
    across = ring_all_reduce(n_bytes, nodes, inter[0], inter[1])
    return inside + across


def exposed(comm_s, backward_s, buckets=1):
    """The part of a step's gradient communication that backward does not hide. DDP and Horovod
    start each bucket's all-reduce as soon as backward has computed its gradients: with k equal
    buckets ready at i/k of backward, sent one after another, the last one ends at
    max_i(i/k backward + (k-i+1)/k comm); what lies past backward's end is exposed. One bucket
    (no overlap): all of it."""
    k = max(1, int(buckets))
    end = max(i / k * backward_s + (k - i + 1) / k * comm_s for i in range(1, k + 1))
    return max(0.0, end - backward_s)


def zero_traffic(param_bytes, p, stage):
    """Bytes a rank sends per step under ZeRO stage 0-3 in a ring (Rajbhandari et al., SC 2020):
    stages 0 (DDP), 1 and 2 move 2(p-1)/p of the gradients (an all-reduce, or a reduce-scatter then
    an all-gather of the updated parameters); stage 3 (FSDP) gathers the parameters again for
    backward, 3(p-1)/p: 1.5 times as much."""
    return (3 if stage == 3 else 2) * RING["all_gather"](p) * param_bytes


def step_time(compute_s, comm_s=0.0, backward_share=2 / 3, buckets=1, bubble=0.0, fixed_s=0.0):
    """One step: compute, then the communication backward does not hide (backward is about 2/3 of
    a step's compute: twice the forward's FLOPs), stretched by a pipeline bubble's share (the
    bubble is that share of the whole step), plus fixed costs."""
    busy = compute_s + exposed(comm_s, backward_share * compute_s, buckets)
    return busy / (1 - bubble) + fixed_s


def efficiency(one_device_step_s, step_s):
    """Weak-scaling efficiency: the step of one device over the step of one of many, at the same
    per-device batch (1 = communication and waiting cost nothing)."""
    return one_device_step_s / step_s


def pipeline_step(compute_s, stages, microbatches, chunks=1):
    """A pipeline's step from one device's compute: each of p stages does 1/p of it, and waits
    the bubble's share (bubble_share, lesson 06's schedules.theory)."""
    return compute_s / stages / (1 - bubble_share(stages, microbatches, chunks))


# Failures at scale


def failure_rate_per_gpu_hour(interruptions, days, gpus):
    """Interruptions per GPU-hour from a run's count (failures independent, at one rate)."""
    return interruptions / (days * 24 * gpus)


def mtbf_hours(gpus, rate_per_gpu_hour):
    """Mean time between failures of a job on this many GPUs: any one of them stops the job."""
    return 1 / (gpus * rate_per_gpu_hour)


def young_daly_interval(checkpoint_s, mtbf_s):
    """The checkpoint interval that loses least: sqrt(2 C M) (Young, CACM 17(9), 1974); Daly's
    higher-order form (FGCS 22(3), 2006) for C < 2M: sqrt(2CM)(1 + sqrt(C/2M)/3 + C/18M) - C."""
    c, m = checkpoint_s, mtbf_s
    if c >= 2 * m:
        return m
    return math.sqrt(2 * c * m) * (1 + math.sqrt(c / (2 * m)) / 3 + c / (18 * m)) - c


def expected_overhead(interval_s, checkpoint_s, mtbf_s, restart_s):
    """The share of wall time not spent training, to first order: writing checkpoints (C/tau),
    and per failure the work since the last checkpoint (tau/2 on average) and the restart."""
    return checkpoint_s / interval_s + (interval_s / 2 + restart_s) / mtbf_s


def cost(gpus, hours, price_per_gpu_hour):
    """What a run costs at a price per GPU-hour."""
    return gpus * hours * price_per_gpu_hour
