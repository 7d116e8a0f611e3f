"""Lessons 09 to 09a2 (sharding: ZeRO and FSDP): run _trainup_fsdp.py with several --shard modes,
and read its 'sharding', 'shard_memory' and 'shard_comm' records (logs/README.md) into tables beside
the ZeRO formulas. Lessons 09a1 and 09a2 read lesson 09's runs where it left them (made_here).

    from lessons.bylesson import zero_stages
    names = sharding.run(2, "fsdp_n2")                  # one torchrun job, every mode: fsdp_n2_none, ...
    table = sharding.memory_table(["fsdp_n2"])          # bytes each rank holds, beside 4Ψ/4Ψ/8Ψ (÷N where sharded)
    sharding.check_memory(table)                        # every state within 10 % of its formula
"""
from pathlib import Path

from trainup import LOG_DIR
from trainup.parallel.sharding import (FP32_ADAM, MIXED_ADAM, MODES, SHARDED, STAGES, ZERO_STAGE,
                                       expected)

from .. import checks, jobs, launch
from ..log_reader import records as _records
from ..perfmodel import RING  # bytes a rank sends per byte of a collective's buffer
from ..report import QUICK, check, failed, left_here, read_run, save

TOLERANCE = 0.10  # measured within 10 % of the formula
STATES = ("param", "grad", "optim")
LABELS = {"none": "DDP", "optimizer": "ZeRO-1", "gradients": "ZeRO-2",
          "parameters": "ZeRO-3 (FSDP)", "gradients_fsdp": "ZeRO-2 (FSDP)"}
SHORT = {**{m: LABELS[m].split(" ")[0] for m in STAGES}, "gradients_fsdp": "ZeRO-2\nFSDP"}
# a tiny block stack: the job is start-up and collectives, the bytes scale with Ψ whatever its size
MODEL = ("--blocks", "4", "--width", "64")


def run(nproc, name, *args, modes=MODES, epochs=None):
    """One torchrun job of nproc processes running each --shard mode in turn; the run names, each checked."""
    argv, printed = launch.command("_trainup_fsdp.py", [*MODEL, "--shard", ",".join(modes), *args], name,
                                   nproc, QUICK)
    argv, printed = (argv + ["--epochs", str(epochs)], f"{printed} --epochs {epochs}") if epochs else (argv, printed)
    print(printed)
    proc = jobs.run(argv, timeout=900, env=launch.environment())
    if proc.returncode != 0:
        raise failed("torchrun", proc.stderr, proc.returncode)
    names = [name if len(modes) == 1 else f"{name}_{m}" for m in modes]
    for n in names:
        run = checks.finished(n)  # exit status 0 is not enough: the log must say finished, in the schema
        if len(run["epochs"]) >= 2:
            print(check(n))
        else:  # one epoch (a checkpoint saved, or a resumed run): no loss trend to state
            print(f"{n}: finished, epoch {run['epochs'][-1]['epoch']} trained, the log follows the schema.")
    return names


def made_here(nproc, name, modes=MODES):
    """The runs <name>_<mode> of lesson 09's job of nproc processes, for a later lesson: read where
    lesson 09 left them (finished, in this mode, their checkpoints there), made here where not, with
    lesson 09's flags (on Colab, or in a fresh clone, each notebook runs alone). Their names."""
    names = [f"{name}_{m}" for m in modes]
    missing = [m for m, n in zip(modes, names) if not left_here(n)]
    if len(missing) == 1:  # a job of one mode names its run as it is told, without the mode
        run(nproc, f"{name}_{missing[0]}", modes=missing)
    elif missing:
        run(nproc, name, modes=missing)
    kept = [m for m in modes if m not in missing]
    if kept:
        print(f"{name}: read where lesson 09 left it ({', '.join(kept)})")
    return names


def _value_bytes(name, log_dir):
    """Bytes of one parameter in the run: 8 under --precision 64 (a proof), else fp32's 4."""
    args = (read_run(Path(log_dir) / f"{name}.jsonl")["config"] or {}).get("args", {})
    return 8 if args.get("precision") == "64" else 4


def built(name, log_dir=LOG_DIR):
    """Each rank's parameter bytes when it built the model, before sharding (--meta-init: 0 but
    on rank 0)."""
    return _records(name, "sharding", log_dir)[0]["built_bytes"]


def step_ops(name, log_dir=LOG_DIR):
    """Rank 0's collectives in one step, as the run logged them: {op: {calls, bytes}}."""
    return _records(name, "shard_comm", log_dir)[0]["ops"]


