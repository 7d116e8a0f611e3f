"""Lesson 04c's Ray drill: Ray Train runs the DDP lesson's training in 2 workers on a local Ray
cluster; one worker is killed after the first epoch, Ray restarts both from its last checkpoint,
and the run ends with the parameters of one process (float64). The driver stopped by the stop
signal to its process group exits 75 with a checkpoint Ray recorded, and --resume ends bit for bit
as 2 processes never stopped. Bad input is one sentence; no Ray process outlives a run.

Where Ray is not installed these tests skip and say why, except with TRAINUP_REQUIRE_RAY=1 (the
README's test command), where a missing Ray fails them.
"""

import importlib.util
import json
import os
import re
from types import SimpleNamespace

import pytest

from conftest import (
    ROOT,
    assert_clean_error,
    assert_same_params,
    drill_beside_its_baseline,
    finish_job,
    in_process,
    notebook_or_own,
    start_run,
)
from lessons import checks, launch
from lessons.bylesson import ray_drill
from lessons.log_reader import read_run

if importlib.util.find_spec("ray") is None:
    if os.environ.get("TRAINUP_REQUIRE_RAY") == "1":
        pytest.fail("TRAINUP_REQUIRE_RAY=1 but Ray is not installed in this Python", pytrace=False)
    pytest.skip(
        "Ray is not installed in this Python (pip install 'ray[default,train]==2.60.0')",
        allow_module_level=True,
    )

# Notebook 04c makes this very drill and its one-process run (ray_drill.FLAGS): in a session that
# runs the notebook, these tests check the notebook's (conftest runs this file after the others).
READS_NOTEBOOK = "notebooks/04c_elastic.ipynb"


@pytest.fixture(scope="module")
def killed(tmp_path_factory, request):
    """The Ray drill and the name of its one-process run: the notebook's where this session ran it."""

    def load():
        d = ray_drill.load("ray", ROOT / "logs", ROOT / "checkpoints")
        return d and (d, "ray_one")

    return notebook_or_own(request, READS_NOTEBOOK, load, lambda: own(tmp_path_factory))


def own(tmp_path_factory):
    """The Ray drill and its one-process run, made here."""
    return drill_beside_its_baseline(
        tmp_path_factory.mktemp("ray"),
        ray_drill.FLAGS,
        launch.environment(),
        lambda logs, ckpt: ray_drill.drill("ray", logs, ckpt, quick=True, show=lambda *_: None),
    )


def test_rays_two_workers_survive_a_kill_and_end_like_one_process(killed):
    d, one = killed
    assert d.killed, "the run ended before its first epoch was logged"
    starts = [r for r in ray_drill.elastic.records(d.log) if r["type"] == "ddp"]
    assert [s["world_size"] for s in starts] == [2, 2]  # the first attempt, and Ray's restart
    assert {s["launcher"] for s in starts} == {"ray"}
    assert d.killed not in {r["pid"] for r in starts[1]["ranks"]}  # new processes
    # from a checkpoint Ray kept before the kill, not from the start
    logged = [r for r in ray_drill.elastic.records(d.log) if r["type"] == "epoch"]
    kept = [r["epoch"] for r in logged if r["time"] < d.killed_at]
    assert 2 <= ray_drill.resumed_at(d) <= max(kept) + 1, d.output[-2000:]
    # Ray's state API, read back by the driver: 2 workers per attempt, the killed one dead
    workers = ray_drill.placement(d).query("actor == 'RayTrainWorker'")
    assert len(workers) == 4 and workers.killed.sum() == 1
    assert workers[workers.killed].state.tolist() == ["DEAD"]
    run = read_run(d.log)
    assert run["problems"] == [] and run["summary"]["status"] == "finished"
    assert [e["epoch"] for e in run["epochs"]] == list(range(1, ray_drill.EPOCHS + 1))
    assert all(e["samples"] == ray_drill.SAMPLES for e in run["epochs"])
    worst = checks.same_parameters("ray", one, checkpoint_dir=d.checkpoint_dir)
    assert worst <= checks.FLOAT64_ATOL
    # CheckpointConfig(num_to_keep=2): Ray's own record keeps the last two epochs' checkpoints
    # (a folder of the attempt that died may stay on disk after it: Ray deletes only what it kept)
    folder = ray_drill.storage("ray", d.checkpoint_dir)
    kept = json.loads((folder / "checkpoint_manager_snapshot.json").read_text())
    kept = kept["checkpoint_results"]
    assert [k["metrics"]["epoch"] for k in kept] == [ray_drill.EPOCHS - 1, ray_drill.EPOCHS]
    assert all((folder / k["checkpoint_dir_name"]).is_dir() for k in kept)


