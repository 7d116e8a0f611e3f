"""Lesson 04c's Ray drill: Ray Train's 2 workers lose one, and Ray starts them again.

The run (scripts/_trainup_ray.py, --max-failures 1) trains on a local Ray cluster. Once Ray has
kept the first epoch's checkpoint, the drill kills rank 1's process (SIGKILL: a machine gone);
Ray notices, stops the other worker, starts two new ones, and train_loop goes on from Ray's last
checkpoint. The driver prints what Ray's state API says ran where, the dead workers too.

    from lessons.bylesson import ray_drill
    drill = ray_drill.drill("ray")   # the run and the kill: a ray_drill.Drill
    ray_drill.placement(drill)       # each worker's process and state, from Ray's state API
    ray_drill.load("ray")            # that drill again, read from its files
"""
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import psutil

from trainup import ROOT
from . import elastic
from ..launch import environment
from ..report import QUICK, failed

# elastic.FLAGS (float64, no dropout: equal to one process at float64's tolerance), shorter: the
# kill after the first epoch still lands mid-run, and most of the drill is Ray starting.
EPOCHS, SAMPLES = 4, 512
FLAGS = [*elastic.FLAGS, "--epochs", str(EPOCHS), "--train-size", str(SAMPLES)]
MARK = "TRAINUP_RAY_DRILL"  # inherited by every process Ray starts: how the drill finds them
# A hang is a run that stops making progress, not one that is slow: on 2 busy cores Ray's start
# and its restart after the kill each took minutes, beyond any fixed total a healthy run needs.
START_S = 300  # from the start to the first record; without one, Ray's start stalled
QUIET_S = 240  # between one record of the log and the next (the restart after the kill included)
STATE_LINE = "Ray's state API: "  # how the driver prints each actor (trainup/engines/ray_run.py)


@dataclass
class Drill:
    log: Path
    checkpoint_dir: Path
    killed: int = 0  # the pid of the worker the drill killed
    killed_at: float = 0.0  # when (time.time())
    output: str = ""  # the driver's output
    returncode: int = 0
    left: list = field(default_factory=list)  # processes of the run still there after its end


# Ray gives a new node's raylet 30 s, its own constant, to register, and its dashboard 60 s to
# start; its agents (Python processes) start first, and on a loaded machine (2 cores running the
# test suite) that takes longer, start after start (trainup/engines/ray_run.start). The drill then
# waits for the load to fall and runs again.
NODE_LATE = "timed out during startup"  # ray_run.NODE_LATE (importing it imports Ray)
DASHBOARD_LATE = "(it contains the error message from the dashboard)"  # ray_run.DASHBOARD_LATE
DASHBOARD_SILENT = "Failed to read dashboard.err file"  # ray_run.DASHBOARD_SILENT
STARTS = 3
CALM_WAIT_S = 120


def late(output):
    """Whether the driver's output says Ray's start missed one of Ray's own waits."""
    return any(words in output for words in (NODE_LATE, DASHBOARD_LATE, DASHBOARD_SILENT))


def calm(wait_s=CALM_WAIT_S, poll_s=5):
    """Waits until the one-minute load average is below this process's cores, at most wait_s;
    returns (seconds waited, the load then, the cores)."""
    from trainup.metrics import machine_load
    start = time.monotonic()
    while True:
        load, cores = machine_load()
        waited = time.monotonic() - start
        if load is None or load < cores or waited >= wait_s:
            return waited, load, cores
        time.sleep(poll_s)


def available():
    """(True, Ray's version) where Ray Train imports; else (False, one sentence saying how)."""
    import logging
    import warnings
    # In a notebook without ipywidgets, Ray's import logs (ray.widgets) and tqdm.auto warns that
    # rich output is missing: the lesson prints text, so both are noise here.
    logging.getLogger("ray.widgets").setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        from trainup.engines import ray_run
    if ray_run.ray is None:
        return False, (f"Ray is not installed in this Python ({ray_run.RAY_MISSING}): the Ray "
                       f"cells print this and go on (pip install '{ray_run.PIN}')")
    return True, f"Ray {ray_run.ray.__version__}"


