"""Faults, round three: stops that keep the run, through the scripts and launchers as a learner
(or a scheduler) starts them. The signals are sent from inside the job, by a sitecustomize.py put
first on PYTHONPATH (as tests/test_preemption.py does), so a stop lands at a known step anywhere.
"""

import os
import sys
from pathlib import Path

import torch

from conftest import SCRIPTS, finish_job, start_job
from trainup import preempt

TINY = [
    "--quick",
    "--train-size",
    "256",
    "--test-size",
    "64",
    "--batch-size",
    "32",
    "--epochs",
    "2",
    "--no-progress",
]

# TRAINUP_TEST_SIGTERM_AT=STEP: after the optimizer's STEP-th step this process gets SIGTERM.
# TRAINUP_TEST_TWICE=STEP: after the optimizer's STEP-th step this process gets SIGTERM, a second
# one 0.1 s later, and a third as the interpreter shuts down (atexit): the moment the stop has
# handed the caller's handlers back, where a second SIGTERM's default action ended the run -15.
_SITE = """import atexit, os, signal, subprocess, sys
_at = os.environ.get("TRAINUP_TEST_TWICE") or os.environ.get("TRAINUP_TEST_SIGTERM_AT")
if _at:
    def _hook(event, args, done=[0]):
        if done[0] or event != "import" or "torch.optim.optimizer" not in sys.modules:
            return
        done[0] = 1
        from torch.optim.optimizer import register_optimizer_step_post_hook
        steps = [0]
        def count(opt, a, kw):
            steps[0] += 1
            if steps[0] == int(_at) and not os.environ.get("TRAINUP_TEST_TWICE"):
                os.kill(os.getpid(), signal.SIGTERM)
            elif steps[0] == int(_at):
                me = os.getpid()
                subprocess.Popen(["sh", "-c", f"kill -TERM {me}; sleep 0.1; kill -TERM {me}"])
                def again():
                    os.kill(me, signal.SIGTERM)
                    __import__("time").sleep(0.2)
                atexit.register(again)
        register_optimizer_step_post_hook(count)
    sys.addaudithook(_hook)
"""


def site(folder, **env):
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_SITE)
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    return {
        **os.environ,
        "PYTHONPATH": path,
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        **env,
    }


def python(script, *flags, log_dir, env):
    return start_job(
        [
            sys.executable,
            str(SCRIPTS / script),
            *map(str, flags),
            "--log-dir",
            str(log_dir),
            "--checkpoint-dir",
            str(log_dir / "checkpoints"),
        ],
        env,
    )


def test_a_second_sigterm_during_the_stop_changes_nothing(tmp_path):
    log_dir = tmp_path / "logs"
    done = finish_job(
        python(
            "_trainup_cpu.py",
            *TINY,
            "--run-name",
            "twice",
            log_dir=log_dir,
            env=site(tmp_path / "site", TRAINUP_TEST_TWICE="3"),
        )
    )
    assert done.returncode == preempt.STOPPED_EXIT, (done.returncode, done.stderr[-3000:])
    assert "SIGTERM: stopped in epoch 1 after step" in done.stdout and not done.stderr
    saved = torch.load(log_dir / "checkpoints" / "twice.pt", weights_only=True)
    assert saved["position"]["epoch"] == 1 and saved["position"]["step"] >= 3


def params(path):
    return torch.load(path, weights_only=True)["model"]


def epochs(log):
    import json

    records = map(json.loads, log.read_text().splitlines())
    return [
        (r["epoch"], r["loss"], r["accuracy"], r["samples"])
        for r in records
        if r["type"] == "epoch"
    ]