def test_no_ray_process_outlives_the_run(killed):
    assert killed[0].left == [], f"processes still running after the run: {killed[0].left}"


# The stop: 1024 samples in global batches of 32, 32 steps an epoch on each of the 2 workers, so
# that a stop asked for once epoch 1 is logged lands inside epoch 2 on a fast machine or a slow one.
STOP_FLAGS = [
    *ray_drill.elastic.FLAGS,
    "--quick",
    "--epochs",
    "3",
    "--train-size",
    "1024",
    "--batch-size",
    "32",
]


def ray_driver(folder, mark, *flags, stop=False):
    """_trainup_ray.py as a learner starts it (python, from the course's folder), every process it
    starts marked for ray_drill.marked; stop: once epoch 1 is logged, the course's stop signal
    (SIGUSR1) to its whole process group, and SIGTERM to it 0.2 s later (a second signal, during
    the stop). Returns its exit status, its output and the processes it started still there
    (ended first where it hung). A start of Ray that missed Ray's own wait on a loaded machine
    runs again once the load falls, as the drill's does."""
    import signal
    import subprocess
    import sys
    import time

    cmd = [sys.executable, str(ROOT / "scripts" / "_trainup_ray.py"), *STOP_FLAGS, "--run-name"]
    cmd += ["stopped", "--log-dir", folder / "logs", "--checkpoint-dir", folder / "checkpoints"]
    log = folder / "logs" / "stopped.jsonl"
    for attempt in range(1, ray_drill.STARTS + 1):
        with open(folder / "driver.out", "w") as out:  # a file: Ray says much
            proc = subprocess.Popen(
                [str(c) for c in [*cmd, *flags]],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=launch.environment({ray_drill.MARK: mark}),
                start_new_session=True,
            )
            deadline = time.monotonic() + ray_drill.START_S + ray_drill.QUIET_S
            asked = not stop
            while proc.poll() is None and time.monotonic() < deadline:
                if not asked and any(r["type"] == "epoch" for r in ray_drill.elastic.records(log)):
                    os.killpg(proc.pid, signal.SIGUSR1)
                    time.sleep(0.2)
                    os.kill(proc.pid, signal.SIGTERM)
                    asked = True
                time.sleep(0.05)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            returncode = proc.wait()
        output = (folder / "driver.out").read_text()
        if returncode in (0, 75) or not ray_drill.late(output) or attempt == ray_drill.STARTS:
            return returncode, output, ray_drill.marked(mark)
        ray_drill.calm()


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """The Ray driver stopped once epoch 1 is logged (ray_driver), then the same command with
    --resume. Beside the first, the run never stopped: 2 processes of lesson 04's DDP script under
    torchrun, which Ray's 2 workers must end equal to, bit for bit."""
    import uuid

    folder, mark = tmp_path_factory.mktemp("ray_stop"), uuid.uuid4().hex
    never = start_run("_trainup_ddp.py", 2, STOP_FLAGS, folder / "never", "never")
    first = ray_driver(folder, mark, stop=True)
    ckpt = folder / "checkpoints" / "stopped.pt"
    kept = ray_drill.storage("stopped", folder / "checkpoints")
    at_stop = torch_load(ckpt) if ckpt.exists() else None  # the tests say what is missing
    snapshot = kept / "checkpoint_manager_snapshot.json"
    record = json.loads(snapshot.read_text()) if snapshot.exists() else None
    last = record and record["checkpoint_results"][-1]["checkpoint_dir_name"]
    copy = kept / str(last) / "stopped.pt"  # Ray deletes it once it keeps two newer ones
    ray_copy = torch_load(copy) if copy.exists() else None
    stop_log = ray_drill.elastic.records(folder / "logs" / "stopped.jsonl")
    resumed = ray_driver(folder, mark, "--resume")
    done = finish_job(never)
    assert done.returncode == 0, done.stderr[-3000:]
    return SimpleNamespace(
        folder=folder,
        first=first,
        at_stop=at_stop,
        kept=kept,
        record=record,
        ray_copy=ray_copy,
        stop_log=stop_log,
        resumed=resumed,
    )


