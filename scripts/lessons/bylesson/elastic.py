"""Lesson 04c's drill: an elastic torchrun job whose nodes come and go, on this one machine.

Two torchrun agents act as two nodes (`--nnodes 1:2`: the job runs on 1 or 2), meeting at one
c10d rendezvous on the loopback address. The drill kills one node (its agent and worker, SIGKILL:
a machine gone) after the first epoch; the other node's worker loses its peer, torchrun restarts
it, and the new rendezvous closes with 1 node: the job goes on alone from the last checkpoint.
Then the node comes back; the surviving agent sees a node waiting, stops its worker (SIGTERM: the
run saves where it is, at the step) and the next rendezvous closes with 2. Every start writes a
'ddp' record (world size, restart count): the log is the job's membership history.

    from lessons.bylesson import elastic
    drill = elastic.drill("elastic")   # the job, the kill and the return: an elastic.Drill
    elastic.membership(drill.log)      # each start's time, world size and restart count
    elastic.load("elastic")            # that drill again, read from its files
"""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd

from trainup import ROOT
from trainup.distributed import free_port
from .. import checks
from ..launch import HOST, TORCHRUN, environment, torchrun_flags
from ..report import QUICK, failed, save

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
    joining is not a failure: it does not count against --max-restarts, though every worker is
    still stopped and started again from the checkpoint). host_store: this agent holds the
    rendezvous store (the survivor)."""
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
    killed: list = field(default_factory=list)  # node B's processes the kill ended: agent, workers


def kill_node(agent):
    """SIGKILL to a node's torchrun and every process under it, as a machine going away; the pids,
    once all are gone. torchrun starts each worker in a session of its own, out of reach of a
    signal to the agent's process group."""
    import psutil

    try:
        node = psutil.Process(agent)
        node = [node, *node.children(recursive=True)]
    except psutil.NoSuchProcess:  # ended by itself already
        return []
    for p in node:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    pids = [p.pid for p in node]
    for _ in range(300):  # a few milliseconds; bounded, as a signal lost would otherwise hang
        if not alive(pids):
            break
        time.sleep(0.1)
    return pids


def alive(pids):
    """Those of pids still running: a zombie (ended, its exit not yet collected) is gone."""
    import psutil

    def running(pid):
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    return [p for p in pids if running(p)]


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
        d.events["node B killed"] = time.time()
        d.killed = kill_node(agents["node B"][0].pid)  # the machine is gone: all of it at once
        d.events["node B gone"] = time.time()
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
    tmp.write_text(json.dumps(dict(events=d.events, returncodes=d.returncodes, killed=d.killed)))
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
                 events=saved["events"], outputs=outputs, returncodes=saved["returncodes"],
                 killed=saved.get("killed", []))


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


def kill_s(d):
    """Seconds from the job's first start (its first 'ddp' record, membership's zero) to the kill:
    on the log's clock, not from node A's launch, which a loaded machine starts seconds earlier."""
    first = next(r["time"] for r in records(d.log) if r["type"] == "ddp")
    return d.events["node B killed"] - first


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



def spans(d):
    """The drill's membership over time, from its log and its record, in seconds from the job's
    first start (membership's zero): each start's training span (to the record that ended it: a
    stop, the end, or for the start the kill hit, the kill) with its world size and the nodes in it
    (a start of 1 is node A's: node B was killed before it and came back after it), and each
    node's own span, from its launch to its kill or the job's end."""
    rows = records(d.log)
    t0 = next(r["time"] for r in rows if r["type"] == "ddp")
    killed, back = d.events["node B killed"] - t0, d.events["node B again started"] - t0
    out, start = [], None
    for r in rows:
        if r["type"] == "ddp":
            if start is not None:  # no record ended it: the kill did
                out.append(dict(start, end_s=killed))
            start = dict(start_s=r["time"] - t0, world_size=r["world_size"])
        elif r["type"] == "summary" and start is not None:
            out.append(dict(start, end_s=r["time"] - t0, status=r["status"]))
            start = None
    for s in out:
        alone = s["world_size"] == 1 and killed <= s["start_s"] <= back
        s["nodes"] = ["node A"] if alone else ["node A", "node B"][: s["world_size"]]
    end = out[-1]["end_s"]
    lives = {"node A": [(d.events["node A started"] - t0, end)],
             "node B": [(d.events["node B started"] - t0, killed), (back, end)]}
    return out, lives, dict(killed=killed, back=back)


