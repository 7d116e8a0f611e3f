"""tests/warm_start.py: a job forked from a warm server ends as the same job started fresh does."""
import json
import os
import signal
import subprocess
import sys

import warm_start
from conftest import ROOT, SCRIPTS, assert_clean_error, finish_job

FLAGS = ["--quick", "--device", "cpu", "--no-progress", "--precision", "64", "--dropout", "0",
         "--epochs", "1"]


def command(name, log_dir, *extra):
    return [sys.executable, str(SCRIPTS / "_trainup_gpu.py"), *FLAGS, *extra, "--run-name", name,
            "--log-dir", str(log_dir), "--checkpoint-dir", str(log_dir / "checkpoints")]


def records(log_dir, name, kind):
    lines = (log_dir / f"{name}.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == kind]


def test_a_forked_job_ends_as_a_fresh_interpreter_does(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    forked = warm_start.start(command("forked", tmp_path), env, ROOT)
    assert isinstance(forked, warm_start.Job), "the server did not start (a thread of its own?)"
    fresh = subprocess.run(command("fresh", tmp_path), env=env, cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
    done = finish_job(forked)
    assert done.returncode == fresh.returncode == 0, done.stderr[-2000:] + fresh.stderr[-2000:]
    # every number a run computes, bit for bit; its own process, argv and output
    forked_epoch, fresh_epoch = (records(tmp_path, n, "epoch")[0] for n in ("forked", "fresh"))
    assert (forked_epoch["loss"], forked_epoch["test_loss"]) == (fresh_epoch["loss"],
                                                                 fresh_epoch["test_loss"])
    config = records(tmp_path, "forked", "config")[0]
    assert config["script"] == "_trainup_gpu.py" and config["args"]["run_name"] == "forked"
    assert done.stdout.splitlines()[0].startswith("epoch 1: loss ")
    assert done.stdout.splitlines()[0].split()[:4] == fresh.stdout.splitlines()[0].split()[:4]
    assert forked.pid != os.getpid() and (tmp_path / "checkpoints" / "forked.pt").exists()


def test_torchruns_agent_is_forked_and_its_workers_start_fresh(tmp_path):
    """`python -m torch.distributed.run ... scripts/_trainup_ddp.py`: the agent is a fork (it
    imports torch too), its 2 workers fresh interpreters it starts; the job ends as one started
    fresh does, bit for bit."""
    from lessons import launch
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    jobs = {}
    for name in ("forked", "fresh"):
        cmd = [*launch.TORCHRUN, *launch.torchrun_flags(nproc=2),
               str(SCRIPTS / "_trainup_ddp.py"), *FLAGS, "--run-name", name,
               "--log-dir", str(tmp_path), "--checkpoint-dir", str(tmp_path / "checkpoints")]
        jobs[name] = (warm_start.start(cmd, env, ROOT) if name == "forked" else
                      subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True))
    assert isinstance(jobs["forked"], warm_start.Job)
    done = {name: finish_job(job) for name, job in jobs.items()}
    assert [d.returncode for d in done.values()] == [0, 0], done["forked"].stderr[-3000:]
    ranks = records(tmp_path, "forked", "ddp")[0]["ranks"]
    assert len({r["pid"] for r in ranks} | {jobs["forked"].pid}) == 3  # the agent and 2 workers
    forked, fresh = (records(tmp_path, n, "epoch")[0] for n in ("forked", "fresh"))
    assert (forked["loss"], forked["test_loss"]) == (fresh["loss"], fresh["test_loss"])


def test_start_time_variables_give_a_server_of_their_own(tmp_path):
    """OpenMP reads OMP_NUM_THREADS as torch loads it: a job with its own value is forked from a
    server started with that value, and runs with it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    job = warm_start.start(command("t1", tmp_path), env, ROOT)
    assert isinstance(job, warm_start.Job) and finish_job(job).returncode == 0
    assert records(tmp_path, "t1", "env")[0]["threads"] == 1
    assert [dict(key[1]).get("OMP_NUM_THREADS") for key in warm_start._SERVERS][-1] == "1"


def test_what_a_fork_cannot_take_starts_fresh(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # a test's sitecustomize, run at start-up
    assert warm_start.start(command("x", tmp_path), env, ROOT) is None
    torchrun = ["torchrun", str(SCRIPTS / "_trainup_gpu.py")]
    assert warm_start.start(torchrun, os.environ, ROOT) is None
    off = {**os.environ, "TRAINUP_WARM_START": "0"}
    os.environ["TRAINUP_WARM_START"] = "0"
    try:
        assert warm_start.start(command("x", tmp_path), off, ROOT) is None
    finally:
        del os.environ["TRAINUP_WARM_START"]


def test_a_forked_job_gets_signals_in_its_own_session_and_says_how_it_ended(tmp_path):
    job = warm_start.start(command("long", tmp_path, "--epochs", "50"), dict(os.environ), ROOT)
    assert os.getpgid(job.pid) == job.pid  # a session of its own, as start_new_session makes
    job.stdout.readline()  # it has trained an epoch
    os.killpg(job.pid, signal.SIGKILL)
    assert job.wait(timeout=60) == -signal.SIGKILL
    bad = warm_start.start(command("bad", tmp_path, "--batch-size", "0"), dict(os.environ),
                           ROOT)
    out, err = bad.communicate(timeout=120)
    assert_clean_error(subprocess.CompletedProcess(bad.args, bad.returncode, out, err),
                       "--batch-size")