def test_a_stop_signal_to_the_ray_driver_saves_a_checkpoint_ray_records_and_exits_75(stopped):
    returncode, output, left = stopped.first
    assert returncode == 75, output[-4000:]
    assert left == [], f"processes of the stopped run still running: {left}"
    said = [line for line in output.splitlines() if "--resume" in line]
    # the first signal's stop, once: the second changed nothing
    assert len(said) == 1 and said[0].startswith("SIGUSR1: stopped in epoch 2 after step "), said
    position = stopped.at_stop["position"]
    assert position["epoch"] == 2 and 1 <= position["step"] < 32 and stopped.at_stop["epoch"] == 1
    # Ray's own record, as Ray Train keeps them: its last checkpoint is the stop's, and says where
    last = stopped.record["checkpoint_results"][-1]
    assert last["metrics"] == {"stopped_in_epoch": 2, "stopped_after_step": position["step"]}
    assert str(stopped.kept / last["checkpoint_dir_name"]) in said[0]
    copy = stopped.ray_copy["position"]
    assert (copy["epoch"], copy["step"]) == (position["epoch"], position["step"])
    summary = [r for r in stopped.stop_log if r["type"] == "summary"]
    assert [s["status"] for s in summary] == ["stopped"]


def test_resume_goes_on_from_ray_s_checkpoint_and_ends_as_if_never_stopped(stopped):
    returncode, output, left = stopped.resumed
    assert returncode == 0, output[-4000:]
    assert left == [], f"processes of the resumed run still running: {left}"
    assert "resuming at epoch 2 from Ray's last checkpoint" in output
    run = read_run(stopped.folder / "logs" / "stopped.jsonl")  # the stopped run's log, continued
    assert run["problems"] == [], run["problems"]
    records = ray_drill.elastic.records(stopped.folder / "logs" / "stopped.jsonl")
    assert records[: len(stopped.stop_log)] == stopped.stop_log
    statuses = [r["status"] for r in records if r["type"] == "summary"]
    assert statuses == ["stopped", "finished"]
    assert [e["epoch"] for e in run["epochs"]] == [1, 2, 3]
    assert all(e["samples"] == 1024 for e in run["epochs"])
    mine = torch_load(stopped.folder / "checkpoints" / "stopped.pt")["model"]
    never = torch_load(stopped.folder / "never" / "checkpoints" / "never.pt")["model"]
    assert_same_params(mine, never)


def torch_load(path):
    import torch

    return torch.load(path, weights_only=True)


def test_workers_that_do_not_split_the_batch_are_one_sentence_before_ray_starts(capsys, tmp_path):
    import _trainup_ray

    proc = in_process(
        _trainup_ray.main,
        ["--quick", "--ray-workers", "3", "--log-dir", tmp_path, "--checkpoint-dir", tmp_path],
        capsys,
    )
    assert_clean_error(proc, "--batch-size 64", "3 Ray workers")
    assert not (tmp_path / "ray").exists()  # refused before Ray started


def test_ray_s_workers_take_gpus_as_every_job_does(monkeypatch, capsys, tmp_path):
    """--device auto: a GPU for each worker, else the CPU and why (trainup/devices.py); --device
    cuda with too few GPUs is one sentence."""
    from types import SimpleNamespace
    from trainup import UserError, devices
    from trainup.engines import ray_run

    def args(device):
        return SimpleNamespace(
            batch_size=64, ray_workers=2, device=device, log_dir=tmp_path, checkpoint_dir=tmp_path
        )

    monkeypatch.setattr(devices, "gpu_count", lambda: 1)
    assert ray_run.check(args("auto"))[1] == 0
    assert "would need 2 GPUs, one each, and this machine has 1" in capsys.readouterr().err
    with pytest.raises(UserError, match="--ray-workers 2 asks for one GPU each"):
        ray_run.check(args("cuda"))
    monkeypatch.setattr(devices, "gpu_count", lambda: 2)
    assert ray_run.check(args("auto"))[1] == 2 and ray_run.check(args("cpu"))[1] == 0


