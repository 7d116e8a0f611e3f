"""Solutions to lesson 08a's exercises. Run: python notebooks/solutions/08a_profiling_ddp.py TRACE.json"""
import json
import sys
from pathlib import Path

COMM = ("c10d::", "gloo:", "nccl")


def _merge(ranges):
    out = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _overlap(x, y):
    return sum(max(0, min(b, d) - max(a, c)) for a, b in _merge(x) for c, d in _merge(y))


def _steps_and_comm(trace):
    ev = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"].startswith("ProfilerStep#")]
    comm = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"].startswith(COMM)]
    return ev, steps, comm


def communication_share(trace):
    """Exercise 1: the share of the recorded steps' time with a collective in flight, from the raw events:
    merge the collectives' ranges (they run on several threads at once), keep what lies inside the steps."""
    _, steps, comm = _steps_and_comm(trace)
    return _overlap(comm, steps) / sum(b - a for a, b in steps)


def exposed_communication(trace):
    """Exercise 2: the share of the steps in which a collective ran while the main thread computed nothing:
    the communication DDP failed to hide behind backward. The main thread is the one of the ProfilerStep
    ranges; its c10d hand-offs count as communication, not computation."""
    ev, steps, comm = _steps_and_comm(trace)
    main = next(e["tid"] for e in ev if e["name"].startswith("ProfilerStep#"))
    # the main thread's computing ranges: its operators, cut around its hand-offs
    handoffs = _merge((e["ts"], e["ts"] + e["dur"]) for e in ev if e["tid"] == main and e["name"].startswith(COMM))
    computing = []
    for a, b in _merge((e["ts"], e["ts"] + e["dur"]) for e in ev if e["tid"] == main and e.get("cat") == "cpu_op"):
        for c, d in handoffs:
            if c < b and d > a:
                if c > a:
                    computing.append((a, c))
                a = max(a, d)
        if b > a:
            computing.append((a, b))
    in_steps = [(max(a, c), min(b, d)) for a, b in _merge(comm) for c, d in steps if min(b, d) > max(a, c)]
    hidden = _overlap(in_steps, computing)
    return (sum(b - a for a, b in _merge(in_steps)) - hidden) / sum(b - a for a, b in steps)


if __name__ == "__main__":
    for path in sys.argv[1:]:
        trace = json.loads(Path(path).read_text())
        print(f"{path}: communication {communication_share(trace):.0%} of the steps, "
              f"not hidden behind computation {exposed_communication(trace):.0%}")
