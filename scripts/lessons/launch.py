"""Starting DDP jobs from a notebook or a test: torchrun on this machine, or two nodes simulated on it.

    from lessons import launch
    launch.run("_trainup_ddp.py", name="ddp_n2", nproc=2)                 # torchrun --standalone
    launch.two_nodes("_trainup_ddp.py", name="ddp_2nodes", rendezvous="c10d")
    launch.side_by_side(launch.Job("_trainup_ddp.py", name="one"), launch.Job("_trainup_ddp.py", name="two", nproc=2))

torchrun is started as `python -m torch.distributed.run` (the very program the `torchrun` command
runs), so it is this Python's torchrun whatever PATH holds; the printed command says `torchrun`.
"""
import difflib
import os
import re
import shlex
import subprocess
import sys

from trainup import ROOT
from trainup.distributed import free_port
from trainup.metrics import machine_load
from . import checks, jobs, manifest
from .placement import placed
from .report import QUICK, check, failed

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
HOST = "127.0.0.1"  # the simulated nodes meet on the loopback address


# torchrun passes on to its workers only the signals it handles (--signals-to-handle, which it also
# reads from PET_SIGNALS_TO_HANDLE): by default not SIGUSR1, the course's --stop-signal, which then
# ends torchrun itself. With these it sends a stop signal on, and the ranks stop with a checkpoint.
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"


def environment(extra=None):
    # one thread per process (torchrun warns otherwise), output as it comes, stop signals passed on
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "PET_SIGNALS_TO_HANDLE": TORCHRUN_SIGNALS, **(extra or {})}


def torchrun_flags(nproc=2, nnodes=1, node_rank=0, port=None, rendezvous="standalone", run_id="trainup",
                   max_restarts=0):
    """torchrun's flags: standalone (one node, it picks a free port), static (--node-rank,
    --master-addr/--master-port) or c10d (nodes join through a store at --rdzv-endpoint; ranks assigned)."""
    flags = []
    if rendezvous == "standalone":
        flags += ["--standalone"]
    elif rendezvous == "static":
        flags += ["--nnodes", nnodes, "--node-rank", node_rank, "--master-addr", HOST, "--master-port", port]
    elif rendezvous == "c10d":
        flags += ["--nnodes", nnodes, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{HOST}:{port}",
                  "--rdzv-id", run_id]
    else:
        raise ValueError(f"unknown rendezvous {rendezvous!r}")
    flags += ["--nproc-per-node", nproc] + (["--max-restarts", max_restarts] if max_restarts else [])
    return [str(f) for f in flags]


def script_args(script, args, name, quick, nproc=1):
    """The script's part of a job's command, its device placed (lessons/placement.py) for nproc processes."""
    quick = QUICK if quick is None else quick
    args = placed(script, args, nproc)
    return [f"scripts/{script}", *args, "--run-name", name, "--no-progress"] + ["--quick"] * quick


def command(script, args, name, nproc=2, quick=None, **flags):
    """(argv, the command as printed) of one torchrun job: every torchrun job of the lessons is built here."""
    part = script_args(script, args, name, quick, nproc)
    f = torchrun_flags(nproc=nproc, **flags)
    return TORCHRUN + f + part, shown(f, part)


def shown(flags, script_part):
    return "$ OMP_NUM_THREADS=1 " + shlex.join(["torchrun", *flags, *script_part])


def run(script, *args, name, nproc=2, quick=None, timeout=900, env=None, **flags):
    """One torchrun job on this machine; prints the command and one checked sentence (report.check)."""
    argv, printed = command(script, args, name, nproc, quick, **flags)
    print(printed)
    proc = jobs.run(argv, timeout=timeout, env=environment(env))
    if proc.returncode != 0:
        raise failed("torchrun", proc.stdout[-1000:] + proc.stderr, proc.returncode)
    print(check(name))
    checks.finished(name)  # exit status 0 is not enough: the log must say finished, in the schema
    return name


class Job:
    """A run for side_by_side: scripts/<script> under torchrun with nproc processes, or plain python (nproc=0)."""
    def __init__(self, script, *args, name, nproc=0, quick=None, env=None):
        self.name, self.env = name, env
        if nproc:
            self.cmd, self.shown = command(script, args, name, nproc, quick)
        else:
            part = script_args(script, args, name, quick)
            self.cmd, self.shown = [sys.executable] + part, "$ python " + shlex.join(part)


