"""A planner (lesson 11a2, with 09's and 09b's formulas): for a transformer, a global batch and
some GPUs, every layout (data x tensor x pipeline parallel, a ZeRO stage, activation
checkpointing) with its bytes per GPU term by term, whether it fits, and its predicted step time;
the fastest that fits first.

    from lessons import hardware
    from lessons.bylesson import planner
    model = planner.Transformer(layers=32, hidden=4096, heads=32, seq=4096)
    planner.plan(model, global_batch=256, gpus=64, node=hardware.NODES["dgx_h100"])

The model is the course's transformer (trainup.transformer.Layer): attention and a 4h GELU MLP,
two LayerNorms, biases; no embedding or output layer. A Llama (SwiGLU, RMSNorm, no biases, a
vocabulary) has more parameters and MLP activations at the same width and depth.

Bytes per GPU (each term is the course's own formula; tests/test_planner.py counts them by hand
for a Llama-shaped layout and checks the activations against MemTracker's measurement):
- model states: ZeRO's bytes per parameter (trainup.parallel.sharding.expected), by the recipe a
precision
  names (PER_PARAM): "32" fp32 with Adam, 4+4+8; "bf16" FSDP2's MixedPrecisionPolicy(bf16, reduce
  fp32), fp32 weight and gradient shards and fp32 Adam, 4+4+8 too; "16" the ZeRO paper's fp16
  weights and gradients beside an fp32 master copy and Adam, 2+2+12; of the parameters one GPU owns
  (1/tp of each layer's matrices, 1/pp of the layers), the sharded states divided by dp x cp;
- DDP's gradient buckets (DDP and ZeRO-1, which runs over DDP): a second copy of the gradients,
  in their reduction's precision, for as long as the DDP module lives (bucket_view=True counts
  gradient_as_bucket_view=True, where .grad is a view of the buckets and no copy is kept);
- activations: trainup.transformer.activation_bytes per layer and micro-batch (16 s b h values,
  plus a s^2 b scores where attention is "unfused"); fused attention (F.scaled_dot_product_attention's
  flash and memory-efficient kernels, the default on recent GPUs) keeps no scores, only one fp32
  log-sum-exp a head and token (Dao et al. 2022), and recomputes the scores in backward;
  divided by tp (tensor parallelism WITH sequence parallelism, Korthikanti et al. 2022) and by
  cp (context parallelism: a GPU's seq / cp tokens), for the
  L/pp layers of a stage; 1F1B keeps pp micro-batches in flight on the first stage, so a stage
  holds L/pp x min(pp, m) = about L layers' worth; recomputation keeps less
  (lessons/bylesson/activations.formula: selective drops the softmax, which fused attention never
  keeps; full keeps a layer's input);
- fits: the total under the GPU's memory less MARGIN.

Time per step (lessons/perfmodel): compute = FLOPs / (GPUs x peak x MFU); data parallelism's
collectives behind backward (buckets), per step or per micro-batch as the stage needs (dp_traffic);
tensor parallelism's 4 all-reduces a layer and micro-batch in the open (Megatron-LM: 2 forward,
2 backward); the pipeline's bubble; recomputation adds its forward, fused attention its scores.
Left out: the optimizer step's time, kernels' launch costs, temporary buffers, memory
fragmentation, the embedding and the output layer.
"""

import math
from dataclasses import dataclass

from trainup.flops import PEAK_TFLOPS
from trainup.parallel.sharding import (FP32_ADAM, FSDP2_BF16, MIXED_ADAM, STAGES, ZERO_STAGE,
                                       expected)

from .. import perfmodel as pm
from .activations import formula as activation_formula

