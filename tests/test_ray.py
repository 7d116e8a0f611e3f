"""Lesson 04d: Ray Train runs the DDP lesson's training in 2 workers on a local Ray cluster; one
worker is killed after the first epoch, Ray restarts both from its last checkpoint, and the run
ends with the parameters of one process (float64). Bad input is one sentence; no Ray process
outlives the run.

Ray is not in the requirements yet: where it is not installed these tests skip and say why, except
with TRAINUP_REQUIRE_RAY=1, where a missing Ray fails them.
"""
import importlib.util
import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import SCRIPTS, assert_clean_error, finish_job, in_process, start_job
from lessons import checks, elastic, launch
from lessons.log_reader import read_run

if importlib.util.find_spec("ray") is None:
    if os.environ.get("TRAINUP_REQUIRE_RAY") == "1":
        pytest.fail("TRAINUP_REQUIRE_RAY=1 but Ray is not installed in this Python",
                    pytrace=False)
    pytest.skip("Ray is not installed in this Python (pip install 'ray[default,train]==2.60.0')",
                allow_module_level=True)

# elastic.FLAGS (float64, no dropout: equal to one process at float64's tolerance), shorter: the
# kill after the first epoch still lands mid-run, and most of the test is Ray starting.
EPOCHS, SAMPLES = 4, 512
FLAGS = [*elastic.FLAGS, "--quick", "--epochs", str(EPOCHS), "--train-size", str(SAMPLES)]
MARK = "TRAINUP_TEST_RAY_MARK"  # inherited by every process Ray starts: how the test finds them
WAIT_S = 240  # far beyond a healthy run: reaching it means the run hung


def command(script, name, folder, *extra):
    return [sys.executable, str(SCRIPTS / script), *FLAGS, *extra, "--run-name", name,
            "--log-dir", str(folder / "logs"), "--checkpoint-dir", str(folder / "checkpoints")]


def records(log, kind):
    """The log's records of one kind, read as the run writes (its last line may be half there)."""
    found = []
    for line in log.read_text().splitlines() if log.exists() else []:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record["type"] == kind:
            found.append(record)
    return found


def marked(mark, wait_s=10):
    """The processes whose environment holds MARK=mark (the run's driver and all Ray started), once
    those that are on their way out have had wait_s seconds to go."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for proc in Path("/proc").iterdir():
            try:
                if f"{MARK}={mark}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(int(proc.name))
            except (OSError, ValueError):  # gone, or not ours to read
                pass
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """The Ray run (rank 1 killed once after epoch 1) and a one-process run, side by side."""
    folder, mark = tmp_path_factory.mktemp("ray"), uuid.uuid4().hex
    one = start_job(command("_trainup_ddp.py", "one", folder), launch.environment())
    run = start_job(command("_trainup_ray.py", "ray", folder, "--max-failures", "1"),
                    launch.environment({MARK: mark}))
    log, deadline, pid = folder / "logs" / "ray.jsonl", time.monotonic() + WAIT_S, None
    kept = folder / "checkpoints" / "ray" / "ray" / "checkpoint_manager_snapshot.json"
    while pid is None and time.monotonic() < deadline and run.poll() is None:
        # Ray has kept the first epoch's checkpoint (every rank reported it); the 'ddp' record
        # names the ranks' pids. Killed earlier, the run would start again from nothing.
        if kept.exists() and records(log, "ddp"):
            pid = records(log, "ddp")[0]["ranks"][1]["pid"]
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    done, baseline = finish_job(run), finish_job(one)
    assert baseline.returncode == 0, baseline.stderr[-3000:]
    (folder / "ray.out").write_text(done.stdout + done.stderr)  # for a failure's reader
    return dict(folder=folder, done=done, killed=pid, log=log, left=marked(mark))


def test_rays_two_workers_survive_a_kill_and_end_like_one_process(killed):
    done = killed["done"]
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    assert killed["killed"], "the run ended before its first epoch was logged"
    starts = records(killed["log"], "ddp")
    assert [s["world_size"] for s in starts] == [2, 2]  # the first attempt, and Ray's restart
    assert {s["launcher"] for s in starts} == {"ray"}
    assert killed["killed"] not in {r["pid"] for r in starts[1]["ranks"]}  # new processes
    assert "resuming at epoch" in done.stdout + done.stderr
    # Ray's state API, read back by the driver: 2 workers per attempt, the killed one dead
    shown = [line.split() for line in done.stdout.splitlines()
             if line.startswith("Ray's state API: RayTrainWorker pid")]
    assert len(shown) == 4 and str(killed["killed"]) in {w[5] for w in shown}
    run = read_run(killed["log"])
    assert run["problems"] == [] and run["summary"]["status"] == "finished"
    assert [e["epoch"] for e in run["epochs"]] == list(range(1, EPOCHS + 1))
    assert all(e["samples"] == SAMPLES for e in run["epochs"])
    ckpt = killed["folder"] / "checkpoints"
    worst = checks.same_parameters("ray", "one", checkpoint_dir=ckpt)
    assert worst <= checks.FLOAT64_ATOL
    kept = [p for p in (ckpt / "ray" / "ray").glob("checkpoint_*") if p.is_dir()]
    assert len(kept) == 2  # CheckpointConfig(num_to_keep=2)


def test_no_ray_process_outlives_the_run(killed):
    assert killed["left"] == [], f"processes still running after the run: {killed['left']}"


def test_workers_that_do_not_split_the_batch_are_one_sentence_before_ray_starts(capsys, tmp_path):
    import _trainup_ray
    proc = in_process(_trainup_ray.main, ["--quick", "--ray-workers", "3", "--log-dir", tmp_path,
                                          "--checkpoint-dir", tmp_path], capsys)
    assert_clean_error(proc, "--batch-size 64", "3 Ray workers")
    assert not (tmp_path / "ray").exists()  # refused before Ray started


def test_a_run_ray_gave_up_on_is_one_sentence_naming_each_rank():
    from ray.train import WorkerGroupError
    from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError
    from trainup import ray_run
    error = WorkerGroupError("...", {
        1: WorkerHealthCheckFailedError("A worker health check failed.\n pid: 7", RuntimeError()),
        0: RuntimeError("Traceback (most recent call last):\n ...\nRuntimeError: Connection reset "
                        "by peer")})
    assert ray_run.why(error) == ("rank 0: another rank is gone (Connection reset by peer); "
                                  "rank 1: its process died")
