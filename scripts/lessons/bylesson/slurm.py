"""SLURM for the lesson and its tests: the templates in slurm/, and a real SLURM on this machine.

    from lessons.bylesson import slurm
    slurm.template_table()                      # the #SBATCH lines of every template, one row each
    slurm.check_counts("slurm/1node_4gpu.sbatch")  # tasks = GPUs per node, CPUs fit the node: sentences
    state, message = slurm.start()              # tools/local_slurm.sh start: controller + nodes n1, n2
    have, started_here = slurm.for_notebook()   # a notebook's: the running one, or one started for it
    job = slurm.submit("slurm/cpu.sbatch", "--quick", sbatch_args=["--nodes=2"])
    slurm.wait([job])                           # {job: "COMPLETED"}
    slurm.stop_midway(job, "logs/<run>.jsonl")  # the notice once it trains; requeued, back, finished
    slurm.stop()
"""
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from trainup import ROOT

TOOL = ROOT / "tools" / "local_slurm.sh"
TEMPLATES = ROOT / "slurm"
PUBLISHED = TEMPLATES / "supercomputer_course_published.csv"
CANNOT = 3  # local_slurm.sh's exit status when this machine cannot run SLURM (not root, no apt-get)
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
            "DEADLINE")
SHORT = {"-N": "nodes", "-n": "ntasks", "-c": "cpus-per-task", "-t": "time", "-o": "output", "-e": "error",
         "-J": "job-name", "-p": "partition", "-A": "account", "-G": "gpus"}


def state_dir():
    return Path(os.environ.get("TRAINUP_SLURM_DIR", ROOT / ".slurm"))


def env(extra=None):
    """The environment for sbatch, squeue...: SLURM_CONF of the local SLURM, and a Python for the jobs.

    The templates take the course's .venv; where there is none (a test run from another environment),
    TRAINUP_PYTHON hands them this very interpreter.
    """
    e = {**os.environ, "SLURM_CONF": str(state_dir() / "slurm.conf")}
    if not (ROOT / ".venv" / "bin" / "python").exists():
        e.setdefault("TRAINUP_PYTHON", sys.executable)
    return {**e, **(extra or {})}


def _tool(*args, timeout=900):
    return subprocess.run(["bash", str(TOOL), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "TRAINUP_SLURM_DIR": str(state_dir())})


def running():
    """True when the local SLURM's daemons (munged, slurmctld, two slurmd) are all alive."""
    return _tool("status", timeout=60).returncode == 0


def start(owner=None):
    """Start the local SLURM (installing it with apt-get the first time): (state, one sentence), where state is
    "running", "cannot" (this machine cannot: not root, no Debian registry) or "failed" (see its logs).

    With owner (a pid), a watchdog stops it once that process has ended, even if nobody calls stop().
    """
    proc = _tool("start", *(["--owner", str(owner)] if owner else []))
    text = (proc.stdout + proc.stderr).strip()
    last = text.splitlines()[-1].removeprefix("local_slurm: ") if text else ""
    state = {0: "running", CANNOT: "cannot"}.get(proc.returncode, "failed")
    return state, last or f"tools/local_slurm.sh start exited with status {proc.returncode}"


def stop():
    """Cancel the local SLURM's jobs and stop every daemon it started (by their pid files)."""
    return _tool("stop", timeout=120).stdout


def _run(cmd, extra_env=None, timeout=60, cwd=ROOT):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env(extra_env))


def for_notebook():
    """A notebook's SLURM: the local one running, else one started for it where the tests ask
    (TRAINUP_START_SLURM=1), stopped by a watchdog if the notebook's kernel dies first. Says what
    it found; returns (SLURM runs, this notebook started it): the notebook's cell checks them."""
    started_here = False
    if running():
        print("A local SLURM is running: the jobs below go to it.")
    elif os.environ.get("TRAINUP_START_SLURM") == "1":
        # one of this notebook's own (its folder, ports and munge key): two notebooks open side by
        # side (two kernels, the suite's two units) would else start, and stop, the same one
        os.environ["TRAINUP_SLURM_DIR"] = str(own_dir())
        state, why = start(owner=os.getpid())
        started_here = state == "running"
        print("Started the local SLURM for this notebook." if started_here else f"No SLURM here: {why}.")
    else:
        print("No SLURM is running here: start one with tools/local_slurm.sh start (as root), then "
              "run this cell again.")
    have = running()
    print(sinfo() if have else "")
    return have, started_here


