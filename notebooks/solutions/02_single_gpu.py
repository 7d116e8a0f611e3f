"""Solutions to lesson 02's exercise. Run: python notebooks/solutions/02_single_gpu.py [--quick]

1. A model of your choice on one GPU: `train(model=...)` runs _trainup_gpu.py with --device auto (the GPU
   where there is one). On a GPU try model="resnet18"; the tests run the CNN on the CPU to stay quick.
"""
import subprocess
import sys
from pathlib import Path

from lessons import checks, report


def train(name, log_dir, model="cnn", quick=True, extra=()):
    """Exercise 1: one run on the GPU if there is one; checked from its log. Returns the log's path."""
    cmd = [sys.executable, str(report.ROOT / "scripts" / "_trainup_gpu.py"), "--device", "auto", "--model", model,
           "--run-name", name, "--log-dir", str(log_dir), "--checkpoint-dir", str(Path(log_dir) / "ckpt"),
           "--no-progress", *(["--quick"] if quick else []), *map(str, extra)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    checks.learned(name, log_dir=log_dir)
    return Path(log_dir) / f"{name}.jsonl"


if __name__ == "__main__":
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        log = train("exercise_one_gpu", Path(tmp), model="resnet18" if "--resnet" in sys.argv else "cnn",
                    quick="--quick" in sys.argv)
        print(checks.learned("exercise_one_gpu", log_dir=Path(tmp)))
