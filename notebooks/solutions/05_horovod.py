"""Solutions to lesson 05's exercises. Run: python notebooks/solutions/05_horovod.py"""


def scaled_lr(base_lr, size, epoch, warmup_epochs=5):
    """Exercise 1: what Horovod's docs recommend, done by hand (Horovod itself changes nothing):
    the rate grows linearly from base_lr to base_lr * size over the warm-up epochs, then stays there."""
    target = base_lr * size
    if warmup_epochs <= 0 or epoch >= warmup_epochs:
        return target
    return base_lr + (target - base_lr) * epoch / warmup_epochs


def micro_weights(sizes, how="samples"):
    """Exercise 2: the weight each micro-batch's MEAN gradient gets in one accumulated step of
    micro-batches of these sizes: "divide_by_k" (Horovod's examples divide each loss by the number
    of sub-batches K: 1/K each) or "samples" (this course: n_i / sum(n), the mean over the step's
    samples). Equal sizes give the same weights; a short micro-batch gets more than its share
    with 1/K."""
    if how == "divide_by_k":
        return [1 / len(sizes)] * len(sizes)
    if how == "samples":
        return [n / sum(sizes) for n in sizes]
    raise ValueError(f"how is 'divide_by_k' or 'samples', not {how!r}")


if __name__ == "__main__":
    print([round(scaled_lr(0.1, 4, e), 3) for e in range(7)])
    print(micro_weights([16, 16, 4], "divide_by_k"), micro_weights([16, 16, 4]))