def own_dir():
    """The folder of a SLURM a notebook starts for itself: .slurm/k<its kernel's pid> (short: the
    sockets of munge and of slurmd's job steps are made in it, and a socket's path has at most 107
    characters)."""
    base = Path(os.environ.get("TRAINUP_SLURM_DIR", ROOT / ".slurm"))
    return base if base.name == f"k{os.getpid()}" else base / f"k{os.getpid()}"


def done_with(started_here):
    """The end of a notebook's SLURM section: the local SLURM stopped if the notebook started it,
    and its folder removed (its jobs' outputs are in the course's logs/)."""
    if started_here:
        stop()
        shutil.rmtree(state_dir(), ignore_errors=True)
        print("Stopped the local SLURM this notebook started.")


def submit(template, *script_args, sbatch_args=(), extra_env=None, cwd=ROOT):
    """sbatch a template from the course's top folder (or cwd), as a learner would; returns the job id.

    sbatch_args go to SLURM (before the file: --nodes=2, --output=...); script_args to the training script;
    extra_env to the job (sbatch passes the submitting environment on).
    """
    cmd = ["sbatch", "--parsable", *map(str, sbatch_args), str(template), *map(str, script_args)]
    proc = _run(cmd, extra_env, cwd=cwd)
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch refused the job: {proc.stderr.strip()}")
    return proc.stdout.strip().split(";")[0]


def job(job_id):
    """The job's fields as scontrol shows them (JobState, ExitCode, NodeList, StdOut...); {} once forgotten."""
    proc = _run(["scontrol", "show", "job", "--oneliner", str(job_id)])
    if proc.returncode != 0:
        return {}
    return dict(tok.split("=", 1) for tok in proc.stdout.split() if "=" in tok)


def wait(job_ids, timeout=900, poll=1.0):
    """Wait until every job has finished; {job id: final state}. Past timeout, cancel them and raise."""
    job_ids = [str(j) for j in job_ids]
    deadline = time.monotonic() + timeout
    while True:
        states = {j: job(j).get("JobState", "UNKNOWN") for j in job_ids}
        if all(s in FINISHED for s in states.values()):
            return states
        if time.monotonic() > deadline:
            _run(["scancel", *job_ids])
            raise TimeoutError(f"SLURM jobs {', '.join(job_ids)} did not finish within {timeout:.0f} s "
                               f"(states: {states}); they were cancelled")
        time.sleep(poll)


# --- Requeue: a job stopped ahead of its end comes back and finishes (slurm/requeue/) ------------------------

def notice(job_id, sig="USR1"):
    """What `#SBATCH --signal=B:USR1@60` sends ahead of the time limit (or a preemption): the signal, to the
    job's batch script only."""
    proc = _run(["scancel", "--batch", f"--signal={sig}", str(job_id)])
    if proc.returncode != 0:
        raise RuntimeError(f"scancel could not signal job {job_id}: {proc.stderr.strip()}")


def release(job_id):
    """A requeued job waits for its begin time (SLURM holds it about two minutes before it may start again): on
    the course's own SLURM, let it start now."""
    _run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])


def stop_midway(job_id, log, timeout=600, poll=0.2):
    """Once every rank of the job is training (its run log holds the 'ddp' record), give the job its notice;
    when it has gone back to the queue, release it; wait until it finishes. Returns the job's states in the
    order seen (repeats dropped)."""
    deadline, seen, noticed, ended, pending = time.monotonic() + timeout, [], False, None, None
    while time.monotonic() < deadline:
        fields = job(job_id)
        state = fields.get("JobState", "UNKNOWN")
        if not seen or seen[-1] != state:
            seen.append(state)
        if state in FINISHED:
            ended = ended or time.monotonic()
            # right after `scontrol requeue` the first start may still show as ended (Restarts=0): wait for the
            # requeue to show, a little while, before taking the state as the job's last
            if not noticed or fields.get("Restarts", "0") != "0" or time.monotonic() - ended > 15:
                return seen
        else:
            ended = None
        if not noticed and Path(log).exists() and '"type": "ddp"' in Path(log).read_text():
            _run(["scancel", "--batch", "--signal=USR1", str(job_id)])  # notice(); a job that just ended is no error
            noticed = True
        pending = (pending or time.monotonic()) if noticed and state == "PENDING" else None
        if pending and time.monotonic() - pending > 3 and fields.get("Reason") == "BeginTime":
            release(job_id)  # a few seconds first: the first start's processes must have left the node
        time.sleep(poll)
    _run(["scancel", str(job_id)])
    raise TimeoutError(f"SLURM job {job_id} did not finish within {timeout:.0f} s (states: {seen}); it was cancelled")


