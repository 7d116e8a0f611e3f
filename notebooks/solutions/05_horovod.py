"""Solutions to lesson 05's exercises. Run: python notebooks/solutions/05_horovod.py"""
import json
import sys
from pathlib import Path


def scaled_lr(base_lr, size, epoch, warmup_epochs=5):
    """Exercise 1: what Horovod's docs recommend, done by hand (Horovod itself changes nothing):
    the rate grows linearly from base_lr to base_lr * size over the warm-up epochs, then stays there."""
    target = base_lr * size
    if warmup_epochs <= 0 or epoch >= warmup_epochs:
        return target
    return base_lr + (target - base_lr) * epoch / warmup_epochs


def ring_bytes(parameters, ranks, bytes_per_value=4, fp16_allreduce=False):
    """Exercise 2: bytes each rank sends (and receives) in one ring all-reduce of every gradient:
    2(N-1)/N times the gradients' size; --fp16-allreduce halves the values' size."""
    size = parameters * (2 if fp16_allreduce else bytes_per_value)
    return 2 * (ranks - 1) / ranks * size


def allreduce_share(timeline_path):
    """Exercise 3: from a Horovod timeline (chrome-trace JSON), each phase's share of the time
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


def micro_weights(sizes, how="samples"):
    """Exercise 4: the weight each micro-batch's MEAN gradient gets in one accumulated step of
    micro-batches of these sizes: "divide_by_k" (Horovod's examples divide each loss by the number
    of sub-batches K: 1/K each) or "samples" (this course: n_i / sum(n), the mean over the step's
    samples). Equal sizes give the same weights; a short micro-batch gets more than its share
    with 1/K."""
    if how == "divide_by_k":
        return [1 / len(sizes)] * len(sizes)
    if how == "samples":
        return [n / sum(sizes) for n in sizes]
    raise ValueError(f"how is 'divide_by_k' or 'samples', not {how!r}")


if __name__ == "__main__":
    print([round(scaled_lr(0.1, 4, e), 3) for e in range(7)])
    print(f"{ring_bytes(1_199_882, 2) / 1e6:.1f} MB a step for the course's CNN on 2 ranks")
    print(micro_weights([16, 16, 4], "divide_by_k"), micro_weights([16, 16, 4]))
    if len(sys.argv) > 1:
        print(allreduce_share(sys.argv[1]))