def storage(run, checkpoint_dir):
    """Where Ray keeps the run's checkpoints (trainup/engines/ray_run.py's storage)."""
    return Path(checkpoint_dir) / "ray" / run


def drill(run, log_dir="logs", checkpoint_dir="checkpoints", quick=None, show=print):
    """Run the Ray job, kill rank 1 once Ray kept a checkpoint, wait for the end. Folders relative
    to the course's top folder. Raises (one sentence first) where the run fails or hangs.
    A run that stalls (its workers never start, or the group Ray starts after the kill never comes
    up) is ended, every process Ray started with it too, and started once more: on 2 busy cores
    the Train controller's request to its autoscaling coordinator timed out, and the worker group
    it went on to start never came up."""
    quick = QUICK if quick is None else quick
    # the command as a learner types it, from the course's top folder (where it runs)
    cmd = ["scripts/_trainup_ray.py", *FLAGS, "--max-failures", "1", "--run-name", run,
           "--log-dir", str(log_dir), "--checkpoint-dir", str(checkpoint_dir)]
    cmd += ["--quick"] * quick
    log_dir, checkpoint_dir = ROOT / log_dir, ROOT / checkpoint_dir  # an absolute one stays
    log_dir.mkdir(parents=True, exist_ok=True)
    show("$ python " + shlex.join(cmd))
    stalls = 0
    for attempt in range(1, STARTS + 1):
        d = _attempt(cmd, run, log_dir, checkpoint_dir, show)
        if d.returncode is None and stalls == 0:
            stalls += 1
            stalled = (f"no worker started within {START_S} s: Ray's start stalled"
                       if not elastic.records(d.log) else
                       f"the run wrote nothing for {QUIET_S} s: Ray's restart stalled")
            show(f"{stalled} (a loaded machine); its processes ended, the run started once more")
        elif d.returncode not in (None, 0) and late(d.output) and attempt < STARTS:
            waited, load, cores = calm()
            show(f"Ray's node did not start in time (a loaded machine); after {waited:.0f} s "
                 f"waiting for the load ({load:.1f}) to fall below the cores ({cores}), "
                 "the run starts again")
        else:
            break
    if d.returncode is None:
        raise RuntimeError(f"the Ray run hung: no worker started within {START_S} s, or "
                           f"{QUIET_S} s passed without a new record in its log\n"
                           f"{d.output[-3000:]}")
    if d.returncode != 0:
        raise failed("_trainup_ray.py", d.output, d.returncode)
    record = log_dir / f"{run}.drill.json"
    tmp = record.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(killed=d.killed, killed_at=d.killed_at,
                                   returncode=d.returncode, left=d.left)))
    os.replace(tmp, record)  # whole or absent
    return d


def _attempt(cmd, run, log_dir, checkpoint_dir, show):
    """One run of the job, the kill in it; a Drill whose returncode is None where it hung (then
    every process of it has been killed)."""
    for old in (f"{run}.jsonl", f"{run}.stdout", f"{run}.driver", f"{run}.drill.json"):
        (log_dir / old).unlink(missing_ok=True)
    d, mark = Drill(log=log_dir / f"{run}.jsonl", checkpoint_dir=checkpoint_dir), uuid.uuid4().hex
    kept = storage(run, checkpoint_dir) / "checkpoint_manager_snapshot.json"
    with open(log_dir / f"{run}.driver", "w") as out:
        proc = subprocess.Popen([sys.executable, *cmd], cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, env=environment({MARK: mark}),
                                start_new_session=True)
        try:
            started = last = time.monotonic()
            seen = 0  # records in the log so far: each new one is progress
            while proc.poll() is None:
                records = elastic.records(d.log)
                now = time.monotonic()
                if len(records) != seen:
                    seen, last = len(records), now
                if now > (last + QUIET_S if seen else started + START_S):
                    raise subprocess.TimeoutExpired(cmd, now - started)
                # Ray has kept the first epoch's checkpoint (every rank reported it) and the
                # 'ddp' record names the ranks' pids. Killed earlier, the run starts from nothing.
                starts = [r for r in records if r["type"] == "ddp"]
                if not d.killed and kept.exists() and starts:
                    d.killed = starts[0]["ranks"][1]["pid"]
                    os.kill(d.killed, signal.SIGKILL)
                    d.killed_at = time.time()
                    show(f"rank 1 (pid {d.killed}) killed with SIGKILL after Ray kept epoch 1")
                time.sleep(0.05 if not d.killed else 0.5)
            d.returncode = proc.wait()
        except subprocess.TimeoutExpired:
            d.returncode = None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    d.output = (log_dir / f"{run}.driver").read_text()
    d.left = marked(mark)
    if d.returncode is None:  # Ray's own processes run in sessions of their own
        for pid in d.left:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        psutil.wait_procs([p for p in map(_process, d.left) if p], timeout=30)
    return d


