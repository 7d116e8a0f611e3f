"""Solutions to lesson 08's exercises. Run: python notebooks/solutions/08_monitoring_and_profiling.py TRACE.json"""
import json
import sys
from pathlib import Path


def phase_shares(trace):
    """Exercise 1: per phase (the phase:* ranges inside the ProfilerStep#N ranges), its share of
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
        print(path)
        for phase, p in phase_shares(trace).items():
            mib = p["kept_bytes"] / 2**20
            print(f"  {phase}: {p['share']:.0%} of the steps, kept {mib:.1f} MiB")