def test_lightning_stopped_inside_an_epoch_resumes_to_the_parameters_of_a_run_never_stopped(
    tmp_path,
):
    """SIGTERM after step 11 (step 3 of epoch 2), dropout on: Lightning resumes inside the epoch
    from the step it stopped after, with the random states of the stop, and the course's log line
    of that epoch covers all of it."""
    log_dir, env = tmp_path / "logs", site(tmp_path / "site")
    flags = [*TINY, "--accelerator", "cpu"]
    straight = python(
        "_trainup_lightning.py", *flags, "--run-name", "straight", log_dir=log_dir, env=env
    )
    stopped = finish_job(
        python(
            "_trainup_lightning.py",
            *flags,
            "--run-name",
            "s",
            log_dir=log_dir,
            env={**env, "TRAINUP_TEST_SIGTERM_AT": "11"},
        )
    )
    assert stopped.returncode == preempt.STOPPED_EXIT, stopped.stderr[-3000:]
    assert "stopped by SIGTERM at epoch 2, step 11" in stopped.stderr
    resumed = finish_job(
        python(
            "_trainup_lightning.py", *flags, "--run-name", "s", "--resume", log_dir=log_dir, env=env
        )
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert finish_job(straight).returncode == 0
    ckpts = log_dir / "checkpoints"
    mine, never = params(ckpts / "s.pt"), params(ckpts / "straight.pt")
    for k in never:
        assert torch.equal(mine[k], never[k]), k
    assert epochs(log_dir / "s.jsonl") == epochs(log_dir / "straight.jsonl")


def test_ddp_tuned_stopped_during_warm_up_resumes_to_the_parameters_of_a_run_never_stopped(
    tmp_path,
):
    """--warmup-steps 6, SIGTERM after step 3: the resumed run makes its warm-up afresh, which sets
    the warm-up's first rate on the optimizer; it must go on with the rate the stop saved."""
    log_dir, env = tmp_path / "logs", site(tmp_path / "site")
    flags = [*TINY, "--device", "cpu", "--optimizer", "sgd", "--lr", "0.08", "--warmup-steps", "6"]
    straight = python(
        "_trainup_ddp_tuned.py", *flags, "--run-name", "straight", log_dir=log_dir, env=env
    )
    stopped = finish_job(
        python(
            "_trainup_ddp_tuned.py",
            *flags,
            "--run-name",
            "s",
            log_dir=log_dir,
            env={**env, "TRAINUP_TEST_SIGTERM_AT": "3"},
        )
    )
    assert stopped.returncode == preempt.STOPPED_EXIT, stopped.stderr[-3000:]
    at_stop = torch.load(log_dir / "checkpoints" / "s.pt", weights_only=True)["position"]
    assert at_stop["step"] == 3 and at_stop["extra"]["warmup"]["last_epoch"] == 3  # in warm-up
    resumed = finish_job(
        python(
            "_trainup_ddp_tuned.py", *flags, "--run-name", "s", "--resume", log_dir=log_dir, env=env
        )
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert finish_job(straight).returncode == 0
    ckpts = log_dir / "checkpoints"
    mine, never = params(ckpts / "s.pt"), params(ckpts / "straight.pt")
    for k in never:
        assert torch.equal(mine[k], never[k]), k


def test_loader_workers_and_their_helpers_end_when_the_main_process_is_killed(tmp_path):
    """SIGKILL to _trainup_gpu.py --workers 2 once it trains: its loader workers (children of the
    fork server, which lives while they hold its pipe), the fork server and the resource tracker
    all end."""
    import time
    from conftest import descendants, kill_tree

    log = tmp_path / "logs" / "k.jsonl"
    job = python(
        "_trainup_gpu.py",
        "--quick",
        "--train-size",
        "64",
        "--test-size",
        "64",
        "--batch-size",
        "16",
        "--epochs",
        "1000",
        "--device",
        "cpu",
        "--workers",
        "2",
        "--no-progress",
        "--run-name",
        "k",
        log_dir=tmp_path / "logs",
        env=site(tmp_path / "site"),
    )
    tree = []
    try:
        deadline = time.time() + 240
        while (
            time.time() < deadline
            and job.poll() is None
            and '"type": "epoch"' not in (log.read_text() if log.exists() else "")
        ):
            time.sleep(0.2)
        tree = descendants(job.pid)
        assert len(tree) >= 4, tree  # the resource tracker, the fork server, 2 workers at least
        job.kill()
        job.wait(timeout=60)  # not communicate(): a worker left alive holds its pipes open
        deadline = time.time() + 60
        while time.time() < deadline and [p for p in tree if _alive(p)]:
            time.sleep(0.5)
        left = [Path(f"/proc/{p}/cmdline").read_text() for p in tree if _alive(p)]
        assert not left, left
    finally:  # whatever outlived the test
        for p in tree + descendants(job.pid):
            kill_tree(p)
        job.kill()


def _alive(pid):
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False


# Rank 0, after its STEP-th optimizer step, sends SIGUSR1 to torchrun's whole process group, as
# `scancel --signal=USR1` reaches every process of a job step.
_GROUP_USR1 = """import os, sys
_at = os.environ.get("TRAINUP_TEST_GROUP_USR1_AT")
if _at and os.environ.get("RANK") == "0":
    def _hook(event, args, done=[0]):
        if done[0] or event != "import" or "torch.optim.optimizer" not in sys.modules:
            return
        done[0] = 1
        from torch.optim.optimizer import register_optimizer_step_post_hook
        steps = [0]
        def count(opt, a, kw):
            steps[0] += 1
            if steps[0] == int(_at):
                import subprocess
                subprocess.run(["kill", "-USR1", "--", f"-{os.getpgid(os.getppid())}"])
        register_optimizer_step_post_hook(count)
    sys.addaudithook(_hook)
"""


def test_sigusr1_to_torchruns_group_stops_every_rank_with_a_checkpoint(tmp_path):
    """The course's default --stop-signal, to torchrun and its 2 ranks: torchrun (started with the
    course's environment, launch.environment) passes it on instead of dying of it, and the ranks
    stop together after one step with a checkpoint of the job."""
    import json
    from lessons import launch

    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(_GROUP_USR1)
    log_dir = tmp_path / "logs"
    cmd = [
        *launch.TORCHRUN,
        *launch.torchrun_flags(nproc=2),
        str(SCRIPTS / "_trainup_ddp.py"),
        *TINY,
        "--device",
        "cpu",
        "--run-name",
        "u",
        "--log-dir",
        str(log_dir),
        "--checkpoint-dir",
        str(log_dir / "checkpoints"),
    ]
    done = finish_job(
        start_job(
            cmd, launch.environment({"PYTHONPATH": str(folder), "TRAINUP_TEST_GROUP_USR1_AT": "3"})
        )
    )
    assert done.returncode != -10, "torchrun died of SIGUSR1"
    assert "SIGUSR1: stopped in epoch 1 after step" in done.stdout, done.stderr[-3000:]
    assert "torchrun" not in "".join(l for l in done.stderr.splitlines() if l.startswith("error:"))
    position = torch.load(log_dir / "checkpoints" / "u.pt", weights_only=True)["position"]
    assert position["world_size"] == 2 and len(position["ranks"]) == 2
    records = [json.loads(line) for line in (log_dir / "u.jsonl").read_text().splitlines()]
    summaries = [r["status"] for r in records if r["type"] == "summary"]
    assert summaries == ["stopped"]


# Rank 1, after its STEP-th optimizer step, stalls (as a hung disk or a stopped process would).
_STALL = """import os, sys, time
_at = os.environ.get("TRAINUP_TEST_STALL_AT")
if _at and os.environ.get("RANK") == "1":
    def _hook(event, args, done=[0]):
        if done[0] or event != "import" or "torch.optim.optimizer" not in sys.modules:
            return
        done[0] = 1
        from torch.optim.optimizer import register_optimizer_step_post_hook
        steps = [0]
        def count(opt, a, kw):
            steps[0] += 1
            if steps[0] == int(_at):
                time.sleep(30)
        register_optimizer_step_post_hook(count)
    sys.addaudithook(_hook)
"""


def test_a_collective_that_waits_past_timeout_for_a_stalled_rank_is_one_sentence(tmp_path):
    """--timeout 5 and rank 1 stalled after step 3: rank 0's next collective gives up; it says so
    in one sentence (gloo's RuntimeError is a traceback) and exits 1, and torchrun ends the job."""
    from lessons import launch

    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(_STALL)
    log_dir = tmp_path / "logs"
    cmd = [
        *launch.TORCHRUN,
        *launch.torchrun_flags(nproc=2),
        str(SCRIPTS / "_trainup_ddp.py"),
        *TINY,
        "--device",
        "cpu",
        "--timeout",
        "5",
        "--run-name",
        "t",
        "--log-dir",
        str(log_dir),
        "--checkpoint-dir",
        str(log_dir / "checkpoints"),
    ]
    env = {"PYTHONPATH": str(folder), "TRAINUP_TEST_STALL_AT": "3"}
    done = finish_job(start_job(cmd, launch.environment(env)))
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "a collective waited --timeout for another rank of this job" in out, out[-3000:]
    assert "[rank0]: Traceback" not in out and "[rank0]:RuntimeError" not in out, out[-3000:]
