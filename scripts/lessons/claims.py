"""Sentences about measured results, built from the numbers: the direction of a claim is computed, not typed.

    claims.trend([4, 16, 64], [18, 62, 180])       # 'rises'
    claims.curve([4, 16, 64], [18, 62, 180], "Throughput", "batch size", "samples/s")
    claims.ratio(183.7, 85.7)                      # '2.1× faster'
    claims.compare(183.7, 85.7, "one thread")      # '2.1× faster than one thread'
    claims.load_note()                             # was the machine busy while the cells ran?

A notebook prints these sentences; the unit tests feed them rising, flat and falling numbers.
"""
from pathlib import Path

from trainup import LOG_DIR
from trainup.metrics import machine_load

FLAT = 0.10  # changes under 10 % are noise on a shared machine: "stays flat", "about as fast"


def _gain(a, b):
    return (b - a) / abs(a) if a else float("inf") if b > a else 0.0


def trend(xs, ys, flat=FLAT):
    """The shape of a curve: 'rises', 'rises, then flattens', 'falls', 'falls, then flattens' or 'stays flat'.

    Overall: the last point against the first. 'then flattens': the last step gains less than `flat`
    while the curve as a whole moved (so a saturating throughput curve reads as what it is)."""
    pairs = sorted(zip(xs, ys))
    ys = [y for _, y in pairs]
    if len(ys) < 2:
        raise ValueError("a trend needs at least two points")
    total = _gain(ys[0], ys[-1])
    if abs(total) < flat:
        return "stays flat"
    word = "rises" if total > 0 else "falls"
    last = _gain(ys[-2], ys[-1])
    if len(ys) >= 3 and (abs(last) < flat or (last > 0) != (total > 0)):
        return word + ", then flattens"
    return word


def curve(xs, ys, what, along, unit="", digits=0):
    """One sentence: how `what` (its subject, written as it should start) changes along `along`, with its
    first and last values."""
    pairs = sorted(zip(xs, ys))
    (x0, y0), (x1, y1) = pairs[0], pairs[-1]
    u = f" {unit}" if unit else ""
    if len(pairs) < 2:
        return f"{what}: one point only, {y0:,.{digits}f}{u} at {x0}."
    return (f"{what} {trend(xs, ys)} with {along}: {y0:,.{digits}f}{u} at {x0} and "
            f"{y1:,.{digits}f}{u} at {x1} ({y1 / y0:.1f}× the first).")


def ratio(new, old, flat=FLAT):
    """Throughputs (bigger is faster): '2.1× faster', '1.3× slower', or 'about as fast' within `flat`."""
    if not (new > 0 and old > 0):
        raise ValueError(f"throughputs must be positive, got {new} and {old}")
    r = new / old
    if abs(r - 1) < flat:
        return f"about as fast ({r:.2f}×)"
    return f"{r:.1f}× faster" if r > 1 else f"{1 / r:.1f}× slower"


def compare(new, old, other, flat=FLAT):
    """'2.1× faster than <other>', '1.3× slower than <other>', or 'about as fast as <other> (0.97×)'."""
    r = ratio(new, old, flat)
    return f"about as fast as {other} ({new / old:.2f}×)" if r.startswith("about") else f"{r} than {other}"


def cores():
    """CPU cores this process may use (launch.cores, where jobs are started, is the same)."""
    return machine_load()[1]


def load(cores_=None, loadavg=None, runs=(), log_dir=LOG_DIR):
    """(busy, load average, cores): busy when the load average exceeds the cores, the course's one
    threshold: more processes wanted to run than there were cores, so they took turns.

    The load is the highest the runs' logs recorded at their start and end (runs given), or now."""
    here, cores_now = machine_load()
    n = cores_ or cores_now
    if loadavg is None:
        recorded = [v for name in runs for v in _recorded_loads(name, log_dir)]
        loadavg = max(recorded) if recorded else (here or 0.0)
    return loadavg > n, loadavg, n


