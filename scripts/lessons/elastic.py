"""Lesson 04c's drill: an elastic torchrun job whose nodes come and go, on this one machine.

Two torchrun agents act as two nodes (`--nnodes 1:2`: the job runs on 1 or 2), meeting at one
c10d rendezvous on the loopback address. The drill kills one node (its agent and worker, SIGKILL:
a machine gone) after the first epoch; the other node's worker loses its peer, torchrun restarts
it, and the new rendezvous closes with 1 node: the job goes on alone from the last checkpoint.
Then the node comes back; the surviving agent sees a node waiting, stops its worker (SIGTERM: the
run saves where it is, at the step) and the next rendezvous closes with 2. Every start writes a
'ddp' record (world size, restart count): the log is the job's membership history.

    from lessons import elastic
    drill = elastic.drill("elastic")   # the job, the kill and the return: an elastic.Drill
    elastic.membership(drill.log)      # each start's time, world size and restart count
    elastic.load("elastic")            # that drill again, read from its files
"""

import json
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from trainup import ROOT
from trainup.distributed import free_port
from . import checks
from .launch import HOST, TORCHRUN, environment, torchrun_flags
from .report import QUICK, failed

# The job: lesson 04's DDP script, float64 with no dropout so that its end can be compared with one
# process at float64's tolerance whatever the world size did (dropout masks follow the ranks, and
# ranks come and go); enough samples that the job is still training when the lost node returns;
# --resume on every start of the elastic job (a restarted or returning worker carries on from the
# checkpoint). On CPU processes (gloo) wherever it runs: the drill is about membership, not speed.
FLAGS = [
    "--epochs",
    "6",
    "--train-size",
    "1024",
    "--dropout",
    "0",
    "--threads",
    "1",
    "--device",
    "cpu",
    "--no-progress",
    *checks.PROOF,
]
# Elastic agents share no store between attempts: the ranks of a new attempt are not the old ones
# (trainup/distributed.py), so rank 0 opens a fresh store on a fresh port for each.
ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
LAST_CALL_S = 3  # once 1 node is there, how long the rendezvous waits for a second before closing
WAIT_S = 240  # far beyond a healthy drill's steps: reaching it means the job hung


def agent_command(run, port, host_store):
    """One node's torchrun: 1 worker, 1 to 2 nodes, up to 3 restarts after a failure (a node
    joining is not a failure: it costs no restart). host_store: this agent holds the rendezvous
    store (the survivor)."""
    flags = torchrun_flags(
        nproc=1, nnodes="1:2", port=port, rendezvous="c10d", run_id=run, max_restarts=3
    )
    flags += [
        "--rdzv-conf",
        f"is_host={int(host_store)},last_call_timeout={LAST_CALL_S}",
        "--monitor-interval",
        "0.5",
    ]
    return flags


def script_part(run, log_dir, checkpoint_dir, quick):
    return [
        "scripts/_trainup_ddp.py",
        *FLAGS,
        "--resume",
        "--run-name",
        run,
        "--log-dir",
        str(log_dir),
        "--checkpoint-dir",
        str(checkpoint_dir),
    ] + ["--quick"] * quick


@dataclass
class Drill:
    log: Path
    checkpoint_dir: Path
    events: dict = field(
        default_factory=dict
    )  # what the drill did, by name: its time (time.time())
    outputs: dict = field(default_factory=dict)  # each agent's output, by name
    returncodes: dict = field(default_factory=dict)


def drill(run, log_dir="logs", checkpoint_dir="checkpoints", quick=None, show=print):
    """Start two nodes, kill one after the first epoch, start it again once the job runs alone;
    wait for the end. Folders relative to the course's top folder (where the jobs run, and as the
    commands show them). Raises (one sentence first) where an agent fails or the job hangs."""
    part = script_part(run, log_dir, checkpoint_dir, QUICK if quick is None else quick)
    log_dir, checkpoint_dir = (
        ROOT / log_dir,
        ROOT / checkpoint_dir,
    )  # an absolute folder stays as it is
    for old in (log_dir / f"{run}.jsonl", log_dir / f"{run}.stdout", checkpoint_dir / f"{run}.pt",
                log_dir / f"{run}.drill.json"):
        old.unlink(
            missing_ok=True
        )  # --resume is on every start: a fresh drill starts from nothing
    port = free_port(HOST)
    d = Drill(log=log_dir / f"{run}.jsonl", checkpoint_dir=checkpoint_dir)
    agents = {}

    def start(name, host_store):
        flags = agent_command(run, port, host_store)
        show(
            f"# {name}\n$ TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 OMP_NUM_THREADS=1 "
            + shlex.join(["torchrun", *flags, *part])
        )
        out = open(log_dir / f"{run}_{name.replace(' ', '_')}.agent", "w")
        agents[name] = (
            subprocess.Popen(
                TORCHRUN + flags + part,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=environment(ENV),
                start_new_session=True,
            ),
            out,
        )
        d.events[f"{name} started"] = time.time()

    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        start("node A", True)
        start("node B", False)
        _wait(d, lambda r: _trained_on(r, 2), "an epoch trained on 2 nodes")
        _saved_after(d.checkpoint_dir / f"{run}.pt", d.events["an epoch trained on 2 nodes"])
        time.sleep(
            1.0
        )  # into the next epoch: the steps it takes before the kill are lost, then redone
        os.killpg(
            agents["node B"][0].pid, signal.SIGKILL
        )  # the machine is gone: agent and worker at once
        d.events["node B killed"] = time.time()
        show("node B killed (SIGKILL to its torchrun and worker) after an epoch on 2 nodes")
        _wait(
            d,
            lambda r: _starts(r)[-1:] == [1] and len(_starts(r)) > 1,
            "the job going on with 1 node",
        )
        start("node B again", False)
        for name, (proc, out) in agents.items():
            if name != "node B":
                d.returncodes[name] = proc.wait(timeout=WAIT_S)
    finally:
        for proc, out in agents.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            out.close()
    d.outputs = {name: Path(out.name).read_text() for name, (_, out) in agents.items()}
    for name, code in d.returncodes.items():
        if code != 0:
            raise failed(f"{name}'s torchrun", d.outputs[name], code)
    # the drill's times beside its log: it can be read again later (load) without redoing it
    record = log_dir / f"{run}.drill.json"
    tmp = record.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(events=d.events, returncodes=d.returncodes)))
    os.replace(tmp, record)  # whole or absent
    return d


