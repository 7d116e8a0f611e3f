"""Faults, round three: stops that keep the run, through the scripts and launchers as a learner
(or a scheduler) starts them. The signals are sent from inside the job, by conftest's
sitecustomize.py put first on PYTHONPATH (stop_site), so a stop lands at a known step anywhere.
"""

import os
import sys
from pathlib import Path

import torch

from conftest import SCRIPTS, STOP_TINY, alive, finish_job, start_job, stop_at, stop_site
from trainup import preempt


def site(folder, **env):
    return {**os.environ, **stop_site(folder, **env)}


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


def params(path):
    return torch.load(path, weights_only=True)["model"]


def test_ddp_tuned_stopped_during_warm_up_resumes_to_the_parameters_of_a_run_never_stopped(
    tmp_path,
):
    """--warmup-steps 6, SIGTERM after step 3: the resumed run makes its warm-up afresh, which sets
    the warm-up's first rate on the optimizer; it must go on with the rate the stop saved."""
    log_dir, env = tmp_path / "logs", site(tmp_path / "site")
    flags = [
        *STOP_TINY,
        "--device",
        "cpu",
        "--optimizer",
        "sgd",
        "--lr",
        "0.08",
        "--warmup-steps",
        "6",
    ]
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
            env={**env, **stop_at(0, 3)},
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
        while time.time() < deadline and [p for p in tree if alive(p)]:
            time.sleep(0.5)
        left = [Path(f"/proc/{p}/cmdline").read_text() for p in tree if alive(p)]
        assert not left, left
    finally:  # whatever outlived the test
        for p in tree + descendants(job.pid):
            kill_tree(p)
        job.kill()


def test_a_collective_that_waits_past_timeout_for_a_stalled_rank_is_one_sentence(tmp_path):
    """--timeout 5 and rank 1 stalled after step 3: rank 0's next collective gives up; it says so
    in one sentence (gloo's RuntimeError is a traceback) and exits 1, and torchrun ends the job."""
    from lessons import launch

    log_dir = tmp_path / "logs"
    cmd = [
        *launch.TORCHRUN,
        *launch.torchrun_flags(nproc=2),
        str(SCRIPTS / "_trainup_ddp.py"),
        *STOP_TINY,
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
    env = stop_site(tmp_path / "site", TRAINUP_TEST_STALL_AT="3")  # rank 1 stalls after step 3
    done = finish_job(start_job(cmd, launch.environment(env)))
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "a collective waited --timeout for another rank of this job" in out, out[-3000:]
    assert "[rank0]: Traceback" not in out and "[rank0]:RuntimeError" not in out, out[-3000:]


def test_ddp_stopped_in_an_epochs_last_step_or_its_evaluation_stops_after_that_epoch(tmp_path):
    """Rank 1 takes USR1 in epoch 1's last step (8 of 8): it posts "stop after step 9", which
    that epoch does not have, so the ranks must agree on the stop after the epoch, where it was
    lost and the run trained on to its end; and SIGTERM to every rank as its evaluation starts.
    Both stop right after epoch 1's checkpoint, exit 75 on both ranks, and resume to the
    parameters of a run never stopped."""
    from conftest import torchrun_exit_codes
    from lessons import launch

    log_dir = tmp_path / "logs"
    ckpts = log_dir / "checkpoints"

    def torchrun(name, *extra, **env):
        cmd = [*launch.TORCHRUN, *launch.torchrun_flags(nproc=2), SCRIPTS / "_trainup_ddp.py"]
        cmd += [*STOP_TINY, "--device", "cpu", "--run-name", name, "--log-dir", log_dir]
        cmd += ["--checkpoint-dir", ckpts, *extra]
        return start_job([str(c) for c in cmd], launch.environment(stop_site(tmp_path, **env)))

    straight = torchrun("straight")
    stops = {
        "last_step": stop_at(1, 8, "USR1", "self"),
        "in_eval": {"TRAINUP_TEST_SIGTERM_IN_EVAL": "1"},
    }
    stopped = {name: finish_job(torchrun(name, **env)) for name, env in stops.items()}
    for name, said in (("last_step", "a signal on another rank"), ("in_eval", "SIGTERM")):
        s = stopped[name]
        out = s.stdout + s.stderr
        assert f"{said}: stopped after epoch 1;" in s.stdout, out[-3000:]
        assert torchrun_exit_codes(s) == {0: preempt.STOPPED_EXIT, 1: preempt.STOPPED_EXIT}, out
        position = torch.load(ckpts / f"{name}.pt", weights_only=True)["position"]
        assert (position["epoch"], position["step"]) == (2, 0), position
    resumed = {name: torchrun(name, "--resume") for name in stops}
    assert finish_job(straight).returncode == 0
    never = params(ckpts / "straight.pt")
    for name, job in resumed.items():
        done = finish_job(job)
        assert done.returncode == 0, done.stderr[-3000:]
        mine = params(ckpts / f"{name}.pt")
        for k in never:
            assert torch.equal(mine[k], never[k]), (name, k)