def memory_table(names, log_dir=LOG_DIR):
    """One row per run and state: bytes per rank (largest and mean over the ranks) beside the fp32 Adam
    formula, their ratio, and the ZeRO paper's mixed-precision formula for the same Ψ and N."""
    import pandas as pd
    rows = []
    for name in names:
        for r in _records(name, "shard_memory", log_dir):
            psi, n = r["parameters"], r["world_size"]
            paper = expected(r["shard"], psi, n, MIXED_ADAM)
            for i, state in enumerate(STATES):
                per_rank = r[f"{state}_bytes"]
                rows.append(dict(run=name, shard=r["shard"], zero=LABELS[r["shard"]], N=n, psi=psi, state=state,
                                 sharded=SHARDED[r["shard"]][i], max_bytes=max(per_rank),
                                 mean_bytes=sum(per_rank) / n, formula_bytes=r["expected_bytes"][i],
                                 paper_bytes=paper[i]))
    t = pd.DataFrame(rows)
    t["max_vs_formula"] = t["max_bytes"] / t["formula_bytes"]
    t["mean_vs_formula"] = t["mean_bytes"] / t["formula_bytes"]
    return t


def totals(table):
    """Per run: all three states together, largest rank, beside both formulas (in units of Ψ bytes)."""
    g = table.groupby(["zero", "shard", "N"], sort=False)
    t = g[["max_bytes", "formula_bytes", "paper_bytes"]].sum().reset_index()
    psi = g["psi"].first().values
    t["measured_per_psi"] = t["max_bytes"] / psi
    t["fp32_formula_per_psi"] = t["formula_bytes"] / psi
    t["paper_formula_per_psi"] = t["paper_bytes"] / psi
    return t[["zero", "shard", "N", "measured_per_psi", "fp32_formula_per_psi", "paper_formula_per_psi"]]


def check_memory(table, tolerance=TOLERANCE):
    """Every state within tolerance of its formula on EVERY rank, except ZeRO-1's optimizer state:
    ZeroRedundancyOptimizer gives each rank whole tensors, so there only the mean over the ranks (the
    total split N ways) must be within tolerance. Returns one sentence."""
    for _, r in table.iterrows():
        exact = not (r["shard"] == "optimizer" and r["state"] == "optim")
        ratio = r["max_vs_formula"] if exact else r["mean_vs_formula"]
        checks.holds(abs(ratio - 1) <= tolerance,
                     f"{r['run']}: {r['state']} bytes per rank are {ratio:.2f}× the formula ({r['zero']}, N={r['N']})")
    return (f"All {len(table)} measured states are within {tolerance:.0%} of their formulas "
            f"(ZeRO-1's optimizer state: the mean over the ranks).")


def imbalance(table):
    """ZeRO-1's optimizer state: the largest rank against an even split (ZeroRedundancyOptimizer keeps whole tensors)."""
    z1 = table[(table["shard"] == "optimizer") & (table["state"] == "optim") & (table["N"] > 1)]
    return z1[["N", "max_bytes", "mean_bytes", "max_vs_formula"]].reset_index(drop=True)


def plot_memory(table, name):
    """Bytes per rank (largest rank) by mode and process count, stacked by state, with the formula's total as a dot."""
    import matplotlib.pyplot as plt
    runs = table.groupby(["shard", "N"], sort=False)
    ns = sorted(table["N"].unique())
    fig, axes = plt.subplots(1, len(ns), figsize=(3.2 * len(ns), 3.6), sharey=True, squeeze=False)
    colours = {"param": "tab:blue", "grad": "tab:orange", "optim": "tab:green"}
    for ax, n in zip(axes[0], ns):
        modes = [m for m in MODES if (m, n) in runs.groups]
        bottom = [0.0] * len(modes)
        for state in STATES:
            values = [float(runs.get_group((m, n)).set_index("state").loc[state, "max_bytes"]) / 2**10 for m in modes]
            ax.bar([SHORT[m] for m in modes], values, bottom=bottom, color=colours[state],
                   label={"param": "parameters", "grad": "gradients", "optim": "Adam state"}[state])
            bottom = [b + v for b, v in zip(bottom, values)]
        theory = [float(runs.get_group((m, n))["formula_bytes"].sum()) / 2**10 for m in modes]
        ax.plot([SHORT[m] for m in modes], theory, "k_", markersize=20, mew=2,
                label="formula (fp32 Adam)")
        ax.set(title=f"N = {n} process(es)", xlabel="")
        ax.tick_params(axis="x", labelrotation=45)  # side by side, the stage names would run together
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel("KiB per rank (largest rank)")
    axes[0][-1].legend(fontsize="small")
    save(fig, name)
    return fig