def _process(pid):
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def load(run, log_dir="logs", checkpoint_dir="checkpoints"):
    """The drill `run` as drill() returned it, read back from its files; None where no finished
    drill of that name is there."""
    log_dir, checkpoint_dir = ROOT / log_dir, ROOT / checkpoint_dir
    record = log_dir / f"{run}.drill.json"
    if not record.exists():
        return None
    return Drill(log=log_dir / f"{run}.jsonl", checkpoint_dir=checkpoint_dir,
                 output=(log_dir / f"{run}.driver").read_text(), **json.loads(record.read_text()))


def marked(mark, wait_s=30):
    """The processes whose environment holds MARK=mark (the driver and all Ray started), once
    those on their way out have had wait_s seconds to go (10 were too few in a fresh clone's
    suite on a slow machine: Ray's processes end after ray.shutdown() returns, on their
    own time; one that stays 30 s has outlived the run)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for proc in psutil.process_iter():
            try:
                if proc.environ().get(MARK) == mark:
                    found.append(proc.pid)
            except (psutil.Error, OSError):  # gone, or not ours to read
                pass
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def resumed_at(d):
    """The epoch the group Ray started after the kill went on from, as its rank 0 said it; None
    where it said nothing. The kill lands once Ray kept epoch 1; on a loaded machine Ray may have
    kept epoch 2 too before it lands, and then goes on from there."""
    found = re.search(r"resuming at epoch (\d+) from Ray's last checkpoint", d.output)
    return int(found.group(1)) if found else None


def placement(d):
    """What the driver's read of Ray's state API said: each actor, its process, node and state."""
    rows = []
    for line in d.output.splitlines():
        if line.startswith(STATE_LINE):  # "<actor> pid <pid> on node <node>: <state>"
            actor, _, pid, _, _, node, state = line[len(STATE_LINE):].split()
            rows.append(dict(actor=actor, pid=int(pid), node=node.rstrip(":"), state=state,
                             killed=int(pid) == d.killed))
    return pd.DataFrame(rows)


def starts(d):
    """Each start of the worker group: seconds since the first, world size, the ranks' pids."""
    rows = [r for r in elastic.records(d.log) if r["type"] == "ddp"]
    return pd.DataFrame([dict(start_s=round(r["time"] - rows[0]["time"], 1),
                              world_size=r["world_size"],
                              pids=" ".join(str(rank["pid"]) for rank in r["ranks"]))
                         for r in rows])


def costs(d):
    """What the kill cost: seconds from the kill to the new group's start (Ray noticing, stopping
    the survivor, starting two workers, joining them), and the training thrown away (from the
    last checkpoint Ray kept to the kill: redone)."""
    rows = elastic.records(d.log)
    saved = max(r["time"] for r in rows if r["type"] == "epoch" and r["time"] < d.killed_at)
    again = min(r["time"] for r in rows if r["type"] == "ddp" and r["time"] > d.killed_at)
    return dict(restart_after_loss_s=again - d.killed_at, training_lost_s=d.killed_at - saved)
