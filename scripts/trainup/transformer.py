"""A transformer layer, written out so that every tensor it keeps for backward can be named and
counted.

    layers = transformer.stack(layers=4, hidden=64, heads=4)            # nn.Sequential of Layers
    transformer.recompute(layers, "full")       # each layer's activations recomputed in backward
    transformer.recompute(layers, "selective")  # attention's softmax part alone (Korthikanti)
    transformer.recompute(layers, "wrapped")    # full, by wrapping each layer (checkpoint_wrapper)

A pre-norm layer of GPT's shape: x + attention(LN(x)), then x + MLP(LN(x)) with a 4x GELU MLP; no
dropout (its masks are the only activations training adds beyond these). Activation checkpointing
is torch.utils.checkpoint, non-reentrant, as PyTorch recommends.
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
    and output. LayerNorm's mean and inverse deviation (2 values per token each) are left out: 1/h
    of the rest."""
    return bytes_per_value * (16 * seq * batch * hidden + heads * seq * seq * batch)


class Layer(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} must split evenly over {heads} heads")
        self.heads, self.recompute = heads, "none"
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def scores(self, q, k, v):
        """softmax(q k^T / sqrt(d)) v: the part whose activations grow with seq^2."""
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        return weights @ v

    def attention(self, x):
        b, s, h = x.shape
        q, k, v = (
            t.reshape(b, s, self.heads, h // self.heads).transpose(1, 2).contiguous()
            for t in self.qkv(x).split(h, dim=-1)
        )
        if self.recompute == "selective":  # keep q, k, v; recompute the seq x seq part in backward
            out = checkpoint(self.scores, q, k, v, use_reentrant=False)
        else:
            out = self.scores(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, s, h))

    def block(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    def forward(self, x):
        if self.recompute == "full":  # keep the layer's input only; run it again in backward
            return checkpoint(self.block, x, use_reentrant=False)
        return self.block(x)


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
        if isinstance(m, Layer):
            m.recompute = mode
    return model