# Llama 3's 16K-GPU pre-training ran at 38-43 % BF16 MFU (Dubey et al. 2024, arXiv 2407.21783,
# Table 4): a well-tuned large run's figure, the default a learner overrides with their own
MFU = 0.40
RECOMPUTE = ("none", "selective", "full")
GPU_MEMORY_GB = (24, 40, 80, 141)  # an L4/RTX 4090, an A100 40GB, an A100/H100 80GB, an H200
# A typed assumption, not a measurement: what a GPU's memory keeps for the CUDA context, the
# allocator's fragmentation and temporary buffers (the optimizer step's, the logits')
MARGIN = 0.10
ATTENTION = ("fused", "unfused")  # F.scaled_dot_product_attention's kernels, or scores kept
# The GPUs' memory, GB, from the datasheets (the 80 GB parts of A100 and H100)
GPU_MEMORY = {"A100": 80, "H100": 80, "H200": 141, "V100": 32, "L4": 24, "T4": 16, "P100": 16}
# bytes a parameter of (weights, gradients, Adam) for each --precision: see the docstring
PER_PARAM = {"32": FP32_ADAM, "bf16": FSDP2_BF16, "16": MIXED_ADAM}
STAGE_LABEL = {"none": "DDP", "optimizer": "ZeRO-1", "gradients": "ZeRO-2", "parameters": "ZeRO-3"}


@dataclass(frozen=True)
class Transformer:
    """A stack of trainup.transformer.Layer: attention (qkv, proj) and a 4h MLP, two LayerNorms."""

    layers: int
    hidden: int
    heads: int
    seq: int

    def layer_params(self):
        """qkv 3h^2+3h, proj h^2+h, fc1 4h^2+4h, fc2 4h^2+h, two LayerNorms 4h: 12h^2 + 13h."""
        h = self.hidden
        return 12 * h * h + 13 * h

    def params(self):
        return self.layers * self.layer_params()

    def flops_per_sample(self):
        """Forward and backward, 3 x the forward's 2 FLOPs per weight and token, plus attention's
        scores and mixing, 2 x 2 s^2 h a layer forward (PaLM, Chowdhery et al. 2022, appendix B:
        6N + 12 L h s per token)."""
        return self.seq * (6 * self.params() + 12 * self.layers * self.hidden * self.seq)