def test_bad_input_that_fails_in_the_workers_is_the_drivers_one_sentence(tmp_path):
    """--dataset mnist from an empty --data-dir fails in every worker, past what the driver checks
    before Ray starts; --max-failures 0: Ray gives up at once. The terminal shows the driver's
    one sentence and Ray's own lines, no traceback: Ray's reports of the failure (each worker's
    traceback, and the controller's) are kept in logs/<run>.ray_errors, which the sentence names."""
    import subprocess
    import sys

    cmd = [sys.executable, ROOT / "scripts" / "_trainup_ray.py", "--quick", "--epochs", "1"]
    cmd += ["--dataset", "mnist", "--data-dir", tmp_path / "empty", "--max-failures", "0"]
    cmd += ["--no-progress", "--run-name", "bad", "--log-dir", tmp_path / "logs"]
    cmd += ["--checkpoint-dir", tmp_path / "checkpoints"]
    for attempt in range(1, ray_drill.STARTS + 1):
        done = subprocess.run(
            [str(c) for c in cmd],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            env=launch.environment(),
        )
        out = done.stdout + done.stderr
        if not ray_drill.late(out) or attempt == ray_drill.STARTS:
            break
        ray_drill.calm()
    assert done.returncode == 2, out[-4000:]  # bad input, as every script says it (main_guard)
    assert "Traceback" not in out and 'File "' not in out, out[-4000:]
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out[-4000:]
    kept = tmp_path / "logs" / "bad.ray_errors"
    assert re.search(
        r"gave up on the run after 0 restart\(s\) \(--max-failures\): rank \d: "
        r"data folder \S+ does not exist",
        errors[0],
    ), errors[0]
    assert errors[0].endswith(f"(Ray's tracebacks: {kept})"), errors[0]
    aside = kept.read_text()
    assert "Error in training function:" in aside and "[FailurePolicy] RAISE" in aside, aside
    assert aside.count("Traceback (most recent call last):") >= 2, aside  # every worker's


def test_ray_s_reports_of_a_failure_go_aside_and_its_other_lines_show(tmp_path, capsys):
    """What Ray's log monitor hands the driver of a run whose workers failed on bad input (its
    lines, as Ray 2.60 prints them): the worker's traceback and the controller's failure policy
    with the traceback again go to the run's .ray_errors file; Ray's other lines, and what the
    workers print, show as Ray prints them."""
    from ray._private import worker
    from trainup.engines import ray_run

    kept = tmp_path / "bad.ray_errors"
    ray_run.aside(kept)
    trace = [
        "Traceback (most recent call last):",
        '  File "scripts/_trainup_ray.py", line 88, in train_loop',
        "    train_set, test_set = data.load(args)",
        "                          ^^^^^^^^^^^^^^^",
        "trainup.UserError: mnist is not in data; add --download to fetch it",
        "",
    ]
    batches = [
        (7, "RayTrainWorker", False, ["epoch 1: loss 2.2685"]),
        (7, "RayTrainWorker", True, ["Setting up process group for: env:// [rank=0]"]),
        (7, "RayTrainWorker", True, ["Error in training function:", *trace]),
        (8, "TrainController", True, ["[FailurePolicy] RAISE", "  Source: worker group"]),
        (8, "TrainController", True, ["  Error count: 1 (max allowed: 0)"]),
        (
            8,
            "TrainController",
            True,
            [
                "Error: Training failed due to worker errors:",
                "[Rank 0,1 Error Snippet]:",
                "ray.train.WorkerGroupError: Training failed due to worker errors:",
                *trace,
                "Started training worker group of size 2: ",
            ],
        ),
    ]
    try:
        for pid, actor, err, lines in batches:
            worker.global_worker_stdstream_dispatcher.emit(
                dict(pid=pid, ip="127.0.0.1", is_err=err, job="01", actor_name=actor, lines=lines)
            )
    finally:
        worker.global_worker_stdstream_dispatcher.remove_handler("ray_print_logs")
    out, err = capsys.readouterr()
    assert "epoch 1: loss 2.2685" in out
    assert "Setting up process group" in err and "Started training worker group" in err, err
    for words in ("Traceback", "File ", "UserError", "Error in training", "FailurePolicy", "Error"):
        assert words not in err, err
    aside = kept.read_text()
    assert aside.count("Traceback (most recent call last):") == 2, aside
    assert "(TrainController pid=8)   Error count: 1 (max allowed: 0)" in aside, aside
    assert "Started training" not in aside and "Setting up" not in aside, aside


def test_a_run_ray_gave_up_on_is_one_sentence_naming_each_rank():
    from ray.train import WorkerGroupError
    from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError
    from trainup.engines import ray_run

    error = WorkerGroupError(
        "...",
        {
            1: WorkerHealthCheckFailedError(
                "A worker health check failed.\n pid: 7", RuntimeError()
            ),
            0: RuntimeError(
                "Traceback (most recent call last):\n ...\nRuntimeError: Connection reset by peer"
            ),
        },
    )
    assert ray_run.why(error) == (
        "rank 0: another rank is gone (Connection reset by peer); rank 1: its process died"
    )