def side_by_side(*runs, timeout=900):
    """Start the jobs together and wait for all: for runs that measure no speed (a proof of equal parameters,
    losses), where most of each run is starting Python and importing torch, on one core. Prints each command,
    then one checked sentence each, in order."""
    for job in runs:
        print(job.shown)
    procs = [jobs.start(job.cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=environment(job.env)) for job in runs]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:  # one failed or the time ran out: leave none running
            if p.poll() is None:
                p.kill()
                p.wait()
    for job, p, out in zip(runs, procs, outputs):
        if p.returncode != 0:
            raise failed(job.name, out, p.returncode)
    for job in runs:
        print(check(job.name))
        checks.finished(job.name)
    return [job.name for job in runs]


def two_nodes(script, *args, name, rendezvous="static", nproc_per_node=1, quick=None, timeout=900, env=None):
    """Two torchrun launchers with --nnodes 2, started side by side as if on two machines.

    On a cluster each command runs on its own node with --master-addr (or --rdzv-endpoint) set to the
    first node's address; here both nodes are this machine and meet on the loopback address.
    """
    port = free_port(HOST)
    part = script_args(script, args, name, quick, nproc_per_node)
    procs = []
    for node in (0, 1):
        f = torchrun_flags(nproc=nproc_per_node, nnodes=2, node_rank=node, port=port, rendezvous=rendezvous,
                           run_id=name)
        print(f"# node {node}" + (" (its node rank is assigned when the two meet)" if rendezvous == "c10d" else ""))
        print(shown(f, part))
        procs.append(jobs.start(TORCHRUN + f + part, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=environment(env)))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:  # one launcher failed or the time ran out: do not leave the other waiting
            if p.poll() is None:
                p.kill()
                p.wait()
    for node, (p, out) in enumerate(zip(procs, outputs)):
        if p.returncode != 0:
            raise failed(f"node {node}'s torchrun", out, p.returncode)
    print(check(name))
    checks.finished(name)
    return name


# The ladder: each lesson's script, the script it grows from, and the most changed lines its diff may
# have (lessons/manifest.py holds each, with the reason for its budget). tests/test_structure.py holds
# every step to its budget.
LADDER = tuple((s.parent, s.name, s.budget) for s in manifest.SCRIPTS.values() if s.parent)


def changed_lines(old, new):
    """`diff scripts/<old> scripts/<new> | grep -c '^[<>]'`: the lines one step removes and adds."""
    a, b = ((ROOT / "scripts" / f).read_text().splitlines() for f in (old, new))
    return sum(1 for line in difflib.unified_diff(a, b, n=0, lineterm="")
               if line[:1] in "+-" and not line.startswith(("+++", "---")))


def lesson_diff(script):
    """The diff of a lesson's script against the one it grows from (LADDER)."""
    parent = next(p for p, s, _ in LADDER if s == script)
    return script_diff(parent, script)


def script_diff(old, new):
    """`diff -u scripts/<old> scripts/<new>`: what one lesson adds to the previous script."""
    a, b = ((ROOT / "scripts" / f).read_text().splitlines(keepends=True) for f in (old, new))
    return "".join(difflib.unified_diff(a, b, f"scripts/{old}", f"scripts/{new}", n=1))


def show_code(text, language="diff"):
    """Shows a diff (or source) as a Markdown code block of that language, which JupyterLab and
    Colab colour: a diff's added lines green, its removed ones red. Plain text outside a notebook."""
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
    except ImportError:
        get_ipython = None
    if get_ipython is None or get_ipython() is None:
        print(text)
        return
    display(Markdown(code_block(text, language)))


def code_block(text, language="diff"):
    """The Markdown code block show_code displays."""
    longest = max((len(r) for r in re.findall("`+", text)), default=0)
    fence = "`" * max(3, longest + 1)  # longer than any run of backticks in the text
    return f"{fence}{language}\n{text.rstrip()}\n{fence}"


def check_diff_adds(diff, *lesson):
    """The diff adds the lesson's lines (each fragment in some added line). A notebook checks its printed
    diff with this rather than storing it to compare character by character: any edit of the scripts would
    fail that, and a diff that lost the lesson's lines could be stored again."""
    added = [line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    missing = [f for f in lesson if not any(f in line for line in added)]
    checks.holds(not missing, f"the diff adds the lesson's lines (missing: {', '.join(missing)})")


def cores():
    """CPU cores this process may run on (what the scheduler gives us, not what the machine has)."""
    return machine_load()[1]
