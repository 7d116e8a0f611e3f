"""Solutions to lesson 04's exercises. Run: python notebooks/solutions/04_ddp.py [--quick]"""
import subprocess
import sys
from pathlib import Path

from lessons import checks, launch, report


def several_devices(name, log_dir, nproc=2, quick=True, extra=()):
    """Exercise 1: torchrun --standalone --nproc-per-node N, --device auto (N GPUs where the node
    has them, else N CPU processes: the script decides); checked from the log: finished, learned,
    N processes. Returns the log's 'ddp' record."""
    cmd = launch.TORCHRUN + launch.torchrun_flags(nproc=nproc) + [
        str(report.ROOT / "scripts" / "_trainup_ddp.py"), "--device", "auto", "--run-name", name,
        "--log-dir", str(log_dir), "--checkpoint-dir", str(Path(log_dir) / "ckpt"), "--no-progress",
        *(["--quick"] if quick else []), *map(str, extra)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, env=launch.environment(), timeout=600)
    checks.learned(name, log_dir=log_dir)
    ddp = [r for r in report.read_run(Path(log_dir) / f"{name}.jsonl")["extra"] if r["type"] == "ddp"][-1]
    checks.holds(ddp["world_size"] == nproc and len(ddp["ranks"]) == nproc, f"{nproc} processes ran")
    return ddp


def my_shards(n, world, rank, epoch, seed=0):
    """Exercise 2: DistributedSampler(shuffle=True, drop_last=False) by hand."""
    import torch
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    indices = torch.randperm(n, generator=g).tolist()
    total = -(-n // world) * world  # padded to a multiple of world
    while len(indices) < total:
        indices += indices[:total - len(indices)]
    return indices[rank:total:world]


def check_shards(sizes=(1, 5, 10, 12, 13), worlds=(1, 2, 3, 4), epochs=(0, 1, 2)):
    from torch.utils.data import DistributedSampler
    for n in sizes:
        for world in worlds:
            for rank in range(world):
                for epoch in epochs:
                    s = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=0)
                    s.set_epoch(epoch)
                    assert my_shards(n, world, rank, epoch) == list(s), (n, world, rank, epoch)
    return True


if __name__ == "__main__":
    import tempfile
    print("my_shards matches DistributedSampler:", check_shards())
    with tempfile.TemporaryDirectory() as tmp:
        ddp = several_devices("exercise_ddp", Path(tmp), quick="--quick" in sys.argv)
        print(f"{ddp['world_size']} processes on", sorted({r['device'] for r in ddp['ranks']}))