def test_a_node_that_timed_out_starting_is_ended_and_started_once_more(monkeypatch):
    """Ray waits its own 30 s for a local raylet; past that (a loaded machine) the processes that
    first start began are ended and ray.init runs again. Any other failure is Ray's to say."""
    import subprocess
    import sys

    import psutil
    from trainup import UserError
    from trainup.engines import ray_run

    began, calls = [], []

    def init(**kwargs):
        calls.append(kwargs)
        if len(calls) == 1:  # as Ray's Node: processes started, then the wait given up
            began.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
            raise Exception("The current node timed out during startup. This could happen ...")
        return "started"

    monkeypatch.setattr(ray_run.ray, "init", init)
    monkeypatch.setattr(ray_run.ray, "shutdown", lambda: None)
    assert ray_run.start(dict(num_cpus=2)) == "started" and calls == [dict(num_cpus=2)] * 2
    assert began[0].wait(timeout=10) is not None and not psutil.pid_exists(began[0].pid)

    def late(**kwargs):
        raise Exception("The current node timed out during startup. This could happen ...")

    monkeypatch.setattr(ray_run.ray, "init", late)
    with pytest.raises(UserError, match=f"^Ray's node {ray_run.NODE_LATE} 2 times .* quieter$"):
        ray_run.start({})

    def dashboard_late(**kwargs):  # as Ray's services.start_api_server raises it
        raise Exception(
            "\nThe last 20 lines of session_latest/logs/dashboard.log (it contains the error "
            "message from the dashboard): \n..."
        )

    monkeypatch.setattr(ray_run.ray, "init", dashboard_late)
    with pytest.raises(UserError, match="^Ray's dashboard did not start 2 times .* quieter$"):
        ray_run.start({})

    def dashboard_silent(**kwargs):  # its logs both empty: Ray cannot show their last lines
        raise Exception("Failed to read dashboard.err file: cannot mmap an empty file. It is ...")

    monkeypatch.setattr(ray_run.ray, "init", dashboard_silent)
    with pytest.raises(UserError, match="^Ray's dashboard did not start 2 times .* quieter$"):
        ray_run.start({})

    def other(**kwargs):
        raise Exception("something else")

    monkeypatch.setattr(ray_run.ray, "init", other)
    with pytest.raises(Exception, match="something else"):
        ray_run.start({})


def test_the_words_of_a_late_start_are_rays_own():
    """ray_run and the drill (which cannot import Ray) look for Ray's words in its errors: they
    must be the words of the Ray installed."""
    import inspect

    from ray._private import node, services
    from trainup.engines import ray_run

    assert ray_drill.NODE_LATE == ray_run.NODE_LATE and ray_run.NODE_LATE in inspect.getsource(node)
    assert ray_drill.DASHBOARD_LATE == ray_run.DASHBOARD_LATE
    assert ray_run.DASHBOARD_LATE in inspect.getsource(services)
    assert ray_drill.DASHBOARD_SILENT == ray_run.DASHBOARD_SILENT
    assert ray_run.DASHBOARD_SILENT in inspect.getsource(services)
    assert ray_drill.late(f"Exception: {ray_drill.DASHBOARD_SILENT}: cannot mmap an empty file")


