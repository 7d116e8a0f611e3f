"""Solutions to lesson 10a's exercises. Run: python notebooks/solutions/10a_same_model.py"""


def with_ddp8(log_dir=None, checkpoint_dir=None):
    """Exercise 1: the equivalence table with a DDP row for 8 ranks added in one line; returns its row."""
    from lessons.bylesson import equivalence as eq
    from lessons.bylesson import scaling_report as sr
    from trainup import CHECKPOINT_DIR, LOG_DIR
    ddp8 = sr.Strategy("DDP, 8 ranks", "DDP", dict(script="_trainup_ddp.py", world_size=8, accumulate=(None, 1)),
                       sr.ONE_DEVICE, dropout_off="always",
                       made_by="torchrun --nproc-per-node 8 scripts/_trainup_ddp.py --dropout 0 --precision 64")
    at = next(i for i, s in enumerate(sr.STRATEGIES) if s.name == "DDP, 4 ranks") + 1
    strategies = sr.STRATEGIES[:at] + [ddp8] + sr.STRATEGIES[at:]  # one line in the registry, after 4 ranks
    runs, _ = sr.load(log_dir or LOG_DIR)
    table = eq.equivalence(runs, checkpoint_dir or CHECKPOINT_DIR, strategies)
    return table.set_index("strategy").loc["DDP, 8 ranks"]


def reorder_gap(n=64, draws=200, seed=0, dtype=None):
    """Exercise 2: the largest difference between one sum of n gradients and the same sum taken as two
    halves added together (1 rank against 2 ranks of n/2), relative to the sum's size, over many draws;
    in float32 unless dtype says otherwise (torch.float64: the proofs' precision)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    worst = 0.0
    for _ in range(draws):
        x = torch.randn(n, generator=g, dtype=dtype or torch.float32)
        one = x.sum()
        two = x[: n // 2].sum() + x[n // 2:].sum()
        worst = max(worst, float((one - two).abs()) / max(float(x.abs().sum()), 1e-30))
    return worst


if __name__ == "__main__":
    print("DDP, 8 ranks:", dict(with_ddp8()[["result", "reason"]]))
    import torch
    print(f"summation order moves a float32 sum by at most {reorder_gap():.1e} of its size, a float64 sum by "
          f"{reorder_gap(dtype=torch.float64):.1e} (the proofs' tolerance: 1e-9, in float64)")