def forget(run):
    """Delete a run's log, output, checkpoint and job output file (logs/slurm-<run>.out): a job that always
    passes --resume (slurm/requeue/) would otherwise carry on from an earlier run of the same name, one that
    finished long ago."""
    from ..report import forget as forget_run
    forget_run(run)
    (ROOT / "logs" / f"slurm-{run}.out").unlink(missing_ok=True)  # the job's output, as the notebook names it


def statuses(run, log_dir=None):
    """The status of every summary in logs/<run>.jsonl, in order: a requeued run has one per start."""
    import json
    from trainup import LOG_DIR
    path = Path(log_dir or LOG_DIR) / f"{run}.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [r.get("status") for r in records if r.get("type") == "summary"]


def queue():
    """squeue's table of the jobs SLURM still knows, finished ones included (state CD = completed)."""
    return _run(["squeue", "--states=all", "--format=%.6i %.24j %.9P %.5D %.5C %.11T %.9M %N"]).stdout


def accounting():
    """One row per finished job, from the controller's job-completion file: what sacct shows on a cluster."""
    import pandas as pd
    path = state_dir() / "log" / "jobs.txt"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        f = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        start, end = (pd.Timestamp(f[k]) for k in ("StartTime", "EndTime"))
        rows.append(dict(JobID=f["JobId"], JobName=f["Name"], State=f["JobState"], NNodes=int(f["NodeCnt"]),
                         NCPUS=int(f["ProcCnt"]), NodeList=f["NodeList"], Elapsed=str(end - start).split()[-1],
                         ExitCode=f["ExitCode"]))
    return pd.DataFrame(rows)


# --- Reading the templates ------------------------------------------------------------------------

def directives(path):
    """The #SBATCH options of a job script, as SLURM reads them: up to the first command line."""
    found = {}
    for line in Path(path).read_text().splitlines():
        s = line.strip()
        if s and not s.startswith("#"):
            break  # sbatch stops reading directives at the first command
        if not s.startswith("#SBATCH"):
            continue
        words = s[len("#SBATCH"):].split("#")[0].split()
        i = 0
        while i < len(words):
            w = words[i]
            if w.startswith("--"):
                key, _, value = w[2:].partition("=")
                if not _ and i + 1 < len(words) and not words[i + 1].startswith("-"):
                    value, i = words[i + 1], i + 1
            else:
                key, value = SHORT.get(w, w.lstrip("-")), words[i + 1] if i + 1 < len(words) else ""
                i += 1
            found[key] = value
            i += 1
    return found


def node(path):
    """The node a template is sized for, from its '# node: G GPUs, C CPU cores' line: (GPUs, cores)."""
    m = re.search(r"^# node: (\d+) GPUs?, (\d+) CPU cores", Path(path).read_text(), re.M)
    if not m:
        raise ValueError(f"{Path(path).name} has no '# node: G GPUs, C CPU cores' line")
    return int(m.group(1)), int(m.group(2))


def launcher(path):
    """'torchrun' (one task per node) or 'srun' (one task per training process), as the template declares."""
    return "torchrun" if re.search(r"^TRAINUP_LAUNCH=torchrun", Path(path).read_text(), re.M) else "srun"


def gpus_per_node(opts):
    """GPUs per node asked for by --gres=gpu[:type]:N or --gpus-per-node=N (0 without either)."""
    if "gres" in opts:
        m = re.match(r"gpu(?::[^:,]+)?:(\d+)$", opts["gres"])
        return int(m.group(1)) if m else 0
    return int(opts.get("gpus-per-node", 0))


