"""Solutions to lesson 05b's exercises.

Run: python notebooks/solutions/05b_inside_horovod.py [TIMELINE]
(TIMELINE: a Horovod timeline, such as logs/hvd_timeline.json, which lesson 05b writes)
"""
import json
import sys
from pathlib import Path


def ring_bytes(parameters, ranks, bytes_per_value=4, fp16_allreduce=False):
    """Exercise 1: bytes each rank sends (and receives) in one ring all-reduce of every gradient:
    2(N-1)/N times the gradients' size; --fp16-allreduce halves the values' size."""
    size = parameters * (2 if fp16_allreduce else bytes_per_value)
    return 2 * (ranks - 1) / ranks * size


def allreduce_share(timeline_path):
    """Exercise 2: from a Horovod timeline (chrome-trace JSON), each phase's share of the time
    spent inside the all-reduces, summed over the tensors: {phase: share}, largest first. Spans
    nest on a tensor's row (ALLREDUCE holds WAIT_FOR_DATA, MEMCPY_IN_FUSION_BUFFER,
    GLOO_ALLREDUCE, ...), so only the LEAVES inside an ALLREDUCE count: adding ALLREDUCE and its
    inner phases would count the same microseconds twice. NEGOTIATE_ALLREDUCE comes before the
    all-reduce and is waiting (for every rank to have the tensor ready), not all-reduce work:
    left out."""
    text = Path(timeline_path).read_text().strip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")
    open_at, total = {}, {}
    for e in events:
        if not isinstance(e, dict) or e.get("ph") not in ("B", "E"):
            continue
        stack = open_at.setdefault((e.get("pid"), e.get("tid")), [])
        if e["ph"] == "B":
            if stack:
                stack[-1]["leaf"] = False
            stack.append(dict(name=e.get("name", "?"), start=e["ts"], leaf=True))
        elif stack:
            span = stack.pop()
            in_allreduce = any(s["name"] == "ALLREDUCE" for s in [*stack, span])
            if span["leaf"] and in_allreduce:  # an ALLREDUCE with nothing inside counts as itself
                total[span["name"]] = total.get(span["name"], 0) + e["ts"] - span["start"]
    whole = sum(total.values()) or 1
    return dict(sorted(((k, v / whole) for k, v in total.items()), key=lambda kv: -kv[1]))


if __name__ == "__main__":
    print(f"{ring_bytes(1_199_882, 2) / 1e6:.1f} MB a step for the course's CNN on 2 ranks")
    if len(sys.argv) > 1:
        print(allreduce_share(sys.argv[1]))
