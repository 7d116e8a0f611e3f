"""Sentences about measured results, built from the numbers: the direction of a claim is computed, not
typed, and printed only where the runs decide it.

    claims.trend([4, 16, 64], [[18, 19, 18], [62, 60, 63], [180, 176, 181]])  # 'rises'
    claims.trend([4, 16, 64], [18, 62, 180])          # one run a point: 'cannot tell ...'
    claims.trend([1, 2, 3], [2.3, 1.1, 0.6], noise=0)  # exact values (a seeded run's loss): 'falls'
    claims.curve([4, 16, 64], [18, 62, 180], "Throughput", "batch size", "samples/s", noise=0.1)
    claims.ratio([183, 181, 186], [85, 86, 84])       # '2.1× faster'
    claims.compare(183.7, 85.7, "one thread")         # one run each: says the runs cannot tell
    claims.load_note()                                # was the machine busy while the cells ran?

A point is one value or the values of repeated runs. A difference between two points is a direction
("rises", "faster") only when it is beyond the noise: with at least REPEATS runs a point, their
ranges do not overlap; or, given `noise` (a relative noise floor measured for such numbers, or 0 for
exact values such as a seeded run's loss), the medians differ by more than it. Otherwise the
sentence says the runs cannot tell. The unit tests feed them noisy numbers.
"""
import statistics
from pathlib import Path

from trainup import LOG_DIR
from trainup.metrics import machine_load

REPEATS = 3  # the fewest repeated runs a point whose spread decides a direction
CANNOT_TELL = "cannot be told from noise"


def _values(point):
    values = list(point) if isinstance(point, (list, tuple)) else [point]
    if not values:
        raise ValueError("a point needs at least one value")
    return [float(v) for v in values]


def step(a, b, noise=None):
    """+1 (b beyond a), -1 (below), 0 (within the noise) or None (the runs cannot tell)."""
    a, b = _values(a), _values(b)
    ma, mb = statistics.median(a), statistics.median(b)
    if len(a) >= REPEATS and len(b) >= REPEATS:
        if min(b) > max(a):
            return 1
        if max(b) < min(a):
            return -1
        return 0
    if noise is None:
        return None
    if abs(mb - ma) <= noise * max(abs(ma), abs(mb)):
        return 0
    return 1 if mb > ma else -1


def _how_many(ys):
    counts = sorted({len(_values(y)) for y in ys})
    n = counts[0]
    return f"{n} run{'s' if n > 1 else ''} a point"


def trend(xs, ys, noise=None):
    """The shape of a curve, step by step: 'rises', 'falls', 'stays within the noise', joined by
    'then' where the direction changes ('rises, then flattens', 'rises, then falls'); or, where the
    runs cannot decide, a phrase that starts with CANNOT_TELL."""
    pairs = sorted(zip(xs, ys), key=lambda p: p[0])
    if len(pairs) < 2:
        raise ValueError("a trend needs at least two points")
    ys = [y for _, y in pairs]
    steps = [step(a, b, noise) for a, b in zip(ys, ys[1:])]
    if None in steps:
        return (f"{CANNOT_TELL} ({_how_many(ys)}: at least {REPEATS} are needed, or a measured "
                f"noise floor)")
    runs = [s for i, s in enumerate(steps) if i == 0 or s != steps[i - 1]]
    first = {1: "rises", -1: "falls", 0: "stays within the noise"}[runs[0]]
    later = {1: "rises", -1: "falls", 0: "flattens"}
    return ", then ".join([first] + [later[s] for s in runs[1:]])


def decided(phrase):
    """Whether a phrase of trend(), ratio() or compare() states a direction the runs decide."""
    return not phrase.startswith(CANNOT_TELL) and "cannot tell" not in phrase


def curve(xs, ys, what, along, unit="", digits=0, noise=None):
    """One sentence: how `what` (its subject, written as it should start) changes along `along`, with
    its first and last values (medians where a point holds repeated runs)."""
    pairs = sorted(zip(xs, ys), key=lambda p: p[0])
    (x0, y0), (x1, y1) = pairs[0], pairs[-1]
    y0, y1 = statistics.median(_values(y0)), statistics.median(_values(y1))
    u = f" {unit}" if unit else ""
    if len(pairs) < 2:
        return f"{what}: one point only, {y0:,.{digits}f}{u} at {x0}."
    shape = trend(xs, [y for _, y in pairs], noise)
    ends = (f"{y0:,.{digits}f}{u} at {x0} and {y1:,.{digits}f}{u} at {x1} "
            f"({y1 / y0:.1f}× the first)")
    if not decided(shape):
        return f"{what} with {along}: {ends}; its direction {shape}."
    return f"{what} {shape} with {along}: {ends}."


def ratio(new, old, noise=None):
    """Throughputs (bigger is faster), each one value or repeated runs: '2.1× faster', '1.3× slower',
    'about as fast (1.03×, ...)' within the noise, or the ratio with 'the runs cannot tell'."""
    a, b = _values(new), _values(old)
    if not (min(a) > 0 and min(b) > 0):
        raise ValueError(f"throughputs must be positive, got {new} and {old}")
    r = statistics.median(a) / statistics.median(b)
    direction = step(b, a, noise)
    if direction is None:
        n = min(len(a), len(b))
        return (f"{r:.2f}× as fast, but from {n} run{'s' if n > 1 else ''} each the runs cannot "
                f"tell that from noise")
    if direction == 0:
        return f"about as fast ({r:.2f}×, within the noise)"
    return f"{r:.1f}× faster" if r > 1 else f"{1 / r:.1f}× slower"


def compare(new, old, other, noise=None):
    """'2.1× faster than <other>', '1.3× slower than <other>', 'about as fast as <other> (...)', or
    the ratio to <other> with 'the runs cannot tell'."""
    r = ratio(new, old, noise)
    if r.startswith("about"):
        return f"about as fast as {other} {r[len('about as fast '):]}"
    if not decided(r):
        return r.replace(" as fast,", f" as fast as {other},", 1)
    return f"{r} than {other}"


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
