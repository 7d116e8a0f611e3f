"""Solutions to lesson 09ca's exercises. Run: python notebooks/solutions/09ca_tp_attention.py"""


# Sequence parallelism by hand
def ring_bytes_per_step(batch, tokens, width, layers, tp, sequence_parallel, bytes_per_value=4):
    """Part (a): bytes each rank sends in one step on a ring for the activation-sized collectives,
    each of batch x tokens x width values. Tensor parallelism alone: 2 all-reduces a layer in
    forward, 2 in backward and the head's input gradient, 2(tp-1)/tp of the message each. With
    sequence parallelism every all-reduce becomes a reduce-scatter and an all-gather, (tp-1)/tp
    each, the same bytes, and the model's two ends add one of each per direction (the
    embedding's reduce-scatter, the head's all-gather)."""
    if tp == 1:
        return 0.0
    message, share = batch * tokens * width * bytes_per_value, (tp - 1) / tp
    if not sequence_parallel:
        return (4 * layers + 1) * message * 2 * share
    return 4 * (2 * layers + 1) * message * share


def activation_saving(s, h, a, t):
    """Part (b): a layer's activations with tensor parallelism alone over those with sequence
    parallelism too, Korthikanti et al.'s counts (16-bit): s b h (10 + 24/t + 5 a s/(h t)) against
    s b h (34 + 5 a s/h) / t; the batch cancels."""
    alone = 10 + 24 / t + 5 * a * s / (h * t)
    return alone / ((34 + 5 * a * s / h) / t)


if __name__ == "__main__":
    for sp in (False, True):
        print(f"ring bytes, sequence parallel {sp}:", ring_bytes_per_step(32, 28, 16, 2, 2, sp, 8))
    saving = activation_saving(2048, 12288, 96, 8)
    print(f"GPT-3 at t = 8: sequence parallelism keeps {saving:.2f}x fewer activation bytes")
