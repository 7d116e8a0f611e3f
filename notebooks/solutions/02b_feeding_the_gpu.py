"""Solution to lesson 02b's exercise. Run: python notebooks/solutions/02b_feeding_the_gpu.py [LOG]

1. A dashboard of GPU use and training statistics, from a run's log alone:
   `dashboard(log_path, png)`. LOG: a run's log; by default the CPU baseline that lessons 02 and 02b
   read (logs/gpu_cpu.jsonl).
"""
import sys
from pathlib import Path

from lessons import report


def dashboard(log_path, png):
    """Exercise 1: loss and accuracy per epoch, throughput per epoch, and GPU utilisation and memory over
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
    log = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(report.LOG_DIR) / "gpu_cpu.jsonl"
    with tempfile.TemporaryDirectory() as tmp:
        fig = dashboard(log, Path(tmp) / "dashboard.png")
        print(f"dashboard of {log.name} drawn: {len(fig.axes)} axes")
