"""Lesson 06b's zero-bubble schedules and looped BFS, read from the order their steps ran in.

    a stage's backward = I (the gradient for its input: the stage before waits for it)
                       + W (the gradients for its weights: only the optimizer step waits for them)

A zero-bubble schedule (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024) runs each I as
soon as it can and each W where the stage would otherwise wait; it keeps what W needs (the saved
activations and the output's gradient) until then. ZBV puts two stages on each rank in a V (rank
0 holds the first and the last stage); DualPipeV (DeepSeek-V3's DualPipe, cut in half) overlaps one
micro-batch's forward with another's backward. Looped BFS interleaves stages like interleaved 1F1B
but breadth first: every micro-batch through a rank's first stage before any enters its second.

The order of a step's work is the schedule's, the same on every machine; only its times are this
machine's. Every function here reads the order, or bytes, never a time.
"""
from trainup import LOG_DIR

from .schedules import COMPUTE, layout, measured_step, peak_activations


def order(name, log_dir=LOG_DIR):
    """{rank: [(kind, stage, micro-batch), ...]}: one measured step's compute, in the order each
    rank ran it (kind F, B, I or W)."""
    ranks, _ = measured_step(name, log_dir=log_dir)
    return {r: [(k, s, mb) for s, k, mb, _, _ in events if k in COMPUTE]
            for r, (_, events) in ranks.items()}


def backward_split(name, log_dir=LOG_DIR):
    """One row per rank: its backwards run whole (B), run split (an I, then a W), and the Ws
    deferred (other work ran between the I and its W: the W filled a gap later). Asserts that
    each stage's every micro-batch went forward once and backward once, whole or as I then W."""
    import pandas as pd
    rows = []
    for rank, ops in order(name, log_dir).items():
        at = {op: i for i, op in enumerate(ops)}
        assert len(at) == len(ops), f"{name}, rank {rank}: a piece of work ran twice"
        units = {(s, mb) for k, s, mb in ops}
        whole = split = deferred = 0
        for s, mb in units:
            assert ("F", s, mb) in at, f"{name}, rank {rank}: stage {s} never ran micro-batch {mb}"
            if ("B", s, mb) in at:
                assert ("I", s, mb) not in at and ("W", s, mb) not in at, (name, rank, s, mb)
                whole += 1
                continue
            i, w = at.get(("I", s, mb)), at.get(("W", s, mb))
            assert i is not None and w is not None and at[("F", s, mb)] < i < w, \
                f"{name}, rank {rank}: stage {s}, micro-batch {mb}: no backward, or W before I"
            split += 1
            deferred += w > i + 1
        rows.append(dict(run=name, schedule=layout(name, log_dir)["schedule"], rank=rank,
                         whole_B=whole, split_I_W=split, W_deferred=deferred))
    return pd.DataFrame(rows)


def breadth_first(name, log_dir=LOG_DIR):
    """Whether every rank sent every micro-batch through its first stage before any entered its
    second (looped BFS), rather than taking micro-batches deeper first (interleaved 1F1B)."""
    out = []
    for ops in order(name, log_dir).values():
        forwards = [s for k, s, _ in ops if k == "F"]
        first = min(forwards)
        last_first = max(i for i, s in enumerate(forwards) if s == first)
        out.append(all(s == first for s in forwards[:last_first + 1]))
    return all(out)


def memory(names, log_dir=LOG_DIR):
    """Each run's activation peaks: the most bytes each stage kept saved for backward, summed over
    the stages (a stage's peak: lesson 06's saved-tensor hook)."""
    import pandas as pd
    return pd.DataFrame([dict(run=n, schedule=layout(n, log_dir)["schedule"],
                              activation_mb=peak_activations(n, log_dir=log_dir).sum() / 2**20)
                         for n in names])
