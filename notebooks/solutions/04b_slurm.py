"""Solutions to lesson 04b's exercises. Run: python notebooks/solutions/04b_slurm.py"""
import re
import tempfile
from pathlib import Path

from lessons.bylesson import slurm


def two_by_two(folder, tasks_per_node=2):
    """Exercise 1: slurm/1node_4gpu.sbatch turned into 2 nodes x 2 GPUs, 16 cores each; returns the path."""
    text = (slurm.TEMPLATES / "1node_4gpu.sbatch").read_text()
    text = re.sub(r"^# node: .*$", "# node: 2 GPUs, 16 CPU cores", text, count=1, flags=re.M)
    for option, value in (("nodes", 2), ("gres", "gpu:2"), ("ntasks-per-node", tasks_per_node),
                          ("cpus-per-task", 8), ("job-name", "trainup-2n2g")):
        text = re.sub(rf"^#SBATCH --{option}=\S+", f"#SBATCH --{option}={value}", text, flags=re.M)
    path = Path(folder) / f"2node_2gpu_{tasks_per_node}tasks.sbatch"
    path.write_text(text)
    return path


def amdahl(published):
    """Exercise 2: the serial share s from the 4-GPU speed-up, its prediction for the largest run, and
    what was published there."""
    four = published[published["gpus"] == 4].iloc[0]
    s4 = four["speedup"]
    n = 4
    serial = (n / s4 - 1) / (n - 1)  # from s4 = 1 / (s + (1 - s) / n)
    big = published.sort_values("gpus").iloc[-1]
    predicted = 1 / (serial + (1 - serial) / big["gpus"])
    return dict(serial_share=serial, gpus=int(big["gpus"]), predicted_speedup=predicted,
                published_speedup=float(big["speedup"]))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        good = two_by_two(tmp)
        sentence, problems = slurm.check_counts(good)
        print(sentence, "->", problems or "consistent")
        bad = two_by_two(tmp, tasks_per_node=3)
        print(slurm.check_counts(bad))
    a = amdahl(slurm.published_scaling())
    gap = (a["published_speedup"] - a["predicted_speedup"]) / a["predicted_speedup"]
    verdict = ("a fixed serial share explains it" if abs(gap) < 0.1 else
               "it scaled WORSE than a fixed serial share predicts: a cost that grows with N (communication "
               "between nodes)" if gap < 0 else
               "it scaled BETTER than a fixed serial share predicts: the 4-GPU run paid a cost the large run "
               "did not (input pipeline, a per-node cost spread over more work): Amdahl with one number is too simple here")
    print(f"Amdahl from 4 GPUs: serial share {a['serial_share']:.3f}, predicts {a['predicted_speedup']:.1f}x on "
          f"{a['gpus']} GPUs; published {a['published_speedup']:.1f}x: {verdict}.")
    return a, verdict

if __name__ == "__main__":
    main()
