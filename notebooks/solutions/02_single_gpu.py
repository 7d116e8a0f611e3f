"""Solutions to lesson 02's exercises. Run: python notebooks/solutions/02_single_gpu.py [--quick]

1. A model of your choice on one GPU: `train(model=...)` runs _trainup_gpu.py with --device auto (the GPU
   where there is one). On a GPU try model="resnet18"; the tests run the CNN on the CPU to stay quick.
2. A dashboard of GPU use and training statistics, from a run's log alone: `dashboard(log_path, png)`.
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


def dashboard(log_path, png):
    """Exercise 2: loss and accuracy per epoch, throughput per epoch, and GPU utilisation and memory over
    time (when the run sampled a GPU), in one figure saved to png. Returns the figure."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    run = report.read_run(log_path)
    epochs = pd.DataFrame(run["epochs"])
    gpu = pd.DataFrame([r for r in run["extra"] if r.get("type") == "gpu"])
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot(epochs["epoch"], epochs["loss"], "o-", label="training loss")
    twin = axes[0].twinx()
    twin.plot(epochs["epoch"], epochs["test_accuracy"], "s--", color="tab:green", label="test accuracy")
    axes[0].set(title="Training", xlabel="epoch", ylabel="loss")
    twin.set(ylabel="test accuracy", ylim=(0, 1))
    axes[1].bar(epochs["epoch"].astype(str), epochs["samples_per_s"])
    axes[1].set(title="Throughput", xlabel="epoch", ylabel="samples/s")
    if len(gpu):
        for index, g in gpu.groupby("gpu"):
            axes[2].plot(g["elapsed_s"], g["utilization_pct"], label=f"GPU {index} utilisation %")
            axes[2].plot(g["elapsed_s"], 100 * g["memory_used_mb"] / g["memory_total_mb"], "--",
                         label=f"GPU {index} memory %")
        axes[2].set(title="GPU use", xlabel="seconds", ylabel="%", ylim=(0, 105))
        axes[2].legend(fontsize="small")
    else:
        axes[2].text(0.5, 0.5, f"ran on {(run['env'] or {}).get('device')}:\nno GPU samples", ha="center", va="center")
        axes[2].set(title="GPU use", xticks=[], yticks=[])
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(f"{(run['config'] or {}).get('run')}: {len(epochs)} epochs, test accuracy "
                 f"{run['summary']['test_accuracy']:.0%}")
    fig.tight_layout()
    fig.savefig(png, dpi=80)
    plt.close(fig)
    return fig


if __name__ == "__main__":
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        log = train("exercise_one_gpu", Path(tmp), model="resnet18" if "--resnet" in sys.argv else "cnn",
                    quick="--quick" in sys.argv)
        dashboard(log, Path(tmp) / "dashboard.png")
        print(checks.learned("exercise_one_gpu", log_dir=Path(tmp)), f"dashboard drawn from {log.name}")