def load(run, log_dir="logs", checkpoint_dir="checkpoints"):
    """The drill `run` as drill() returned it, read back from its files (its log, its record and
    the agents' outputs); None where no finished drill of that name is there."""
    log_dir, checkpoint_dir = ROOT / log_dir, ROOT / checkpoint_dir
    record = log_dir / f"{run}.drill.json"
    if not record.exists():
        return None
    saved = json.loads(record.read_text())
    outputs = {name: (log_dir / f"{run}_{name.replace(' ', '_')}.agent").read_text()
               for name in ("node A", "node B", "node B again")}
    return Drill(log=log_dir / f"{run}.jsonl", checkpoint_dir=checkpoint_dir,
                 events=saved["events"], outputs=outputs, returncodes=saved["returncodes"])


def records(log):
    """The log's records so far (a partial last line, being written, is left out)."""
    out = []
    for line in Path(log).read_text().splitlines() if Path(log).exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


def _saved_after(path, t):
    """Wait for rank 0's checkpoint written after time t (the epoch's, after its log record)."""
    deadline = time.monotonic() + WAIT_S
    while not (path.exists() and path.stat().st_mtime >= t - 1.0) and time.monotonic() < deadline:
        time.sleep(0.1)


def _starts(rows):
    return [r["world_size"] for r in rows if r["type"] == "ddp"]


def _trained_on(rows, world):
    """An epoch record written by a start of `world` processes."""
    size = None
    for r in rows:
        size = r["world_size"] if r["type"] == "ddp" else size
        if r["type"] == "epoch" and size == world:
            return True
    return False


def _wait(d, done, what):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        rows = records(d.log)
        if done(rows):
            d.events[what] = time.time()
            return rows
        time.sleep(0.2)
    raise RuntimeError(f"the elastic job did not reach {what} within {WAIT_S} s: it hung")


def membership(log):
    """Each start: seconds since the first, world size, restart count, per-rank batch."""
    rows = [r for r in records(log) if r["type"] == "ddp"]
    t0 = rows[0]["time"]
    return pd.DataFrame(
        [
            dict(
                start_s=round(r["time"] - t0, 1),
                world_size=r["world_size"],
                restart_count=r["restart_count"],
                per_rank_batch=r["per_rank_batch"],
                global_batch=r["global_batch"],
            )
            for r in rows
        ]
    )


def costs(d):
    """What the node's loss and return cost, from the drill's times and the log: seconds from the
    kill to the job training again alone (noticing, restarting, re-rendezvous, loading), the
    training seconds thrown away (from the last epoch's checkpoint to the kill: redone), and
    seconds from the node's return to the job training on 2 again (the stop at a step loses
    nothing)."""
    rows = records(d.log)
    starts = [r["time"] for r in rows if r["type"] == "ddp"]
    saved = max(
        r["time"] for r in rows if r["type"] == "epoch" and r["time"] < d.events["node B killed"]
    )
    killed, back = d.events["node B killed"], d.events["node B again started"]
    alone = min(t for t in starts if t > killed)
    again = min(t for t in starts if t > back)
    return dict(
        restart_after_loss_s=alone - killed, training_lost_s=killed - saved, rejoin_s=again - back
    )


# A spot (preemptible) machine comes with a notice before the cloud takes it back: two minutes on
# AWS (docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html), 30
# seconds on Google Cloud (cloud.google.com/compute/docs/instances/spot). Turned into the course's
# stop signal (SIGTERM, or --stop-signal), the run saves at the next step: what the returning node
# above showed.
NOTICE_S = {"AWS EC2 Spot": 120, "Google Cloud Spot VM": 30}


def spot_cost(hours, on_demand_per_h, spot_per_h, interruptions_per_h, lost_h_per_interruption):
    """A job of `hours` on on-demand machines against spot ones that are taken back
    `interruptions_per_h` times an hour, each costing `lost_h_per_interruption` (work since the
    last save, a restart, the wait for a machine): on spot the job takes T with T = hours +
    interruptions_per_h * T * lost, so T = hours / (1 - interruptions_per_h * lost). The prices are
    the learner's: they change by region."""
    stretch = interruptions_per_h * lost_h_per_interruption
    if stretch >= 1:
        raise ValueError(
            "each hour loses an hour or more to interruptions: the job never ends on spot"
        )
    spot_hours = hours / (1 - stretch)
    return dict(
        on_demand_h=hours,
        on_demand_cost=hours * on_demand_per_h,
        spot_h=spot_hours,
        spot_cost=spot_hours * spot_per_h,
    )
