"""Spot machines: trainup.spot turns a cloud's preemption notice into the course's stop signal.

The clouds' metadata services answer on their own machines only. lessons.bylesson.elastic.Metadata
stands in for AWS's (IMDSv2: a token first; 404 until the notice, then the instance-action JSON) and
for Google's (Metadata-Flavor: Google; FALSE, then TRUE) on 127.0.0.1, and the watcher is pointed at
it with --metadata-url: that is the only thing simulated. The watcher, its signal to the run's whole
process group, the stop at a step and --resume are the real ones. The run is held still (SIGSTOP)
from the notice until the watcher has signalled (elastic._notice), so that the notice lands mid-run
however fast the machine.

A simulated spot notice loses no step: lesson 01's script, stopped by AWS's notice and resumed on
"the next machine", ends with the parameters, bit for bit, of the same run never stopped (dropout
on: the random states come back too). Google's notice stops both ranks of a torchrun job at one
step with one checkpoint (that such a checkpoint resumes exactly, tests/test_preemption.py shows).
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from conftest import ROOT, assert_clean_error, notebook_or_own
from lessons.bylesson import elastic
from trainup import distributed, preempt

QUIET = dict(show=lambda *_: None)
TORCHRUN = ("torchrun", "--standalone", "--nproc-per-node", "2")
# Notebook 04c makes the AWS drill below (its cell el-spot-drill): in a session that runs the
# notebook, those tests read the notebook's (conftest runs this file after the others).
READS_NOTEBOOK = "notebooks/04c_elastic.ipynb"


def _drill(tmp, cloud, **kw):
    d = elastic.spot_drill(
        "spot",
        cloud=cloud,
        log_dir=str(tmp / "logs"),
        checkpoint_dir=str(tmp / "checkpoints"),
        **QUIET,
        **kw,
    )
    return SimpleNamespace(d=d, logs=tmp / "logs", checkpoints=tmp / "checkpoints")


@pytest.fixture(scope="module")
def aws(tmp_path_factory, request):
    """Lesson 01's script (one process) under the watcher, AWS's notice once it has started, then
    --resume on the next machine; the same run never stopped, alongside. The notebook's drill
    where this session ran it."""

    def load():
        d = elastic.spot_load("spot", ROOT / "logs")
        return d and SimpleNamespace(d=d, logs=ROOT / "logs", checkpoints=ROOT / "checkpoints")

    return notebook_or_own(
        request, READS_NOTEBOOK, load, lambda: _drill(tmp_path_factory.mktemp("spot_aws"), "aws")
    )


@pytest.fixture(scope="module")
def gcp(tmp_path_factory):
    """Lesson 04's DDP script, 2 ranks under torchrun, under the watcher; Google's notice once
    it has started (no resume: tests/test_preemption.py resumes such a stop exactly)."""
    return _drill(
        tmp_path_factory.mktemp("spot_gcp"),
        "gcp",
        launcher=TORCHRUN,
        script="scripts/_trainup_ddp.py",
        flags=[*elastic.SPOT_FLAGS, "--device", "cpu"],
        straight=False,
        resume=False,
    )


def lines(log_dir, name):
    return [json.loads(line) for line in (log_dir / f"{name}.jsonl").read_text().splitlines()]


def test_an_aws_notice_stops_the_run_at_a_step_with_a_checkpoint_and_exit_75(aws):
    d = aws.d
    out = d.outputs["stopped"]
    assert d.stopped == preempt.STOPPED_EXIT, out[-3000:]
    assert re.fullmatch(
        r"notice from aws: terminate at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ; "
        r"sent SIGTERM to process group \d+",
        d.notice,
    ), d.notice
    assert "SIGTERM: stopped in epoch 1 after step" in out, out[-3000:]
    assert "spot: the command stopped with a checkpoint (exit 75)" in out
    assert d.statuses == ["stopped", "finished"]


def test_a_simulated_spot_notice_loses_no_step(aws):
    """The resumed run (the same line with --resume, on a machine with no notice) ends with the
    parameters, bit for bit, of the run never stopped; its epochs' sums are that run's too."""
    d = aws.d
    assert (d.resumed, d.straight) == (0, 0), (
        d.outputs["resumed"][-3000:],
        d.outputs["straight"][-3000:],
    )
    resumed, straight = (
        torch.load(aws.checkpoints / f"{name}.pt", weights_only=True)["model"]
        for name in ("spot", "spot_straight")
    )
    for k in straight:
        assert torch.equal(resumed[k], straight[k]), k
    mine = [r for r in lines(aws.logs, "spot") if r["type"] == "epoch"]
    ref = [r for r in lines(aws.logs, "spot_straight") if r["type"] == "epoch"]
    assert [r["epoch"] for r in mine] == [1, 2]  # epoch 1 logged once, whole
    for a, b in zip(mine, ref):
        assert (a["loss"], a["accuracy"], a["samples"]) == (b["loss"], b["accuracy"], b["samples"])


def test_a_gcp_notice_stops_every_rank_of_a_torchrun_job_at_one_step(gcp):
    """torchrun's agent and both workers get the signal; the ranks stop after one step, rank 0
    saves both ranks' states; torchrun reports the stop as its own failure (1), and the watcher
    says what that means."""
    d = gcp.d
    out = d.outputs["stopped"]
    assert d.notice.startswith("notice from gcp: preempted, the VM stops in 30 s; sent SIGTERM")
    assert d.stopped == 1, out[-3000:]
    assert "SIGTERM: stopped in epoch 1 after step" in out, out[-3000:]
    assert "the command exited 1 after the notice: rank 0's sentence above" in out
    assert d.statuses == ["stopped"]
    position = torch.load(gcp.checkpoints / "spot.pt", weights_only=True)["position"]
    assert (position["epoch"], position["world_size"], len(position["ranks"])) == (1, 2, 2)
    assert f"after step {position['step']};" in out


def test_no_process_of_a_drill_is_left_behind(aws, gcp):
    for drill in (aws.d, gcp.d):
        for out in drill.outputs.values():
            for group in re.findall(r"process group (\d+)", out):
                with pytest.raises(ProcessLookupError):
                    os.killpg(int(group), 0)


# --- The watcher alone, around commands that cost nothing -------------------------------------


def watcher(*flags, **kw):
    return subprocess.run(
        [sys.executable, "-m", "trainup.spot", *flags],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=60,
        **kw,
    )


def closed_url():
    """A local port where nothing listens: a machine with no metadata service."""
    return f"http://127.0.0.1:{distributed.free_port('127.0.0.1')}"


def test_where_no_metadata_service_answers_the_command_runs_unwatched():
    done = watcher(
        "--cloud", "aws", "--metadata-url", closed_url(), "--", "sh", "-c", "echo ran; exit 3"
    )
    assert done.returncode == 3 and done.stdout == "ran\n"
    said = [line for line in done.stderr.splitlines() if "does not answer" in line]
    assert len(said) == 1 and "no notice can stop it" in said[0], done.stderr
    assert "Traceback" not in done.stderr


def test_a_notice_already_there_starts_nothing(tmp_path):
    with elastic.Metadata("gcp") as stand_in:
        stand_in.notice()
        done = watcher(
            "--cloud",
            "gcp",
            "--metadata-url",
            stand_in.url,
            "--",
            "touch",
            str(tmp_path / "started"),
        )
    assert done.returncode == preempt.STOPPED_EXIT, done.stderr
    assert "not started" in done.stderr and not (tmp_path / "started").exists()


def test_a_sigterm_to_the_watcher_reaches_the_commands_whole_group():
    """As a scheduler's SIGTERM (or Ctrl-C) would reach the job without the watcher: the shell
    and the sleep it started both get it; the shell's death by SIGTERM is reported as 143."""
    with elastic.Metadata("aws") as stand_in:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainup.spot",
                "--cloud",
                "aws",
                "--metadata-url",
                stand_in.url,
                "--",
                "sh",
                "-c",
                "sleep 60 & echo $!; wait",
            ],
            cwd=ROOT,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            sleeper = int(proc.stdout.readline())
            said = proc.stderr.readline()  # printed once the watcher forwards signals
            assert "the command is process group" in said, said
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()
    deadline = time.monotonic() + 10  # its parent gone, the sleep is reaped by init
    while os.path.exists(f"/proc/{sleeper}") and time.monotonic() < deadline:
        if "zombie" in open(f"/proc/{sleeper}/status").read().lower():
            break
        time.sleep(0.05)
    alive = (
        os.path.exists(f"/proc/{sleeper}")
        and "zombie" not in open(f"/proc/{sleeper}/status").read().lower()
    )
    assert not alive, "the command's child outlived the signal"


@pytest.mark.parametrize(
    "flags,words",
    [
        (["--cloud", "aws"], ["no command to watch", "after --"]),
        (["--", "true"], ["--cloud"]),
        (["--cloud", "azure", "--", "true"], ["--cloud", "'azure'", "'aws', 'gcp'"]),
        (["--cloud", "aws", "--", "no-such-command-here"], ["'no-such-command-here'", "no such"]),
        (["--cloud", "gcp", "--every", "0", "--", "true"], ["--every", "above 0"]),
        (["--cloud", "gcp", "--metadata-url", "169.254.169.254", "--", "true"], ["http://"]),
        (["--cloud", "aws", "--signal", "KILL", "--", "true"], ["--signal", "'KILL'"]),
    ],
    ids=["no-command", "no-cloud", "unknown-cloud", "no-such-command", "every-0", "url", "signal"],
)
def test_bad_input_is_one_sentence(flags, words):
    assert_clean_error(watcher(*flags), *words)
