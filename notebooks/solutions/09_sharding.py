"""Solutions to lesson 09's exercises. Run: python notebooks/solutions/09_sharding.py"""
import json
import subprocess
import sys
from pathlib import Path

from trainup.parallel.sharding import MIXED_ADAM, STAGES, expected

ROOT = Path(__file__).resolve().parents[2]


def largest_model(memory_gb, n, per_param=MIXED_ADAM):
    """Exercise 1: Ψ (parameters) whose model states fit memory_gb per device, by --shard mode, on n devices."""
    return {mode: memory_gb * 1e9 / sum(expected(mode, 1, n, per_param)) for mode in STAGES}


def zero1_imbalance(log_dir, name="ex09_z1", nproc=4, blocks=8, width=512):
    """Exercise 2: run ZeRO-1 at nproc processes on a wider model; the largest rank's Adam state against an even share."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "scripts/_trainup_fsdp.py", "--quick", "--shard", "optimizer", "--blocks", str(blocks), "--width", str(width),
           "--epochs", "1", "--train-size", "64", "--test-size", "64", "--batch-size", "16", "--no-progress",
           "--run-name", name, "--log-dir", str(log_dir), "--checkpoint-dir", str(Path(log_dir) / "checkpoints")]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, env={"OMP_NUM_THREADS": "1", **__import__("os").environ})
    record = [json.loads(line) for line in open(Path(log_dir) / f"{name}.jsonl") if '"shard_memory"' in line][-1]
    even = 8 * record["parameters"] / nproc
    # the stem (784 x width) is the largest tensor: the rank that holds its state holds the most
    return max(record["optim_bytes"]) / even


if __name__ == "__main__":
    for mode, psi in largest_model(24, 8).items():
        print(f"{mode:>10}: {psi / 1e9:.1f} billion parameters fit in 24 GB x 8 (model states only)")
    if "--run" in sys.argv:
        print(f"ZeRO-1's largest rank: {zero1_imbalance(ROOT / 'logs'):.2f}x an even share")