def plot_membership(d, image):
    """spans(d) drawn: a row a node, a thin line while its torchrun runs, a thick bar while it
    trains in the job, labelled with the world size; the kill and the return marked; saved to
    images/<image>.png."""
    import matplotlib.pyplot as plt
    out, lives, marks = spans(d)
    nodes = list(lives)
    fig, ax = plt.subplots(figsize=(10, 2.6))
    for row, node in enumerate(nodes):
        for a, b in lives[node]:
            ax.plot([a, b], [row, row], color="0.6", lw=1.5)
    for s in out:
        for node in s["nodes"]:
            row = nodes.index(node)
            ax.barh(row, s["end_s"] - s["start_s"], left=s["start_s"], height=0.45,
                    color=f"C{s['world_size'] - 1}", alpha=0.75)
        ax.text((s["start_s"] + s["end_s"]) / 2, len(nodes) - 0.55,
                f"{s['world_size']} node{'s' * (s['world_size'] > 1)}", ha="center", fontsize=8)
    for a, b in zip(out, out[1:]):  # between two starts nobody trains
        ax.text((a["end_s"] + b["start_s"]) / 2, 0.5, "new\nrendezvous", ha="center",
                va="center", fontsize=7, color="0.35")
    for what, t, colour, side in (("node B killed ", marks["killed"], "C3", "right"),
                                  (" node B back", marks["back"], "C2", "left")):
        ax.axvline(t, color=colour, ls="--", lw=1)
        ax.text(t, -0.6, what, color=colour, ha=side, va="center", fontsize=8)
    ax.set_yticks(range(len(nodes)), nodes)
    ax.set_ylim(len(nodes) - 0.3, -0.95)
    ax.set_xlabel("seconds since the job's first start (grey line: the node's torchrun runs; "
                  "bar: it trains in the job)", fontsize=8)
    ax.set_title("The elastic drill's membership, from its log: 2 nodes, 1 after the kill, "
                 "2 again after the return", fontsize=10)
    save(fig, image)
    return fig


# A spot (preemptible) machine comes with a notice before the cloud takes it back: two minutes on
# AWS (docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html), 30
# seconds on Google Cloud (cloud.google.com/compute/docs/instances/spot). trainup/spot.py turns it
# into the course's stop signal (SIGTERM, or --stop-signal): the run saves at the next step, what
# the returning node above showed (spot_drill, below, does it on this machine).
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


# --- A spot notice, simulated on this machine ---------------------------------------------------
# trainup/spot.py watches the cloud's metadata service, which answers on the cloud's machines only:
# here a stand-in on the loopback address answers as AWS's or Google's does (the sources are in
# trainup/spot.py), and the watcher is pointed at it with --metadata-url. Nothing else is
# simulated: the watcher, its signal to the process group, the stop and the resume are real.

AWS_TOKEN = "drill-token"  # what the stand-in's IMDSv2 hands out, and then wants back
# The drill's run: tiny, the same in quick mode and out of it (it is about the stop, not training).
SPOT_FLAGS = ["--quick", "--train-size", "256", "--test-size", "64", "--batch-size", "32",
              "--epochs", "2", "--threads", "1", "--no-progress"]
SPOT_EVERY_S = 0.2  # the drill's watcher asks often: the stand-in is local, and the drill short
LAUNCHERS = {"python": [sys.executable], "torchrun": TORCHRUN}  # as typed -> as run here
SPOT_OUTPUTS = {"straight": "{run}_straight.out", "stopped": "{run}.spot_stopped.out",
                "resumed": "{run}.spot_resumed.out"}  # each job's output, in the log folder