def check_counts(path):
    """(sentence, problems): does the template's #SBATCH arithmetic fit the node it is sized for?

    One task per GPU under srun (one per node under torchrun); CPUs per task = the node's cores divided by
    its GPUs for each GPU a task drives; everything within the node's cores and GPUs.
    """
    path = Path(path)
    opts, (node_gpus, cores), launch = directives(path), node(path), launcher(path)
    problems = [f"no --{k}" for k in ("job-name", "nodes", "ntasks-per-node", "cpus-per-task", "time", "output")
                if k not in opts]
    if problems:
        return f"{path.name}: incomplete", problems
    tasks, cpus, gpus = int(opts["ntasks-per-node"]), int(opts["cpus-per-task"]), gpus_per_node(opts)
    if tasks * cpus > cores:
        problems.append(f"{tasks} tasks x {cpus} CPUs = {tasks * cpus} CPUs, more than the node's {cores} cores")
    if node_gpus:
        per_task = 1 if launch == "srun" else gpus
        if gpus == 0:
            problems.append("asks for no GPU (--gres=gpu:N)")
        elif gpus > node_gpus:
            problems.append(f"asks for {gpus} GPUs per node, the node has {node_gpus}")
        if launch == "srun" and tasks != gpus:
            problems.append(f"{tasks} tasks per node for {gpus} GPUs per node: srun needs one task per GPU")
        if launch == "torchrun" and tasks != 1:
            problems.append(f"{tasks} tasks per node: srun torchrun needs one per node")
        if cpus != cores // node_gpus * per_task:
            problems.append(f"{cpus} CPUs per task, but the node's {cores} cores / {node_gpus} GPUs x {per_task} "
                            f"GPU(s) per task = {cores // node_gpus * per_task}")
        what = f"{gpus} GPU(s) and {tasks} task(s) per node ({launch}" + \
               (", one task per GPU)" if launch == "srun" else f", one torchrun per node starting {gpus})")
    else:
        if gpus:
            problems.append(f"a CPU-only template (its node has no GPU) asks for {gpus} GPUs")
        what = f"no GPU, {tasks} task(s) per node ({launch})"
    sentence = (f"{path.name}: {opts['nodes']} node(s), {what}, {cpus} CPU(s) per task = "
                f"{tasks * cpus} of the node's {cores} cores, time limit {opts['time']}")
    return sentence, problems


def templates():
    return sorted(TEMPLATES.glob("*.sbatch"))


def template_table():
    """One row per template: the #SBATCH values a learner edits, and how the processes start."""
    import pandas as pd
    rows = []
    for p in templates():
        o, (g, c) = directives(p), node(p)
        rows.append({"template": p.name, "nodes": o.get("nodes"), "gres": o.get("gres", "-"),
                     "ntasks-per-node": o.get("ntasks-per-node"), "cpus-per-task": o.get("cpus-per-task"),
                     "time": o.get("time"), "launch": launcher(p), "node sized for": f"{g} GPUs, {c} cores"})
    return pd.DataFrame(rows).set_index("template")


def published_times():
    """The supercomputer course's published ResNet-50/ImageNet runs (not measured here): nodes, GPUs,
    per-GPU batch and minutes, as published (lesson 11a1 fits its model on them)."""
    import pandas as pd
    df = pd.read_csv(PUBLISHED, comment="#")
    df["gpus"] = df["nodes"] * df["gpus_per_node"]
    parts = df["time"].str.extract(r"^(\d+)m([\d.]+)s$").astype(float)  # "342m11.864s", as `time` prints it
    df["minutes"] = parts[0] + parts[1] / 60
    return df


def published_scaling():
    """The supercomputer course's published ResNet-50/ImageNet training times (not measured here), in
    minutes, with speed-up and parallel efficiency against its 1-GPU time."""
    df = published_times()
    base = df.loc[df["gpus"] == 1, "minutes"].iloc[0]
    df["speedup"] = (base / df["minutes"]).round(1)
    df["efficiency"] = (df["speedup"] / df["gpus"]).round(2)
    df["minutes"] = df["minutes"].round(1)
    return df


