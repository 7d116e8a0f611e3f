"""Solutions to lesson 01's exercises. Run: python notebooks/solutions/01_cpu_baseline.py [--quick]

Both read logs, so they work on the runs the notebook made (logs/cpu_t1...) or on new ones.
"""
import sys
from pathlib import Path

from lessons import checks, claims, report


def compare_dropout(a, b, log_dir):
    """Exercise 1: which of two runs learned more in its epochs, from their logs; a sentence."""
    runs = report.load_runs([a, b], log_dir).set_index("run")
    for name in (a, b):
        checks.learned(name, log_dir=log_dir)
    acc = runs["test_accuracy"]
    better = a if acc[a] > acc[b] else b
    epochs = report.load_epochs([a, b], log_dir)
    # a seeded run's loss is exact, not a noisy timing: one run decides its direction (noise=0)
    curves = [claims.curve(g["epoch"], g["loss"], f"{run}'s loss", "epochs", digits=3, noise=0)
              for run, g in epochs.groupby("run")]
    return (" ".join(curves) + f" {better} reached the higher test accuracy "
            f"({acc[a]:.0%} for {a}, {acc[b]:.0%} for {b}).")


def threads_sentence(one, two, log_dir):
    """Exercise 2: how much faster two threads were per epoch, and whether the machine was loaded."""
    runs = report.load_runs([one, two], log_dir).set_index("run")
    t1, t2 = runs.loc[one, "epoch_s"], runs.loc[two, "epoch_s"]
    # time per epoch: smaller is faster, so compare rates (1 / seconds)
    return (f"Two threads took {t2:.2f} s an epoch against {t1:.2f} s for one: "
            f"{claims.compare(1 / t2, 1 / t1, 'one thread')}. {claims.load_note()}")


def run_all(log_dir, quick=True):
    extra = ["--quick", "--train-size", "256", "--test-size", "256"] if quick else []
    args = lambda *a: [*a, *extra, "--log-dir", str(log_dir), "--checkpoint-dir", str(Path(log_dir) / "ckpt")]
    import subprocess
    for name, flags in (("ex_t1", ["--threads", "1"]), ("ex_t2", ["--threads", "2"]),
                        ("ex_nodropout", ["--threads", "1", "--dropout", "0"])):
        subprocess.run([sys.executable, str(report.ROOT / "scripts" / "_trainup_cpu.py"), *args(*flags),
                        "--run-name", name, "--no-progress"], check=True, capture_output=True)
    return compare_dropout("ex_nodropout", "ex_t1", log_dir), threads_sentence("ex_t1", "ex_t2", log_dir)


if __name__ == "__main__":
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        print("\n".join(run_all(Path(tmp), quick="--quick" in sys.argv)))