def test_a_node_late_on_a_loaded_machine_runs_again_once_the_load_falls(monkeypatch, tmp_path):
    """Ray's node missing Ray's 30 s (its start failed, twice): the drill waits for the load to
    fall and runs again, up to STARTS runs; then, or on any other failure, the course's sentence."""
    said, tries, waits = [], [], []

    def attempt(cmd, run, log_dir, checkpoint_dir, show, outcomes):
        returncode, output = outcomes.pop(0)
        tries.append(returncode)
        d = ray_drill.Drill(
            log=log_dir / f"{run}.jsonl",
            checkpoint_dir=checkpoint_dir,
            output=output,
            returncode=returncode,
        )
        if returncode == 0:
            d.log.write_text(json.dumps({"type": "ddp"}) + "\n")
        return d

    late = (1, f"Exception: The current node {ray_drill.NODE_LATE}. This could happen ...")
    dashboard = (1, f"Exception: The last 20 lines of dashboard.log {ray_drill.DASHBOARD_LATE}")
    outcomes = [late, dashboard, (0, "")]
    monkeypatch.setattr(ray_drill, "_attempt", lambda *a: attempt(*a, outcomes))
    monkeypatch.setattr(ray_drill, "calm", lambda: waits.append(1) or (12.0, 1.5, 2))
    monkeypatch.setattr(ray_drill, "failed", lambda *a: RuntimeError("exited with status 1"))
    d = ray_drill.drill("r", tmp_path, tmp_path, quick=True, show=said.append)
    assert tries == [1, 1, 0] and d.returncode == 0 and len(waits) == 2
    assert sum("did not start in time" in s and "the run starts again" in s for s in said) == 2

    outcomes[:] = [late] * ray_drill.STARTS
    with pytest.raises(RuntimeError, match="exited with status 1"):
        ray_drill.drill("r", tmp_path, tmp_path, quick=True, show=said.append)
    outcomes[:] = [(1, "Traceback ... ValueError: something else"), (0, "")]
    with pytest.raises(RuntimeError, match="exited with status 1"):
        ray_drill.drill("r", tmp_path, tmp_path, quick=True, show=said.append)
    assert outcomes == [(0, "")]  # not run again


def test_a_run_whose_workers_never_start_is_ended_and_started_once_more(monkeypatch, tmp_path):
    """Ray's own start can stall on a loaded machine: no rank writes its log within the wait, or
    the group started after the kill never comes up. The drill ends that run and starts it once
    more, says so; a second stall is the hang sentence."""
    said, tries = [], []

    def attempt(cmd, run, log_dir, checkpoint_dir, show, outcomes):
        tries.append(run)
        (log_dir / f"{run}.jsonl").unlink(missing_ok=True)  # as each attempt starts afresh
        d = ray_drill.Drill(
            log=log_dir / f"{run}.jsonl",
            checkpoint_dir=checkpoint_dir,
            output="stalled",
            returncode=outcomes.pop(0),
        )
        if d.returncode is not None or wrote:  # a run that started: its ranks wrote their log
            d.log.write_text(json.dumps({"type": "ddp"}) + "\n")
        return d

    wrote = False

    outcomes = [None, 0]
    monkeypatch.setattr(ray_drill, "_attempt", lambda *a: attempt(*a, outcomes))
    d = ray_drill.drill("r", tmp_path, tmp_path, quick=True, show=said.append)
    assert len(tries) == 2 and d.returncode == 0
    assert any("Ray's start stalled" in s and "started once more" in s for s in said)

    outcomes[:] = [None, None]
    with pytest.raises(RuntimeError, match=f"no worker started within {ray_drill.START_S} s"):
        ray_drill.drill("r", tmp_path, tmp_path, quick=True, show=said.append)
    assert len(tries) == 4  # twice, no more

    # a run whose group, started again after the kill, never comes up: its log stops
    wrote, outcomes[:] = True, [None, 0]
    d = ray_drill.drill("r", tmp_path, tmp_path, quick=True, show=said.append)
    assert len(tries) == 6 and d.returncode == 0
    assert any("Ray's restart stalled" in s and "started once more" in s for s in said)


@pytest.mark.fast
@pytest.mark.parametrize("writes, hung", [(6, False), (1, True)])
def test_a_run_is_hung_when_its_log_stops_not_when_it_is_slow(monkeypatch, tmp_path, writes, hung):
    """A slow run whose ranks keep writing records is waited for beyond START_S + QUIET_S in all;
    one whose log stops for QUIET_S is hung: ended, every process of it gone."""
    monkeypatch.setattr(ray_drill, "START_S", 3.0)
    monkeypatch.setattr(ray_drill, "QUIET_S", 1.5)
    log = tmp_path / "r.jsonl"
    job = (
        "import json, time\n"
        f"for epoch in range({writes}):\n"
        "    time.sleep(1.0)\n"
        f"    with open({str(log)!r}, 'a') as f:\n"
        "        f.write(json.dumps(dict(type='epoch', epoch=epoch)) + '\\n')\n"
        f"time.sleep({60 if hung else 0})\n"  # a hung one stays until it is ended
    )
    d = ray_drill._attempt(["-c", job], "r", tmp_path, tmp_path, lambda *_: None)
    assert (d.returncode is None) == hung
    assert len(ray_drill.elastic.records(log)) == writes and d.left == []