class Metadata:
    """A stand-in for a cloud's metadata service on 127.0.0.1, in a thread of this process. AWS's
    wants an IMDSv2 token and answers 404 until notice(), then the instance-action JSON; Google's
    wants Metadata-Flavor: Google and answers FALSE until notice(), then TRUE. What the real one
    would refuse, it refuses. A context manager: closed at the end of the with block."""

    def __init__(self, cloud):
        self.cloud, self.action = cloud, None
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                stand_in._answer(self, "GET")

            def do_PUT(self):
                stand_in._answer(self, "PUT")

            def log_message(self, *args):  # quiet: the watcher's sentences tell the story
                pass
        self.server = ThreadingHTTPServer((HOST, 0), Handler)
        self.url = f"http://{HOST}:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def notice(self, action="terminate"):
        """From now on, the machine is being taken back."""
        self.action = action

    def _answer(self, request, method):
        ask, wants = (method, request.path), request.headers.get
        status, body = 404, ""
        if self.cloud == "aws" and ask == ("PUT", "/latest/api/token"):
            ttl = wants("X-aws-ec2-metadata-token-ttl-seconds")
            status, body = (200, AWS_TOKEN) if ttl else (400, "")
        elif self.cloud == "aws" and ask == ("GET", "/latest/meta-data/spot/instance-action"):
            ahead = time.gmtime(time.time() + NOTICE_S["AWS EC2 Spot"])
            notice = dict(action=self.action, time=time.strftime("%Y-%m-%dT%H:%M:%SZ", ahead))
            status, body = ((401, "") if wants("X-aws-ec2-metadata-token") != AWS_TOKEN else
                            (200, json.dumps(notice)) if self.action else (404, ""))
        elif self.cloud == "gcp" and ask == ("GET", "/computeMetadata/v1/instance/preempted"):
            status, body = ((403, "") if wants("Metadata-Flavor") != "Google" else
                            (200, "TRUE" if self.action else "FALSE"))
        data = body.encode()
        request.send_response(status)
        request.send_header("Content-Length", str(len(data)))
        if self.cloud == "gcp":
            request.send_header("Metadata-Flavor", "Google")
        request.end_headers()
        request.wfile.write(data)

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@dataclass
class SpotDrill:
    notice: str = ""  # the watcher's sentence on the notice
    stopped: int = None  # the watcher's exit status: the run's, stopped by the notice
    resumed: int = None  # the same line with --resume, on "the next machine" (no notice)
    straight: int = None  # the same run, never stopped (None: not run)
    statuses: list = field(default_factory=list)  # the run's log's summaries, in order
    outputs: dict = field(default_factory=dict)  # each job's output (the watcher's included)


def spot_drill(run, cloud="aws", launcher=("python",), script="scripts/_trainup_cpu.py",
               flags=SPOT_FLAGS, straight=True, resume=True, log_dir="logs",
               checkpoint_dir="checkpoints", show=print):
    """A spot notice on this machine: the run under `python -m trainup.spot` and a stand-in for
    the cloud's metadata service (Metadata); the notice once the run has started; then (resume)
    the same line with --resume on the next machine (a fresh stand-in: no notice). straight: the
    same run, never stopped, alongside (named run + "_straight"). launcher: as typed ("python",
    or "torchrun" and its flags). Folders relative to the course's top folder, as the commands
    show them. Raises (one sentence first) where a job fails to start, hangs or ends too early."""
    logs, checkpoints = ROOT / log_dir, ROOT / checkpoint_dir  # an absolute folder stays as it is
    logs.mkdir(parents=True, exist_ok=True)
    for name in (run, f"{run}_straight"):  # a fresh drill starts from nothing
        for old in (logs / f"{name}.jsonl", logs / f"{name}.stdout", checkpoints / f"{name}.pt"):
            old.unlink(missing_ok=True)

    def line(name, *extra, typed=False):
        start = [x for p in launcher for x in ([p] if typed else LAUNCHERS.get(p, [p]))]
        return [*start, script, *flags, "--run-name", name, "--log-dir", str(log_dir),
                "--checkpoint-dir", str(checkpoint_dir), *extra]

    def watched(stand_in, *extra, typed=False):  # typed: as on the cloud's machine, no stand-in
        here = [] if typed else ["--metadata-url", stand_in.url, "--every", str(SPOT_EVERY_S)]
        return ["python" if typed else sys.executable, "-m", "trainup.spot", "--cloud", cloud,
                *here, "--", *line(run, *extra, typed=typed)]

    d, jobs = SpotDrill(), {}
    out = {name: logs / pattern.format(run=run) for name, pattern in SPOT_OUTPUTS.items()}
    (logs / f"{run}.spot.json").unlink(missing_ok=True)
    try:
        if straight:
            jobs["straight"] = _start(line(f"{run}_straight"), out["straight"])
        with Metadata(cloud) as stand_in:
            show("$ " + shlex.join(watched(stand_in, typed=True)))
            jobs["stopped"] = _start(watched(stand_in), out["stopped"])
            d.notice = _notice(jobs["stopped"], stand_in, logs / f"{run}.jsonl")
            d.stopped = jobs["stopped"].wait(timeout=WAIT_S)
        show(f"{cloud}'s notice, served once the run had started: the watcher sent SIGTERM to "
             f"the run's process group; exit {d.stopped}")
        if resume:
            with Metadata(cloud) as again:  # the next machine: no notice
                typed = shlex.join(watched(again, "--resume", typed=True))
                show(f"$ {typed}  # on the next machine")
                jobs["resumed"] = _start(watched(again, "--resume"), out["resumed"])
                d.resumed = jobs["resumed"].wait(timeout=WAIT_S)
        d.statuses = [r["status"] for r in records(logs / f"{run}.jsonl")
                      if r["type"] == "summary"]
        if resume:
            show(f"exit {d.resumed}; the run's log says: {', then '.join(d.statuses)}")
        if straight:
            d.straight = jobs["straight"].wait(timeout=WAIT_S)
    finally:
        for proc in jobs.values():
            _end(proc)
    d.outputs = {name: proc.out_path.read_text() for name, proc in jobs.items()}
    # what the drill saw beside its log: it can be read again later (spot_load) without redoing it
    record, tmp = logs / f"{run}.spot.json", logs / f"{run}.spot.tmp"
    tmp.write_text(json.dumps({k: v for k, v in vars(d).items() if k != "outputs"}))
    os.replace(tmp, record)  # whole or absent
    return d