def _recorded_loads(name, log_dir):
    from .report import read_run
    path = Path(log_dir) / f"{name}.jsonl"
    run = read_run(path) if path.exists() else {}
    ends = (run.get("env") or {}).get("load_start"), (run.get("summary") or {}).get("load_end")
    return [v for v in ends if v is not None]


def load_note(cores_=None, loadavg=None, runs=(), others=None):
    """A sentence on whether the timings above come from a quiet or a busy machine.

    Where the OS counts each core's busy time (Linux), what matters is measured apart: the load before
    this notebook's first job, and the share of the cores' time that other programs took since. The
    notebook's own jobs are not "a busy machine": a lesson that starts 4 processes on 2 cores says so
    itself (its processes note). Elsewhere, or with a load given, the load average decides alone."""
    if loadavg is None and not runs:
        shared = others_share() if others is None else others
        if shared is not None:
            return _others_note(shared, cores_)
    busy, avg, n = load(cores_, loadavg, runs)
    if busy:
        return (f"The machine was busy while these ran (load average {avg:.1f} on {n} cores): more processes "
                f"than cores (other programs', or these runs' own) took turns on the same cores, so these "
                f"timings are lower and noisier than on a quiet machine, and comparisons between runs made "
                f"minutes apart can mislead.")
    return f"The machine was not overloaded while these ran (load average {avg:.1f} on {n} cores)."


# Other programs taking more than a quarter of this process's cores disturb a 2-process timing visibly.
OTHERS_BUSY = 0.25


def others_busy(cores_=None, share=None):
    """Whether programs other than this notebook's jobs disturbed its timings: measured where the OS
    allows (the load before the first job, and the others' share since), else the load average now."""
    share = others_share() if share is None else share
    if share is None:
        return load(cores_)[0]
    before = _START["load"]
    return (before is not None and before > (cores_ or cores())) or share > OTHERS_BUSY


def _others_note(share, cores_=None):
    n = cores_ or cores()
    before = "no load average" if _START["load"] is None else f"load average {_START['load']:.1f}"
    pct = f"{100 * share:.0f} % of the cores' time"
    if others_busy(n, share):
        return (f"The machine was busy while these ran: other programs took {pct} ({before} on {n} cores "
                f"before the first job), so these timings are lower and noisier than on a quiet machine, "
                f"and comparisons between runs made minutes apart can mislead.")
    return (f"The machine was quiet while these ran: {before} on {n} cores before the first job, and "
            f"other programs took {pct} since (this notebook's own jobs not counted).")


def _busy_seconds():
    """(seconds this process's cores spent busy, by anyone; seconds this process and its finished
    children used), or None where the OS has no /proc/stat."""
    import os
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    mine = {f"cpu{i}" for i in os.sched_getaffinity(0)}
    tick = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal: all but idle and iowait is a core at work
    # (steal too: a neighbouring VM held the core)
    busy = sum(sum(int(v) for i, v in enumerate(f[1:9]) if i not in (3, 4))
               for f in (line.split() for line in lines) if f and f[0] in mine)
    t = os.times()
    return busy / tick, t.user + t.system + t.children_user + t.children_system


def _mark():
    import time
    return dict(wall=time.monotonic(), cpu=_busy_seconds(), load=machine_load()[0])


# Taken when a notebook's set-up cell imports this module, before its first job.
_START = _mark()


def others_share(start=None):
    """The share of this process's cores' time that other programs took since `start` (default: since
    this module was imported); None where it cannot be measured. A job's processes are counted as this
    notebook's once the job has ended (the kernel has waited for them)."""
    start = start or _START
    now = _mark()
    if start["cpu"] is None or now["cpu"] is None or now["wall"] - start["wall"] < 1:
        return None
    machine = now["cpu"][0] - start["cpu"][0]
    own = now["cpu"][1] - start["cpu"][1]
    return max(0.0, machine - own) / ((now["wall"] - start["wall"]) * cores())
