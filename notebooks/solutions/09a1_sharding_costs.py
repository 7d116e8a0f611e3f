"""Solutions to lesson 09a1's exercises. Run: python notebooks/solutions/09a1_sharding_costs.py"""

# How many times one rank sends a ring collective's share, Ψ(N-1)/N, in one step: an all-reduce
# is a reduce-scatter plus an all-gather (2); ZeroRedundancyOptimizer keeps DDP's all-reduce and
# then broadcasts every updated tensor from its owner (3; the paper's ZeRO-1 would send 2);
# ZeRO-2 reduce-scatters the gradients and all-gathers the updated slices (2); ZeRO-3 gathers the
# parameters for forward and again for backward, and reduce-scatters the gradients (3).
SHARES = {"none": 2, "optimizer": 3, "gradients": 2, "parameters": 3}


def ring_bytes(mode, psi, n, bytes_per_value=4):
    """Exercise 1: bytes one rank sends in a step with ring collectives, by --shard mode."""
    return SHARES[mode] * psi * bytes_per_value * (n - 1) / n


def accumulated_bytes(mode, psi, n, micro_batches, bytes_per_value=4):
    """Exercise 2: bytes one rank sends in one optimizer step of K micro-batches, the whole model
    gathered each time. DDP with no_sync all-reduces once; ZeRO-2 reduce-scatters each micro-batch's
    gradients, then all-gathers the updated slices once; ZeRO-3 gathers twice and reduce-scatters
    once for every micro-batch."""
    share = psi * bytes_per_value * (n - 1) / n
    k = micro_batches
    return {"none": 2, "gradients": k + 1, "parameters": 3 * k}[mode] * share


def six_times_ddp(psi=1e9, n=8):
    """Exercise 2: the smallest K at which ZeRO-3 sends 6 times what DDP sends (3K/2 = 6)."""
    ddp = accumulated_bytes("none", psi, n, 1)
    return next(k for k in range(1, 100) if accumulated_bytes("parameters", psi, n, k) >= 6 * ddp)


if __name__ == "__main__":
    print(f"ZeRO-3 / DDP bytes sent: "
          f"{ring_bytes('parameters', 1e9, 8) / ring_bytes('none', 1e9, 8):.2f}")
    for k in (1, 2, 4, 8):
        row = {m: accumulated_bytes(m, 1e9, 8, k) / 1e9 for m in ("none", "gradients", "parameters")}
        print(f"K={k}: " + ", ".join(f"{m} {gb:.1f} GB" for m, gb in row.items()))
    print(f"ZeRO-3 sends 6 times what DDP sends from K = {six_times_ddp()}")
