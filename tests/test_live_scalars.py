"""A run's TensorBoard scalars are written as it trains (trainup/scalars.py through RunLog), and
the GPU sampler writes each sample as it comes: read while the run goes, and after a run killed
mid-way."""

import json
import os
import signal
import subprocess
import sys
import time

from conftest import SCRIPTS, start_job


def points(folder, tag):
    """The steps of one scalar in a TensorBoard run folder, read as TensorBoard reads it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder)).Reload()
    return [e.step for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


def values(folder, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    return [e.value for e in EventAccumulator(str(folder)).Reload().Scalars(tag)]


def test_the_scalars_grow_while_the_run_trains(tmp_path):
    logs = tmp_path / "logs"
    job = start_job(
        [
            sys.executable,
            str(SCRIPTS / "_trainup_cpu.py"),
            "--quick",
            "--epochs",
            "4",
            "--threads",
            "1",
            "--train-size",
            "512",
            "--test-size",
            "64",
            "--no-progress",
            "--log-dir",
            str(logs),
            "--run-name",
            "live",
            "--lr",
            "0.5",
            "--gamma",
            "0.5",
        ],
        env=os.environ,
    )
    folder, seen_running = logs / "tensorboard" / "live", []
    while job.poll() is None:
        if folder.is_dir():
            steps = points(folder, "train/loss")
            if steps and job.poll() is None:
                seen_running.append(steps)
        time.sleep(0.1)
    assert job.returncode == 0, job.stderr.read()[-2000:]
    # epochs read while it still trained
    assert seen_running and len(seen_running[0]) < 4, seen_running
    assert points(folder, "train/loss") == [1, 2, 3, 4] and points(folder, "test/accuracy") == [
        1,
        2,
        3,
        4,
    ]
    assert points(folder, "train/samples_per_s") == [1, 2, 3, 4]
    # the learning rate each epoch's steps used: StepLR halves it after every epoch
    assert values(folder, "train/lr") == [0.5, 0.25, 0.125, 0.0625]
    epochs = [json.loads(line) for line in (logs / "live.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in epochs if r["type"] == "epoch"] == [0.5, 0.25, 0.125, 0.0625]


KILLED = """
import sys, time
from argparse import Namespace
sys.path.insert(0, sys.argv[1])
from trainup import gpumon, metrics
log = metrics.RunLog(Namespace(run_name="killed", log_dir=sys.argv[2], lesson="gpu", resume=False),
                     "_trainup_gpu.py", "cuda:0")
n = iter(range(10**6))
gpumon.start(log.write, "cuda", source=lambda: [dict(gpu=0, utilization_pct=float(next(n)),
             memory_used_mb=5.0, memory_total_mb=10.0)], interval=0.05)
time.sleep(0.6)
print("sampling", flush=True)
time.sleep(600)
"""


def test_a_killed_run_keeps_the_samples_taken_before(tmp_path):
    """A fake GPU read every 50 ms through a real RunLog; the process is killed (SIGKILL: no
    handler, no stop()): its log and its TensorBoard scalars already hold the samples."""
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED, str(SCRIPTS), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "sampling\n"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    records = [json.loads(line) for line in (tmp_path / "killed.jsonl").read_text().splitlines()]
    gpu = [r for r in records if r["type"] == "gpu"]
    assert len(gpu) >= 5 and [r["utilization_pct"] for r in gpu] == [
        float(i) for i in range(len(gpu))
    ]
    # it never ended: what it kept, it wrote as it went
    assert "summary" not in {r["type"] for r in records}
    assert len(points(tmp_path / "tensorboard" / "killed", "gpu0/utilization_pct")) >= 5
