"""Solutions to lesson 10's exercises. Run: python notebooks/solutions/10_scaling_report.py"""


def serial_fraction(speedup, n):
    """Exercise 1: Amdahl's serial share s from a measured speedup on n devices: speedup = 1 / (s + (1 - s) / n)."""
    if n < 2:
        raise ValueError("a serial fraction needs at least 2 devices")
    return (n / speedup - 1) / (n - 1)


def predicted_speedup(s, n):
    """Exercise 1: the speedup Amdahl's law predicts on n devices for a serial share s."""
    return 1 / (s + (1 - s) / n)


def with_ddp8(log_dir=None, checkpoint_dir=None):
    """Exercise 2: the equivalence table with a DDP row for 8 ranks added in one line; returns its row."""
    from lessons import scaling_report as sr
    from trainup import CHECKPOINT_DIR, LOG_DIR
    ddp8 = sr.Strategy("DDP, 8 ranks", "DDP", dict(script="_trainup_ddp.py", world_size=8, accumulate=(None, 1)),
                       sr.ONE_DEVICE, dropout_off="always",
                       made_by="torchrun --nproc-per-node 8 scripts/_trainup_ddp.py --dropout 0 --precision 64")
    at = next(i for i, s in enumerate(sr.STRATEGIES) if s.name == "DDP, 4 ranks") + 1
    strategies = sr.STRATEGIES[:at] + [ddp8] + sr.STRATEGIES[at:]  # one line in the registry, after 4 ranks
    runs, _ = sr.load(log_dir or LOG_DIR)
    table = sr.equivalence(runs, checkpoint_dir or CHECKPOINT_DIR, strategies)
    return table.set_index("strategy").loc["DDP, 8 ranks"]


def reorder_gap(n=64, draws=200, seed=0, dtype=None):
    """Exercise 3: the largest difference between one sum of n gradients and the same sum taken as two
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
    s = serial_fraction(1.6, 2)
    print(f"a 1.6x speedup on 2 devices: serial share {s:.0%}; 8 devices would give {predicted_speedup(s, 8):.2f}x")
    print("DDP, 8 ranks:", dict(with_ddp8()[["result", "reason"]]))
    import torch
    print(f"summation order moves a float32 sum by at most {reorder_gap():.1e} of its size, a float64 sum by "
          f"{reorder_gap(dtype=torch.float64):.1e} (the proofs' tolerance: 1e-9, in float64)")
