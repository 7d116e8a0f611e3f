"""A transformer layer, written out so that every tensor it keeps for backward can be named and
counted.

    layers = transformer.stack(layers=4, hidden=64, heads=4)            # nn.Sequential of Layers
    transformer.recompute(layers, "full")       # each layer's activations recomputed in backward
    transformer.recompute(layers, "selective")  # attention's softmax part alone (Korthikanti)
    transformer.recompute(layers, "wrapped")    # full, by wrapping each layer (checkpoint_wrapper)
    model = transformer.Classifier((1, 28, 28), 10, layers=2, hidden=64, heads=4)  # images' rows

A pre-norm layer of GPT's shape: x + attention(LN(x)), then x + MLP(LN(x)) with a 4x GELU MLP
(attention and MLP are modules of their own, with q, k and v apart: what tensor parallelism cuts,
lesson 09c); no dropout (its masks are the only activations training adds beyond these).
Activation checkpointing is torch.utils.checkpoint, non-reentrant, as PyTorch recommends.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

RECOMPUTE = ("none", "selective", "full", "wrapped")


def activation_bytes(seq, batch, hidden, heads, bytes_per_value=4):
    """What one Layer keeps for backward, counted tensor by tensor (the names below are Layer's):
    LN1's input, attention's input (LN1's output), q, k and v, the softmax's output (heads x seq x
    seq per sample), the projection's input, LN2's input, the MLP's input, the GELU's input (4h)
    and output (4h): s*b*h*16 values plus a*s*s*b. In 16-bit with dropout, Korthikanti et al.
    (2022, "Reducing Activation Recomputation in Large Transformer Models") count s*b*h*(34 +
    5*a*s/h) bytes: the same tensors in 2 bytes each (32 s*b*h + 2 a*s*s*b) plus dropout's masks
    and output. LayerNorm's mean and inverse deviation (2 values per token each, two LayerNorms: 4
    values against 16 h) are left out: 1/(4h) of the rest."""
    return bytes_per_value * (16 * seq * batch * hidden + heads * seq * seq * batch)


class Attention(nn.Module):
    """Multi-head self-attention with q, k and v as three layers, so tensor parallelism can cut
    each by its output features: a rank's slice is whole heads (hidden / heads features each), and
    forward works out how many heads its slice holds (-1 below)."""

    def __init__(self, hidden, heads):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} must split evenly over {heads} heads")
        self.head_dim, self.recompute = hidden // heads, "none"
        # fused: F.scaled_dot_product_attention (flash or memory-efficient kernels), which keeps
        # no seq x seq scores for backward; the lessons' default writes the scores out (fused=False)
        self.fused = False
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
        self.proj = nn.Linear(hidden, hidden)

    def scores(self, q, k, v):
        """softmax(q k^T / sqrt(d)) v: the part whose activations grow with seq^2."""
        if self.fused:
            return F.scaled_dot_product_attention(q, k, v)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        return weights @ v

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (f(x).view(b, s, -1, self.head_dim).transpose(1, 2) for f in (self.q, self.k,
                                                                             self.v))
        if self.recompute == "selective":  # keep q, k, v; recompute the seq x seq part in backward
            out = checkpoint(self.scores, q, k, v, use_reentrant=False)
        else:
            out = self.scores(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, hidden, inner):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, inner), nn.Linear(inner, hidden)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Layer(nn.Module):
    def __init__(self, hidden, heads, inner=None):
        super().__init__()
        self.recompute = "none"
        self.ln1, self.attn = nn.LayerNorm(hidden), Attention(hidden, heads)
        self.ln2, self.mlp = nn.LayerNorm(hidden), MLP(hidden, inner or 4 * hidden)

    def block(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))

    def forward(self, x):
        if self.recompute == "full":  # keep the layer's input only; run it again in backward
            return checkpoint(self.block, x, use_reentrant=False)
        return self.block(x)


class Classifier(nn.Module):
    """Layers over an image read as a sequence: each row of pixels a token (channels x width
    features), embedded, through the layers, normalised, and a class score per token; the image's
    logits are its tokens' mean. No positions: the lessons that use it are about where its tensors
    live, and the rows' pixels already say much."""

    def __init__(self, shape=(1, 28, 28), num_classes=10, layers=2, hidden=64, heads=4,
                 inner=None):
        super().__init__()
        self.embed = nn.Linear(shape[0] * shape[2], hidden)
        self.layers = nn.Sequential(*(Layer(hidden, heads, inner) for _ in range(layers)))
        self.norm, self.head = nn.LayerNorm(hidden), nn.Linear(hidden, num_classes)

    def forward(self, x):
        tokens = x.permute(0, 2, 1, 3).flatten(2)  # (batch, rows, channels x width)
        return self.head(self.norm(self.layers(self.embed(tokens)))).mean(1)


def stack(layers, hidden, heads, seed=0, dtype=torch.float32):
    """`layers` Layers, the same initial weights for a seed on any machine."""
    torch.manual_seed(seed)
    return nn.Sequential(*(Layer(hidden, heads) for _ in range(layers))).to(dtype)


def recompute(model, mode):
    """Set every Layer's activation recomputation: none, selective or full; or wrapped: full, by
    wrapping every Layer in checkpoint_wrapper (apply_activation_checkpointing), as it is applied
    to a model before fully_shard (torchtitan does so), without changing the Layer's code."""
    if mode not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, not {mode!r}")
    if mode == "wrapped":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            apply_activation_checkpointing)
        # its default wrapper is non-reentrant torch.utils.checkpoint, as full's
        apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Layer))
        return model
    for m in model.modules():
        if isinstance(m, (Layer, Attention)):  # full is the Layer's, selective its Attention's
            m.recompute = mode
    return model