def published_source():
    """The citation of the published times: the CSV's '# source:' comment line."""
    for line in PUBLISHED.read_text(encoding="utf-8").splitlines():
        if line.startswith("# source:"):
            return line.split(":", 1)[1].strip()
    raise ValueError(f"{PUBLISHED.name} names no source (a '# source:' line)")


def about_published(df):
    """Sentences on the published scaling, computed from its table (speed-up and efficiency per GPU count)."""
    rows = df[df["gpus"] > 1].sort_values("gpus")
    parts = [f"{g} GPUs gave {s:.1f}× ({e:.0%} efficiency)" for g, s, e in zip(rows["gpus"], rows["speedup"], rows["efficiency"])]
    batches = df.sort_values("gpus").groupby("per_gpu_batch", sort=False)["gpus"].agg(["min", "max"])
    if len(batches) > 1:  # then the series is not one strong-scaling experiment: the work per GPU changed
        said = [f"{b} per GPU from {lo} to {hi} GPUs" for b, (lo, hi) in batches.iterrows()]
        parts_batch = (f" The runs did not all use the same batch per GPU ({'; '.join(said)}): each GPU's "
                       f"share of a step changed between them too, and the source does not say why the "
                       f"efficiency changes as it does.")
    else:
        parts_batch = ""
    return "; ".join(parts) + "." + parts_batch


def diff_directives(a, b):
    """What changes between two templates' #SBATCH lines, one line per option."""
    da, db = directives(TEMPLATES / a), directives(TEMPLATES / b)
    lines = [f"  {k}: {da.get(k, '-')} -> {db.get(k, '-')}" for k in dict.fromkeys([*da, *db]) if da.get(k) != db.get(k)]
    if launcher(TEMPLATES / a) != launcher(TEMPLATES / b):
        lines.append(f"  launch: {launcher(TEMPLATES / a)} -> {launcher(TEMPLATES / b)}")
    return f"{a} -> {b}\n" + "\n".join(lines)


def sinfo():
    """The nodes and their state, as sinfo shows them."""
    return _run(["sinfo", "--Node", "--format=%.6N %.9P %.5c %.8m %.8T"]).stdout


def log_text(job_id):
    """What the job wrote to its output file (#SBATCH --output), with paths relative to the course folder."""
    path = job(job_id).get("StdOut")
    if not path or not Path(path).exists():
        return f"(job {job_id} has no output file)"
    return Path(path).read_text().replace(f"{ROOT}/", "")


def plot_scaling(published, local=None, name="slurm_scaling"):
    """Left: the published times against GPUs, with ideal scaling. Right: this machine's runs (samples/s by
    nodes), when there are some. Saved to images/<name>.png; returns the (closed) figure: end the cell with it."""
    import matplotlib.pyplot as plt
    from .. import report
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    base = published.loc[published["gpus"] == 1, "minutes"].iloc[0]
    gpus = published["gpus"]
    left.loglog(gpus, published["minutes"], "o-", label=f"published: {published['source'].iloc[0]}")
    left.loglog(gpus, base / gpus, "--", color="grey", label="ideal: 1-GPU time / GPUs")
    for g, m, n in zip(gpus, published["minutes"], published["nodes"]):
        left.annotate(f"{m:g} min, {n} node(s)", (g, m), textcoords="offset points", xytext=(6, 4), fontsize="small")
    left.set(title="ResNet-50 on ImageNet: PUBLISHED by the\nsupercomputer course, not measured here",
             xlabel="GPUs", ylabel="training time (minutes)", xticks=list(gpus), xticklabels=[str(g) for g in gpus],
             xlim=(0.7, gpus.max() * 3))
    left.legend(fontsize="small")
    if local is not None and len(local):
        right.bar([f"{n} node(s)\n{w} processes" for n, w in zip(local["nodes"], local["world_size"])],
                  local["samples_per_s"])
        right.set(title="measured here: the CPU template through sbatch\n(both nodes share this machine's 2 cores)",
                  ylabel="training samples/s")
    else:
        right.text(0.5, 0.5, "no local SLURM runs\n(no SLURM on this machine)", ha="center", va="center")
        right.set(title="measured here", xticks=[], yticks=[])
    for ax in (left, right):
        ax.grid(alpha=0.3)
    report.save(fig, name)
    plt.close(fig)  # shown once, as the cell's value: under nbval an open figure is also drawn a second time
    return fig
