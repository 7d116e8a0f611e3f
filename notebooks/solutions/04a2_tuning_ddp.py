"""Solutions to lesson 04a2's exercises. Run: python notebooks/solutions/04a2_tuning_ddp.py"""


def weak_scaling(per_process=32, samples=512, worlds=(1, 2, 4)):
    """Exercise 1: the global batch that keeps each process's share fixed, and the steps of an
    epoch."""
    rows = []
    for n in worlds:
        batch = per_process * n
        steps = -(-samples // batch)  # the last batch may be short
        rows.append(dict(processes=n, global_batch=batch, per_process=per_process,
                         steps_per_epoch=steps))
    return rows


def linear_lr(batch, base_lr=0.01, base_batch=16):
    """Exercise 2: the linear scaling rule (Goyal et al., 2017): k times the batch, k times the
    rate."""
    return base_lr * batch / base_batch


if __name__ == "__main__":
    for row in weak_scaling():
        print(row, f"rate {linear_lr(row['global_batch']):g}")