def largest_model(memory_gb=80, ns=(1, 8, 64), per_param=None):
    """Ψ (billions of parameters) whose model states fit memory_gb per device, by stage and N: memory /
    bytes per parameter per device (model states only: activations, buffers and fragmentation need more)."""
    import pandas as pd
    rows = []
    for label, bytes_ in (("fp32 Adam (4+4+8)", FP32_ADAM), ("mixed Adam (2+2+12)", MIXED_ADAM)):
        if per_param and bytes_ != per_param:
            continue
        for mode in STAGES:  # the paper's four: gradients_fsdp's peak holds whole parameters
            row = dict(precision=label, zero=LABELS[mode])
            for n in ns:
                per_psi = sum(expected(mode, 1, n, bytes_))
                row[f"N={n}"] = memory_gb * 1e9 / per_psi / 1e9
            rows.append(row)
    return pd.DataFrame(rows)


# Bytes a rank sends per byte of a collective's whole buffer, in a ring of N: an all-reduce is a reduce-scatter
# plus an all-gather, each (N-1)/N; a broadcast relayed around the ring about (N-1)/N on average.


def op_value_bytes(name, op, log_dir=LOG_DIR):
    """Bytes of one value as the op carries it: under --precision bf16 FSDP2's
    MixedPrecisionPolicy all-gathers parameters in bf16 (2 bytes) and reduces gradients in fp32
    (4); otherwise every op carries the run's parameter dtype (_value_bytes)."""
    args = (read_run(Path(log_dir) / f"{name}.jsonl")["config"] or {}).get("args", {})
    if args.get("precision") == "bf16":
        return 2 if op == "all_gather" else 4
    return _value_bytes(name, log_dir)


def comm_table(names, log_dir=LOG_DIR):
    """One row per run: rank 0's collectives in one step, calls and whole-buffer sizes in units of the
    model's size in values (Ψ; each op's bytes over the bytes of a value as it carries it, so a bf16
    all-gather counts as much as an fp32 one of the same values), and `sent_x_model`: the values one
    rank sends with ring algorithms, in the same unit."""
    import pandas as pd
    rows = []
    for name in names:
        for r in _records(name, "shard_comm", log_dir):
            n = r["world_size"]
            row = dict(run=name, zero=LABELS[r["shard"]], N=n)
            sent = 0.0
            for op in RING:
                calls, size = r["ops"].get(op, {}).get("calls", 0), r["ops"].get(op, {}).get("bytes", 0)
                model = op_value_bytes(name, op, log_dir) * r["parameters"]
                row[f"{op}_calls"], row[f"{op}_x_model"] = calls, size / model
                sent += RING[op](n) * size / model
            row["sent_x_model"] = sent
            rows.append(row)
    return pd.DataFrame(rows)


def started_at(name, log_dir=LOG_DIR):
    """The epoch a run started from (above 1: resumed from a sharded checkpoint) and the epochs it trained."""
    run = read_run(Path(log_dir) / f"{name}.jsonl")
    return _records(name, "sharding", log_dir)[-1]["start_epoch"], [e["epoch"] for e in run["epochs"]]


def zero_stage(mode):
    return ZERO_STAGE[mode]


def forward_table(names, log_dir=LOG_DIR):
    """Per run: the parameter bytes the largest rank holds after the step (at rest) and at the end
    of a forward (in use), in units of the whole model, beside the formula for the latter: whole,
    but under ZeRO-3 only the root group (stem, head) is still gathered, each block back to 1/N."""
    import pandas as pd
    rows = []
    for name in names:
        for r in _records(name, "shard_memory", log_dir):
            if "forward_param_bytes" not in r:
                continue
            whole, n = _value_bytes(name, log_dir) * r["parameters"], r["world_size"]
            share = block_share(name, log_dir)
            formula = 1 - share + share / n if r["shard"] == "parameters" else 1.0
            rows.append(dict(run=name, zero=LABELS[r["shard"]], N=n,
                             at_rest_x_model=max(r["param_bytes"]) / whole,
                             forward_x_model=max(r["forward_param_bytes"]) / whole,
                             forward_formula=formula))
    return pd.DataFrame(rows)


def block_share(name, log_dir=LOG_DIR):
    """The share of the model's parameters in its blocks (the groups FSDP gathers again for backward)."""
    r = _records(name, "sharding", log_dir)[-1]
    per_block = r["width"] * r["width"] + 3 * r["width"]  # Linear weight and bias, LayerNorm weight and bias
    return r["blocks"] * per_block / r["parameters"]
