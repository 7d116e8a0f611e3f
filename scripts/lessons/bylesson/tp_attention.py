"""Lesson 09ca's transformer runs (_trainup_tp_sp.py): one step's collectives over tp against
Megatron-LM's counts, with and without sequence parallelism, and the bytes a ring moves for them.

    from lessons.bylesson import tp_attention as tpa
    tpa.expected("tpa_sp2")                  # {(phase, op): (calls, bytes)}, each from its source
    t = tpa.comm_check(["tpa_2", "tpa_sp2"])  # measured beside expected, one row per collective
    tpa.about_comm(t)                        # a sentence per run, computed
"""
from pathlib import Path

from trainup import LOG_DIR

from ..log_reader import read_run
from ..report import save
from .tp_runs import comm_table, label, layout, records

PHASES = ("forward", "backward", "step")


def value_bytes(name, log_dir=LOG_DIR):
    """Bytes of one value in the run: 8 in a --precision 64 run (the proofs), else 4."""
    args = (read_run(Path(log_dir) / f"{name}.jsonl")["config"] or {}).get("args", {})
    return 8 if args.get("precision") == "64" else 4


def expected(name, log_dir=LOG_DIR):
    """What one training step sends over tp, as Megatron-LM (Shoeybi et al. 2019) and, with
    sequence parallelism, Korthikanti et al. (2022) count it: {(phase, op): (calls, bytes)}.
    The phase "backward" starts where the model's forward ends, so the loss's collectives are in
    it. An activation is batch x tokens x width values."""
    cfg, rec = layout(name, log_dir), records(name, "tp_comm", log_dir)[-1]
    if cfg["tp"] == 1:
        return {}
    v, layers, batch = value_bytes(name, log_dir), cfg["blocks"], rec["per_replica_batch"]
    act = batch * cfg["tokens"] * cfg["width"] * v
    loss = (3, 3 * batch * v)  # loss_parallel: each sample's max, sum of exp, target's score
    cut = 2 * layers + 1  # 2 a layer (attention, MLP) and the model's end: embedding or head
    if not cfg["sequence_parallel"]:  # forward: after proj and fc2; backward: their inputs' grads
        return {("forward", "all_reduce"): (2 * layers, 2 * layers * act),  # + the head's input
                ("backward", "all_reduce"): (cut + loss[0], cut * act + loss[1])}
    norms = 2 * (2 * layers + 1)  # weight and bias of 2 LayerNorms a layer and the final one
    return {("forward", "reduce_scatter"): (cut, cut * act),  # proj, fc2 and the embedding
            ("forward", "all_gather"): (cut, cut * act),      # before attn, mlp and the head
            ("backward", "all_gather"): (cut, cut * act),
            ("backward", "reduce_scatter"): (cut, cut * act),
            ("backward", "all_reduce"): (loss[0] + norms, loss[1] + norms * cfg["width"] * v)}


def comm_check(names, log_dir=LOG_DIR):
    """One row per run and collective over tp on rank 0: calls and bytes measured, and expected."""
    import pandas as pd
    rows = []
    for name in names:
        want, t = expected(name, log_dir), comm_table(name, log_dir)
        got = {(r["phase"], r["op"]): (int(r["calls"]), int(r["bytes"]))
               for _, r in t[t["dimension"] == "tp"].iterrows()}
        for key in sorted(set(want) | set(got), key=lambda k: (PHASES.index(k[0]), k[1])):
            (calls, size), (want_calls, want_size) = got.get(key, (0, 0)), want.get(key, (0, 0))
            rows.append(dict(run=name, layout=about(name, log_dir), phase=key[0], op=key[1],
                             calls=calls, bytes=size, expected_calls=want_calls,
                             expected_bytes=want_size,
                             as_counted=(calls, size) == (want_calls, want_size)))
    return pd.DataFrame(rows)


def about(name, log_dir=LOG_DIR):
    cfg = layout(name, log_dir)
    return label(cfg) + (" + sequence parallel" if cfg.get("sequence_parallel") else "")


def sent(t, log_dir=LOG_DIR):
    """t with "sent": the bytes each rank sends for each row on a ring: an all-reduce of M bytes
    sends 2(tp-1)/tp M, an all-gather or a reduce-scatter (tp-1)/tp M."""
    share = t["run"].map(lambda name: 1 - 1 / layout(name, log_dir)["tp"])
    return t.assign(sent=share * t["bytes"] * t["op"].map({"all_reduce": 2}).fillna(1))


def ring_bytes(t, log_dir=LOG_DIR):
    """Bytes each rank sends in the step on a ring, per run (sent())."""
    rows = sent(t, log_dir)
    return {name: float(g["sent"].sum()) for name, g in rows.groupby("run", sort=False)}


def about_ring(ring, tp_alone, with_sp):
    """The sentence comparing the bytes of the two runs, its direction computed."""
    a, b = ring[tp_alone], ring[with_sp]
    way = "as many" if a == b else (f"{b / a:.2f}× as many" if b > a else f"{a / b:.2f}× fewer")
    return (f"On a ring each process sends {a:,.0f} bytes a step with tensor parallelism alone "
            f"and {b:,.0f} with sequence parallelism: {way} (per layer the same; the model's "
            f"two ends and the LayerNorms' small sums differ).")


def ring_plot(t, name, log_dir=LOG_DIR):
    """Bytes each rank sends on a ring in one step, per run, stacked by collective and phase."""
    import matplotlib.pyplot as plt
    t = sent(t, log_dir)
    fig, ax = plt.subplots(figsize=(9, 3))
    runs = list(dict.fromkeys(t["layout"]))
    bottom = {r: 0.0 for r in runs}
    for (phase, op), g in t.groupby(["phase", "op"], sort=False):
        values = [float(g.loc[g["layout"] == r, "sent"].sum()) / 1e6 for r in runs]
        ax.barh(runs, values, left=[bottom[r] for r in runs], label=f"{op} ({phase})")
        for r, v in zip(runs, values):
            bottom[r] += v
    ax.set_xlabel("MB each process sends on a ring, one step")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    save(fig, name)
    return fig


def about_comm(t, log_dir=LOG_DIR):
    """A sentence per run: its collectives over tp against the counts, and the bytes sent."""
    out = []
    for name, g in t.groupby("run", sort=False):
        ops = ", ".join(f"{r.calls} {r.op.replace('_', '-')}(s) in {r.phase}"
                        for r in g.itertuples())
        verdict = ("as Megatron-LM counts" if g["as_counted"].all() else
                   "NOT as Megatron-LM counts: " + ", ".join(
                       f"{r.phase} {r.op} {r.calls} against {r.expected_calls}"
                       for r in g.itertuples() if not r.as_counted))
        out.append(f"{g['layout'].iloc[0]}: {ops}, {verdict}.")
    return out
