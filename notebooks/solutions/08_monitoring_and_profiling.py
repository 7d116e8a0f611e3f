"""Solutions to lesson 08's exercises. Run: python notebooks/solutions/08_monitoring_and_profiling.py TRACE.json"""
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


def ranks_to_tensorboard(run, tb_dir, log_dir):
    """Exercise 3: each rank's own training loss (the 'ranks' records of a DDP log) as one TensorBoard run per
    rank, so that TensorBoard draws them on one chart under the same tag; returns what reads back."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter
    records = [json.loads(line) for line in (Path(log_dir) / f"{run}.jsonl").read_text().splitlines()]
    ranks = [r for r in records if r["type"] == "ranks"]
    back = {}
    for rank in ranks[0]["rank"]:
        folder = Path(tb_dir) / run / f"rank{rank}"
        with SummaryWriter(str(folder)) as w:
            for r in ranks:
                w.add_scalar("train/loss_of_this_rank", r["loss"][rank], r["epoch"])
        acc = EventAccumulator(str(folder))
        acc.Reload()
        back[rank] = [(s.step, s.value) for s in acc.Scalars("train/loss_of_this_rank")]
    return back


def phase_shares(trace):
    """Exercise 4: per phase (the phase:* ranges inside the ProfilerStep#N ranges), its share of
    the steps' time and the bytes it kept: its [memory] events' Bytes (allocations positive, frees
    negative)."""
    ev = trace["traceEvents"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in ev
             if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")]
    ranges = [(e["name"][len("phase:"):], e["ts"], e["ts"] + e["dur"]) for e in ev
              if e.get("ph") == "X" and e["name"].startswith("phase:")
              and any(a <= e["ts"] < b for a, b in steps)]
    total = sum(b - a for a, b in steps)
    out = {}
    for phase in dict.fromkeys(p for p, _, _ in ranges):  # in the order they first ran
        mine = [(a, b) for p, a, b in ranges if p == phase]
        kept = sum(e["args"]["Bytes"] for e in ev if e.get("name") == "[memory]"
                   and any(a <= e["ts"] < b for a, b in mine))
        out[phase] = dict(share=sum(b - a for a, b in mine) / total, kept_bytes=kept)
    return out


if __name__ == "__main__":
    for path in sys.argv[1:]:
        trace = json.loads(Path(path).read_text())
        print(f"{path}: communication {communication_share(trace):.0%} of the steps, "
              f"not hidden behind computation {exposed_communication(trace):.0%}")
        for phase, p in phase_shares(trace).items():
            mib = p["kept_bytes"] / 2**20
            print(f"  {phase}: {p['share']:.0%} of the steps, kept {mib:.1f} MiB")