def spot_load(run, log_dir="logs"):
    """The spot drill `run` as spot_drill returned it, read back from its files; None where no
    finished drill of that name is there."""
    logs = ROOT / log_dir
    record = logs / f"{run}.spot.json"
    if not record.exists():
        return None
    d = SpotDrill(**json.loads(record.read_text()))
    d.outputs = {name: (logs / pattern.format(run=run)).read_text()
                 for name, pattern in SPOT_OUTPUTS.items()
                 if getattr(d, name) is not None}
    return d


def _notice(watcher, stand_in, log):
    """Serve the notice once the run has written its first log record (its Stopper is set by
    then: it stops, not dies). The run is held still (SIGSTOP to its group) from the notice until
    the watcher has signalled, so that the signal lands mid-run on any machine, however fast (a
    real notice leaves 30 s or 2 minutes). Returns the watcher's sentence."""
    group = int(_said(watcher, r"process group (\d+)", "the watcher's start").group(1))
    _until(watcher, lambda: records(log), "the run's first log record")
    os.killpg(group, signal.SIGSTOP)
    try:
        stand_in.notice()
        said = _said(watcher, r"notice from .*|no \w+ metadata service answers.*", "the notice")
    finally:
        os.killpg(group, signal.SIGCONT)
    if not said.group(0).startswith("notice"):
        raise RuntimeError(f"the watcher did not take the stand-in's answers: {said.group(0)}")
    return said.group(0)


def _start(cmd, out_path):
    with open(out_path, "w") as out:  # the job writes to its own copy
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env=environment(), start_new_session=True)
    proc.out_path = out_path
    return proc


def _end(proc):
    """A job still running once the drill is over (it hung, or the drill failed): its group
    ended, and the group the watcher started the run in."""
    if proc.poll() is None:
        said = re.search(r"process group (\d+)", proc.out_path.read_text())
        for group in (proc.pid, int(said.group(1)) if said else None):
            try:
                if group:
                    os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()


def _until(proc, done, what):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = done()
        if found:
            return found
        if proc.poll() is not None:
            raise RuntimeError(f"the spot drill's job ended (status {proc.returncode}) before "
                               f"{what}:\n{proc.out_path.read_text()[-3000:]}")
        time.sleep(0.02)
    raise RuntimeError(f"the spot drill did not reach {what} within {WAIT_S} s: it hung")


def _said(proc, pattern, what):
    return _until(proc, lambda: re.search(pattern, proc.out_path.read_text()), what)