def llama_shaped(hidden, seq=4096):
    """The course's transformer at Llama's width and depth: a head and a layer per 128 of width
    (Llama 2 7B: 4096 wide, 32 layers of 32 heads; 13B: 5120, 40). Not Llama itself: a 4h GELU
    MLP, no embedding (Llama 2 7B has 6.74 billion parameters, this shape 6.44); Llama 2 70B
    (8192 wide, 80 layers, grouped-query attention) is not of this shape."""
    return Transformer(layers=hidden // 128, hidden=hidden, heads=hidden // 128, seq=seq)


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int = 1
    pp: int = 1
    stage: str = "none"  # a trainup.parallel.sharding mode: none, optimizer, gradients, parameters
    recompute: str = "none"  # lessons/bylesson/activations: none, selective, full
    micro: int = 1  # samples a micro-batch (per data-parallel replica)
    attention: str = "fused"  # ATTENTION: fused keeps no s^2 scores; unfused keeps them
    # context parallel (lesson 09g): each GPU holds seq / cp of the tokens; its ranks hold the
    # same parameters, so ZeRO shards over dp x cp (torchtitan's dp_shard_cp). memory() only:
    # step() has no term for the ring's sends and refuses it
    cp: int = 1

    @property
    def gpus(self):
        return self.dp * self.tp * self.pp * self.cp

    def label(self):
        parts = [f"dp{self.dp}"] + [f"cp{self.cp}"] * (self.cp > 1)
        parts += [f"tp{self.tp}"] * (self.tp > 1) + [f"pp{self.pp}"] * (self.pp > 1)
        extra = [STAGE_LABEL[self.stage]] * (self.dp > 1) + [f"{self.recompute} recompute"] * (
            self.recompute != "none") + ["unfused attention"] * (self.attention == "unfused")
        return ", ".join([" x ".join(parts), *extra])


def micro_batches(global_batch, layout):
    """Micro-batches a replica runs per step (gradient accumulation, or the pipeline's m)."""
    per_replica = global_batch // layout.dp
    return max(1, per_replica // layout.micro)


def states(params, layout, per_param=FSDP2_BF16):
    """Bytes per GPU of (parameters, gradients, optimizer state): a GPU owns 1/tp of each layer's
    weights and the layers of 1/pp of the stages; ZeRO shards its stage's states over dp x cp
    (biases and LayerNorms, replicated under tp, are counted as cut: 13h of a layer's
    12h^2 + 13h)."""
    return expected(layout.stage, params / (layout.tp * layout.pp), layout.dp * layout.cp,
                    per_param)


def grad_value(precision):
    """Bytes of a gradient value as data parallelism reduces it: fp32 for "32" and for "bf16"
    (FSDP2's reduce_dtype fp32; DDP with autocast keeps fp32 gradients); 2 for the ZeRO paper's
    fp16 recipe."""
    return 2 if precision == "16" else 4


def gather_value(precision):
    """Bytes of a parameter value as ZeRO-3 all-gathers it: the compute precision (FSDP2 casts
    its shard to param_dtype before the all-gather)."""
    return 2 if precision in ("bf16", "16") else 4


def activations_per_layer(model, layout, precision="bf16"):
    """Bytes one layer keeps for backward for one micro-batch, on one GPU (divided by tp: with
    sequence parallelism; by cp: a GPU's seq / cp tokens, their rows of the scores)."""
    value = 2 if precision in ("bf16", "16") else 4  # activations in the compute precision
    s, b, a = model.seq, layout.micro, model.heads
    kept = activation_formula(layout.recompute, 1, model.hidden, a, s, b, value)
    if layout.attention == "fused" and layout.recompute != "full":
        # no a s^2 b scores (selective recomputation drops exactly those); the kernel keeps its
        # log-sum-exp, one fp32 value a head and token
        kept = activation_formula("selective", 1, model.hidden, a, s, b, value) + 4 * a * s * b
    return kept / (layout.tp * layout.cp)


def memory(model, layout, global_batch, precision="bf16", bucket_view=False):
    """Bytes per GPU, term by term: dict(param, grad, optim, buckets, activations, total);
    precision: a PER_PARAM recipe (bf16: FSDP2's, 16: the ZeRO paper's mixed precision)."""
    param, grad, optim = states(model.params(), layout, PER_PARAM[precision])
    ddp = layout.dp > 1 and ZERO_STAGE[layout.stage] <= 1 and not bucket_view
    buckets = grad_value(precision) * model.params() / (layout.tp * layout.pp) if ddp else 0.0
    one = activations_per_layer(model, layout, precision)
    in_flight = min(layout.pp, micro_batches(global_batch, layout))
    acts = model.layers / layout.pp * in_flight * one
    return dict(param=param, grad=grad, optim=optim, buckets=buckets, activations=acts,
                total=param + grad + optim + buckets + acts)


def _group_link(size, inner, node):
    """(alpha, beta) of a group of `size` GPUs whose members are `inner` GPUs apart: inside a node
    while size x inner fits in one (Megatron's order: tp innermost, then dp, then pp)."""
    return node.intra_link() if size * inner <= node.gpus else node.inter_link()


def dp_all_reduce(n_bytes, layout, node):
    """The gradients' all-reduce over dp: a ring inside a node, hierarchical across nodes (each
    node's GPUs of one tp rank share its network)."""
    if layout.dp == 1:
        return 0.0
    per_node = max(1, node.gpus // layout.tp)
    if layout.dp <= per_node:
        return pm.ring_all_reduce(n_bytes, layout.dp, *node.intra_link())
    nodes = layout.dp // per_node
    alpha, beta = node.inter_link()
    return pm.hierarchical_all_reduce(n_bytes, nodes, per_node, node.intra_link(),
                                      (alpha, beta / layout.tp))


def dp_traffic(model, layout, global_batch, node, precision="bf16"):
    """Seconds of data parallelism's collectives a step, over dp (an all-gather or a
    reduce-scatter of n bytes: half an all-reduce of n, its two halves):
    DDP: one all-reduce of the gradients a step (no_sync over the micro-batches);
    ZeRO-1: the same bytes (a reduce-scatter of the gradients, an all-gather of the updated
    weights, as the ZeRO paper and Megatron's distributed optimizer count it);
    ZeRO-2: a reduce-scatter of the gradients every micro-batch, the weights' all-gather once;
    ZeRO-3 (FSDP): every micro-batch, the parameters all-gathered in forward and again in
    backward, and the gradients reduce-scattered (FSDP2's default; deferring the reduction keeps
    whole gradients, which the memory term does not count)."""
    owned = model.params() / (layout.tp * layout.pp)
    m = micro_batches(global_batch, layout)
    grads = dp_all_reduce(owned * grad_value(precision), layout, node)
    stage = ZERO_STAGE[layout.stage]
    if stage <= 1:
        return grads
    weights = PER_PARAM[precision][0]
    if stage == 2:
        return m * grads / 2 + dp_all_reduce(owned * weights, layout, node) / 2
    gathers = dp_all_reduce(owned * gather_value(precision), layout, node)  # 2 halves: 2 gathers
    return m * (gathers + grads / 2)


def recompute_flops(model, layout):
    """FLOPs a sample adds by running forward work again: full recomputation a whole forward,
    selective the scores and their mixing (4 s^2 h a layer), fused attention's backward the
    scores (q k^T, 2 s^2 h a layer; Dao et al. 2022)."""
    L, h, s = model.layers, model.hidden, model.seq
    if layout.recompute == "full":
        return 2 * model.params() * s + 4 * L * h * s ** 2
    if layout.attention == "fused":
        return 2 * L * h * s ** 2
    return 4 * L * h * s ** 2 if layout.recompute == "selective" else 0.0


def step(model, layout, global_batch, node, precision="bf16", mfu=MFU):
    """Predicted seconds of one step: dict(compute, dp, tp, bubble, total)."""
    if layout.cp > 1:
        raise ValueError(f"the step's time has no term for context parallelism's ring (cp "
                         f"{layout.cp}): use a layout with cp 1, or memory() for its bytes")
    peak = PEAK_TFLOPS[node.gpu]["bf16" if precision in ("bf16", "16") else "32"] * 1e12
    flops = global_batch * (model.flops_per_sample() + recompute_flops(model, layout))
    compute = flops / (layout.gpus * peak * mfu)
    value = 2 if precision in ("bf16", "16") else 4
    m = micro_batches(global_batch, layout)
    # Megatron-LM: per layer and micro-batch, 2 all-reduces of b s h values forward, 2 backward
    tp_bytes = layout.micro * model.seq * model.hidden * value
    tp = 4 * model.layers / layout.pp * m * pm.ring_all_reduce(
        tp_bytes, layout.tp, *_group_link(layout.tp, 1, node)) if layout.tp > 1 else 0.0
    dp = dp_traffic(model, layout, global_batch, node, precision)
    bubble = pm.bubble_share(layout.pp, m) if layout.pp > 1 else 0.0
    total = pm.step_time(compute + tp, dp, buckets=8, bubble=bubble)
    return dict(compute=compute, dp=dp, tp=tp, bubble=bubble, total=total)


def layouts(gpus, model, node, stages=STAGES, recompute=RECOMPUTE, micro=1, attention="fused"):
    """Every dp x tp x pp of `gpus` with tp inside a node and dividing the heads, pp dividing the
    layers; each with every ZeRO stage that applies (below) and every recomputation (with fused
    attention selective recomputation is no layout of its own: there is nothing it would drop)."""
    recompute = [r for r in recompute if not (attention == "fused" and r == "selective")]
    out = []
    for tp in (t for t in range(1, node.gpus + 1) if gpus % t == 0 and model.heads % t == 0
               and node.gpus % t == 0):
        for pp in (p for p in range(1, gpus // tp + 1) if (gpus // tp) % p == 0
                   and model.layers % p == 0):
            dp = gpus // (tp * pp)
            for stage in stages:
                # one replica: nothing to shard over. FSDP with tp is torchtitan's 2-D layout
                # (lesson 09c runs it). ZeRO-2/3 with pp: each stage runs many micro-batches, and
                # regathering every one is what torchtitan avoids by keeping the parameters
                # gathered (reshard_after_forward=False), which the memory term does not count
                if (dp == 1 and stage != "none") or (pp > 1 and ZERO_STAGE[stage] > 1):
                    continue
                out += [Layout(dp, tp, pp, stage, r, micro, attention) for r in recompute]
    return out


def plan(model, global_batch, gpus, node, memory_gb=None, precision="bf16", mfu=MFU, micro=1,
         attention="fused", margin=MARGIN, bucket_view=False):
    """Every layout with its bytes and predicted step, fitting ones first, fastest first: a
    DataFrame (memory in GB of 1e9 bytes; the GPU's memory: memory_gb, or the node's; a layout
    fits when its total is under that less the margin)."""
    import pandas as pd

    memory_gb = memory_gb or GPU_MEMORY[node.gpu]
    rows = []
    for lay in layouts(gpus, model, node, micro=micro, attention=attention):
        if global_batch % (lay.dp * lay.micro):
            continue
        mem = memory(model, lay, global_batch, precision, bucket_view)
        t = step(model, lay, global_batch, node, precision, mfu)
        rows.append(dict(layout=lay.label(), dp=lay.dp, tp=lay.tp, pp=lay.pp,
                         zero=STAGE_LABEL[lay.stage], recompute=lay.recompute,
                         states_gb=(mem["param"] + mem["grad"] + mem["optim"]) / 1e9,
                         buckets_gb=mem["buckets"] / 1e9,
                         activations_gb=mem["activations"] / 1e9, total_gb=mem["total"] / 1e9,
                         fits=mem["total"] <= (1 - margin) * memory_gb * 1e9, step_s=t["total"],
                         dp_s=t["dp"]))
    df = pd.DataFrame(rows)
    # fitting first, then fastest; of equal steps the one that holds fewer bytes
    order = ["fits", "step_s", "total_gb"]
    return df.sort_values(order, ascending=[False, True, True]).reset_index(drop=True)


def largest_hidden(memory_gb, gpus, node, global_batch, precision="bf16", seq=4096,
                   limit=65536):
    """The widest Llama-shaped model (llama_shaped) for which some layout of `gpus` fits, and that
    layout: (model, plan row) or (None, None). Widths step by 1024, so that heads and layers are
    multiples of 8 and every tp and pp of up to 8 divides them."""
    best = (None, None)
    for hidden in range(1024, limit + 1, 1024):
        model = llama_shaped(hidden, seq)
        df = plan(model, global_batch, gpus, node, memory_gb, precision)
        if df.empty or not df["fits"].iloc[0]:
            break  # one wider needs more of every term: none wider fits either
        best = (model, df.iloc[0])
    return best


def fits_table(node, gpus=8, global_batch=64, memory_gbs=GPU_MEMORY_GB, precision="bf16",
               seq=4096):
    """The largest Llama-shaped model each GPU memory holds on `gpus` GPUs, and how: a
    DataFrame."""
    import pandas as pd

    rows = []
    for gb in memory_gbs:
        model, row = largest_hidden(gb, gpus, node, global_batch, precision, seq)
        rows.append(dict(memory_gb=gb, params_b=model.params() / 1e9 if model else 0.0,
                         hidden=model.hidden if model else 0, layers=model.layers if model else 0,
                         layout=row["layout"] if model else "none fits",
                         step_s=row["step_s"] if model else math.nan))
    return pd.DataFrame(rows)
