"""Every job a test starts is what a learner starts: a fresh interpreter, under its real launcher.

A sitecustomize module first on PYTHONPATH runs at the start of every fresh interpreter, and of no
fork of one: each process that runs it writes its pid, its parent's and its argv. The tests start
jobs through conftest's start_job (directly, srun-style Ranks, torchrun); the notebooks through
lessons.jobs.start. Each rank must have started fresh, running the script itself.
"""

import json
import sys

import pytest
from conftest import SCRIPTS, Ranks, finish_job, start_job

from lessons import jobs, launch

pytestmark = pytest.mark.fast

SCRIPT = str(SCRIPTS / "_trainup_ddp.py")
TINY = [
    "--quick",
    "--train-size",
    "64",
    "--test-size",
    "64",
    "--epochs",
    "1",
    "--dropout",
    "0",
    "--device",
    "cpu",
    "--no-progress",
]
SITE = """import json, os, sys
with open(os.environ["FRESH_STARTS"], "a") as f:
    f.write(json.dumps([os.getpid(), os.getppid(), sys.orig_argv]) + "\\n")
"""


def watched(tmp_path):
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(SITE)
    starts = tmp_path / "starts.jsonl"
    env = launch.environment(
        {"PYTHONPATH": f"{folder}:{SCRIPTS}", "FRESH_STARTS": str(starts), "OMP_NUM_THREADS": "1"}
    )
    return env, lambda: [json.loads(line) for line in starts.read_text().splitlines()]


def ran_script(starts):
    """The fresh interpreters whose argv runs the script (not a launcher's or a helper's)."""
    return [s for s in starts if SCRIPT in s[2]]


def test_a_torchrun_job_is_an_agent_and_two_fresh_workers(tmp_path):
    env, starts = watched(tmp_path)
    cmd = (
        launch.TORCHRUN
        + launch.torchrun_flags(nproc=2)
        + [SCRIPT, *TINY, "--log-dir", str(tmp_path), "--checkpoint-dir", str(tmp_path)]
    )
    done = finish_job(start_job(cmd, env))
    assert done.returncode == 0, done.stderr[-3000:]
    agent = [s for s in starts() if "torch.distributed.run" in " ".join(s[2])]
    workers = ran_script(starts())
    assert len(agent) == 1 and len(workers) == 3, starts()  # the agent names the script too
    assert sorted(w[1] for w in workers if w != agent[0]) == [agent[0][0]] * 2, (
        "each worker is a fresh interpreter that torchrun's agent started"
    )


def test_srun_style_ranks_are_fresh_interpreters(tmp_path):
    env, starts = watched(tmp_path)
    cmd = [
        sys.executable,
        SCRIPT,
        *TINY,
        "--log-dir",
        str(tmp_path),
        "--checkpoint-dir",
        str(tmp_path),
    ]
    done = Ranks(cmd, env).finish()
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(ran_script(starts())) == 2, starts()


def test_a_notebooks_job_starts_as_a_fresh_interpreter(tmp_path):
    env, starts = watched(tmp_path)
    proc = jobs.start([sys.executable, "-c", "print('hello')"], env=env)
    assert proc.wait(timeout=60) == 0
    assert [s[2][-2:] for s in starts()] == [["-c", "print('hello')"]]
