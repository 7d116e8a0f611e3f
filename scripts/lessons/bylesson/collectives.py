"""Lesson 04, inside DDP: the collectives, all_reduce bandwidth, what DDP does, and its mistakes.

Runs scripts/_trainup_collectives.py under torchrun and reads its records (logs/README.md) back into
tables, plots and sentences worked out from them, each checked: a wrong result raises AssertionError.

    from lessons.bylesson import collectives
    collectives.run("collectives", name="coll")           # torchrun, 2 processes
    collectives.check_collectives("coll")                  # every rank's result is what the op defines
    collectives.key_line(collectives.fail("hang", "--timeout", 3))   # the error line of a failed job
"""
import re
from pathlib import Path

from trainup import CHECKPOINT_DIR, LOG_DIR

from .. import jobs, launch
from ..report import QUICK, failed, forget, read_run, save

SCRIPT = "_trainup_collectives.py"
# What each failure says; the first line of a job's output that matches is shown.
KEY_LINES = {"mismatch": r"Detected mismatch between collectives.*?(?=Collectives differ|$)",
             "hang": r"Timed out waiting \d+ms for \w+ operation to complete",
             "wrong": r"rank \d: all_reduce returned .*",
             "closed": r"Connection closed by peer"}


def ring_factor(world):
    """How many times each byte's worth of data crosses a link in a ring all-reduce: 2(N-1)/N."""
    return 2 * (world - 1) / world


def bus_bandwidth(size_bytes, seconds, world):
    """nccl-tests: algbw = size / time; busbw = algbw * 2(N-1)/N (comparable across N, against the link)."""
    algbw = size_bytes / seconds
    return algbw * ring_factor(world)


def _command(show, args, name, nproc):
    flags = launch.torchrun_flags(nproc=nproc)
    part = [f"scripts/{SCRIPT}", "--show", show, *map(str, args)] + (["--run-name", name] if name else [])
    part += ["--quick"] * QUICK
    return flags, part


def run(show, *args, name, nproc=2, timeout=600, env=None):
    """One torchrun job of the collectives script; prints the command and rank 0's output."""
    flags, part = _command(show, args, name, nproc)
    forget(name)  # from nothing, however often the cell runs
    print(launch.shown(flags, part))
    proc = jobs.run(launch.TORCHRUN + flags + part, timeout=timeout, env=launch.environment(env))
    if proc.returncode != 0:
        raise failed("torchrun", proc.stderr, proc.returncode)
    print("\n".join(line for line in proc.stdout.splitlines() if not line.startswith("finished:")))
    finished(name)
    return name


def fail(show, *args, nproc=2, timeout=300, env=None):
    """A job that must fail: asserts it did, and returns its whole output."""
    flags, part = _command(show, args, None, nproc)
    shown = " ".join(f"{k}={v}" for k, v in (env or {}).items())
    print(launch.shown(flags, part).replace("$ ", f"$ {shown} " if shown else "$ ", 1))
    proc = jobs.run(launch.TORCHRUN + flags + part, timeout=timeout, env=launch.environment(env))
    assert proc.returncode != 0, f"the {show} job was meant to fail and exited with status 0"
    print(f"exit status {proc.returncode} (the job failed, as it should)")
    return proc.stdout + proc.stderr


def key_line(output, kind):
    """The line of a failed job's output that says what went wrong (its first match of KEY_LINES[kind])."""
    match = re.search(KEY_LINES[kind], output)
    errors = [line for line in output.splitlines() if "Error" in line]
    assert match, f"no {kind!r} line in the job's output; its errors:\n" + "\n".join(errors[:10])
    return match.group(0).strip()


def finished(name, log_dir=LOG_DIR):
    run = read_run(Path(log_dir) / f"{name}.jsonl")
    assert not run["problems"], f"{name}: the log does not follow the schema: {run['problems']}"
    assert run["summary"] and run["summary"]["status"] == "finished", f"{name}: the job did not finish"
    return run


def records(name, kind, log_dir=LOG_DIR):
    return [r for r in finished(name, log_dir)["extra"] if r["type"] == kind]


# The four collectives

def expected(op, before, world):
    """What each rank must hold after op, worked out from every rank's tensor before it."""
    if op == "broadcast":
        return [before[0]] * world
    if op == "all_reduce":
        return [[sum(col) for col in zip(*before)]] * world
    if op == "all_gather":
        return [before] * world
    if op == "reduce_scatter":
        total = [sum(col) for col in zip(*before)]
        chunk = len(total) // world
        return [total[r * chunk:(r + 1) * chunk] for r in range(world)]
    raise ValueError(op)


def check_collectives(name, log_dir=LOG_DIR):
    """Every rank's result equals what the collective defines; returns one sentence per collective."""
    out = []
    recs = records(name, "collective", log_dir)
    assert [r["op"] for r in recs] == ["broadcast", "all_reduce", "all_gather", "reduce_scatter"], recs
    for r in recs:
        want = expected(r["op"], r["before"], r["world_size"])
        assert r["after"] == want, f"{r['op']}: the ranks hold {r['after']}, expected {want}"
        out.append(f"{r['op']}: all {r['world_size']} ranks hold what it defines")
    return "; ".join(out) + "."


def about_reduce_scatter(name, log_dir=LOG_DIR):
    how = [r for r in records(name, "collective", log_dir) if r["op"] == "reduce_scatter"][0]["how"]
    if how == "dist.reduce_scatter":
        return "gloo ran dist.reduce_scatter itself on CPU tensors (this torch's gloo supports it)."
    return f"gloo could not run dist.reduce_scatter here, so it was built as {how}."


# all_reduce against message size

def bandwidth_table(name, log_dir=LOG_DIR):
    import pandas as pd
    t = pd.DataFrame(records(name, "allreduce_bw", log_dir))
    t = t[["size_bytes", "world_size", "repeats", "time_s", "algbw_gbps", "busbw_gbps", "ring_factor"]]
    for _, row in t.iterrows():  # the log's bandwidths follow nccl-tests' definitions
        assert abs(row["algbw_gbps"] - row["size_bytes"] / row["time_s"] / 1e9) < 1e-9 * max(1, row["algbw_gbps"])
        assert abs(row["busbw_gbps"] - bus_bandwidth(row["size_bytes"], row["time_s"], row["world_size"]) / 1e9) \
            < 1e-9 * max(1, row["busbw_gbps"])
    return t.assign(time_ms=t["time_s"] * 1e3)


# nccl-tests' bus factors of the other ops (all_reduce's: ring_factor): the bytes one rank's link
# carries, over the size
BUS_FACTOR = {"all_gather": lambda n: (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
              "broadcast": lambda n: 1.0}


def op_table(name, op, log_dir=LOG_DIR):
    """One collective's sweep (--show bandwidth --ops ...): all_reduce's as bandwidth_table reads
    it, another op's from its collective_bw records, checked against nccl-tests' definitions."""
    import pandas as pd
    if op == "all_reduce":
        return bandwidth_table(name, log_dir)
    t = pd.DataFrame([r for r in records(name, "collective_bw", log_dir) if r["op"] == op])
    assert len(t), f"{name}: no {op} in its sweep (--show bandwidth --ops {op})"
    t = t[["size_bytes", "world_size", "repeats", "time_s", "algbw_gbps", "busbw_gbps",
           "bus_factor"]]
    for _, row in t.iterrows():
        algbw = row["size_bytes"] / row["time_s"] / 1e9
        bus = BUS_FACTOR[op](row["world_size"])
        assert abs(row["algbw_gbps"] - algbw) < 1e-9 * max(1, algbw) and row["bus_factor"] == bus
        assert abs(row["busbw_gbps"] - algbw * bus) < 1e-9 * max(1, algbw)
    return t.assign(time_ms=t["time_s"] * 1e3)


def swept_ops(name, log_dir=LOG_DIR):
    """The collectives a sweep timed: all_reduce, and those of its collective_bw records."""
    others = {r["op"] for r in records(name, "collective_bw", log_dir)}
    return ["all_reduce"] + sorted(others)


def bandwidth_plot(t, name):
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6))
    a.loglog(t["size_bytes"], t["time_ms"], "o-")
    a.set(xlabel="message size (bytes)", ylabel="all_reduce time (ms)", title="time against size")
    b.semilogx(t["size_bytes"], t["algbw_gbps"], "o-", label="algbw = size / time")
    b.semilogx(t["size_bytes"], t["busbw_gbps"], "s--", label=f"busbw = algbw x 2(N-1)/N, N={t['world_size'].iloc[0]}")
    b.set(xlabel="message size (bytes)", ylabel="GB/s", title="bandwidth against size")
    b.legend(fontsize="small")
    for ax in (a, b):
        ax.grid(alpha=0.3, which="both")
    save(fig, name)
    return fig


def about_bandwidth(t):
    """Sentences worked out from the measured table: how time and bandwidth change with size."""
    t = t.sort_values("size_bytes")
    t = t.astype({"size_bytes": int})
    small, large = t.iloc[0], t.iloc[-1]
    ratio_size, ratio_time = large["size_bytes"] / small["size_bytes"], large["time_s"] / small["time_s"]
    best = t.loc[t["busbw_gbps"].idxmax()]
    n = int(t["world_size"].iloc[0])
    return (f"From {int(small['size_bytes']):,} to {int(large['size_bytes']):,} bytes the message grew {ratio_size:,.0f}x and "
            f"the time {ratio_time:,.1f}x: " + ("small messages cost a fixed latency more than their bytes, "
                                                if ratio_time < ratio_size / 10 else "time grew about with size, ")
            + f"so the bandwidth {'rises' if best['size_bytes'] > small['size_bytes'] else 'does not rise'} with size, "
            f"up to {best['busbw_gbps']:.2f} GB/s bus bandwidth at {int(best['size_bytes']):,} bytes. With N={n} the ring "
            f"factor 2(N-1)/N is {ring_factor(n):.2f}" + (", so busbw equals algbw here; with 8 GPUs it would be "
                                                           f"{ring_factor(8):.2f}." if n == 2 else "."))


# What DDP does

def about_broadcast(name, log_dir=LOG_DIR):
    r = records(name, "ddp_broadcast", log_dir)[0]
    differed = len(set(r["params_before"])) > 1 and len(set(r["buffers_before"])) > 1
    equal = len(set(r["params_after"])) == 1 and len(set(r["buffers_after"])) == 1
    assert differed, f"{name}: the ranks were meant to start different: {r}"
    assert equal, f"{name}: after DDP(model) the ranks still differ: {r}"
    assert r["params_after"][0] == r["params_before"][0], "rank 0's parameters were not the ones broadcast"
    return (f"Before DDP(model) the {r['world_size']} ranks held different parameters (sums "
            f"{', '.join(f'{v:.4f}' for v in r['params_before'])}) and buffers; after it every rank holds rank 0's "
            f"(sum {r['params_after'][0]:.4f}), BatchNorm's running statistics included.")


def buckets_table(name, log_dir=LOG_DIR):
    import pandas as pd
    t = pd.DataFrame(records(name, "ddp_buckets", log_dir))
    t["bucket_kib"] = t["bucket_mb"].map(lambda m: [round(v * 1024, 1) for v in m])
    return t[["bucket_cap_mb", "buckets", "bucket_kib", "allreduce_calls", "before_backward_end", "step_s"]]


def about_buckets(t):
    t = t.sort_values("bucket_cap_mb", ascending=False)
    counts = t["buckets"].tolist()
    assert counts == sorted(counts) and counts[-1] > counts[0], f"smaller caps should make more buckets: {counts}"
    overlapped = t[t["before_backward_end"] > 0]
    assert len(overlapped), "no all-reduce started before backward ended, whatever the bucket size"
    caps = ", ".join(f"{c:g} MB: {b}" for c, b in zip(t["bucket_cap_mb"], counts))
    first = overlapped.iloc[0]
    return (f"Buckets per backward pass by bucket_cap_mb ({caps}): a smaller cap means more, smaller all-reduces. "
            f"With {first['bucket_cap_mb']:g} MB, {first['before_backward_end']} all-reduce(s) started before backward "
            f"had computed its last gradient: communication overlaps the rest of backward. With one bucket, "
            f"{'nothing can' if t.iloc[0]['before_backward_end'] == 0 else 'still some'} overlap.")


def about_step(name, log_dir=LOG_DIR):
    r = records(name, "ddp_step", log_dir)[0]
    assert len(set(r["params_after"])) == 1, f"the ranks differ after a step: {r['params_after']}"
    assert all(a != b for a, b in zip(r["params_before"], r["params_after"])), "a rank did not step"
    return (f"After one backward and optimizer.step() on every rank, each of the {r['world_size']} ranks changed its "
            f"own copy (parameter sum {r['params_before'][0]:.4f} -> {r['params_after'][0]:.4f} on every rank): "
            f"each rank runs the optimizer; the copies stay equal because the averaged gradients are.")


def about_bn_stats(name, log_dir=LOG_DIR):
    r = records(name, "bn_stats", log_dir)[0]
    assert r["running_mean_rank_diff"] > 1e-6, "the ranks' BatchNorm running means were meant to differ"
    assert max(r["allreduced_mean_vs_full"]) < 1e-5 < min(r["local_mean_vs_full"]), r
    return (f"After one forward under DDP the ranks' BatchNorm running means differ by up to "
            f"{r['running_mean_rank_diff']:.1e}: each normalised with its own half-batch (its batch mean is off the "
            f"global batch's by up to {max(r['local_mean_vs_full']):.1e}). Combined over the ranks (here the "
            f"per-rank means averaged with one all_reduce; SyncBatchNorm all-gathers each rank's mean, inverse "
            f"deviation and count and weighs them, and all-reduces again in backward), the mean equals the "
            f"global batch's to {max(r['allreduced_mean_vs_full']):.0e}.")


# Accumulation, learning rates, SyncBatchNorm

def parameter_difference(a, b, checkpoint_dir=CHECKPOINT_DIR):
    """The largest difference between two runs' checkpointed parameters and buffers (no threshold)."""
    import torch
    sa, sb = (torch.load(Path(checkpoint_dir) / f"{n}.pt", map_location="cpu", weights_only=True)["model"]
              for n in (a, b))
    return max(float((sa[k].double() - sb[k].double()).abs().max()) for k in sa if sa[k].numel())


def accumulate_table(names, log_dir=LOG_DIR):
    import pandas as pd
    rows = []
    for name in names:
        recs = records(name, "accumulate", log_dir)
        rows.append(dict(run=name, accumulate=recs[-1]["accumulate"], micro_batch=recs[-1]["micro_batch"],
                         backward_passes=recs[-1]["micro_batches"], allreduce_calls=recs[-1]["allreduce_calls"]))
    return pd.DataFrame(rows)


def lr_table(names, log_dir=LOG_DIR):
    from ..report import load_epochs, load_runs
    runs = load_runs(names, log_dir)
    epochs = load_epochs(names, log_dir)
    lr = {name: read_run(Path(log_dir) / f"{name}.jsonl")["config"]["args"] for name in names}
    runs = runs.assign(lr=runs["run"].map(lambda n: lr[n]["lr"]),
                       warmup=runs["run"].map(lambda n: lr[n].get("warmup_steps") or 0),
                       steps=runs["run"].map(lambda n: -(-epochs[epochs["run"] == n]["samples"].iloc[0]
                                                          // lr[n]["batch_size"])))
    return runs[["run", "batch_size", "lr", "warmup", "steps", "first_loss", "loss", "test_accuracy"]], epochs


def error_sentence(script, *args, env=None, timeout=300):
    """Run scripts/<script> with flags that must be refused: asserts one sentence and a non-zero exit."""
    import sys
    cmd = [sys.executable, f"scripts/{script}", *map(str, args)]
    print("$ python", " ".join(cmd[1:]))
    proc = jobs.run(cmd, timeout=timeout, env=launch.environment(env))
    err = proc.stderr.strip()
    assert proc.returncode != 0 and len(err.splitlines()) == 1 and "Traceback" not in err, \
        f"expected one sentence and a non-zero exit, got status {proc.returncode}:\n{err[-2000:]}"
    return f"exit status {proc.returncode}: {err}"


# The lines of NCCL_DEBUG=INFO that say how the GPUs talk: channels, rings and trees, and the transport
# (P2P between GPUs, SHM through host memory, NET between nodes); the rest is versions and set-up.
NCCL_TOPOLOGY = re.compile(r"channel|ring|tree|P2P|SHM|NET/|NVLS|CollNet", re.I)


def nccl_debug_lines(gpus, first=12, timeout=300):
    """_trainup_ddp.py on NCCL with NCCL_DEBUG=INFO, 2 processes where there are 2 GPUs (else 1): its first
    lines about channels, rings, trees and transports."""
    nproc = 2 if gpus >= 2 else 1
    argv, printed = launch.command("_trainup_ddp.py", ["--device", "cuda", "--backend", "nccl", "--epochs", 1],
                                   "inside_nccl_debug", nproc, quick=True)
    print(printed.replace("$ ", "$ NCCL_DEBUG=INFO ", 1))
    proc = jobs.run(argv, timeout=timeout, env=launch.environment({"NCCL_DEBUG": "INFO"}))
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in (proc.stdout + proc.stderr).splitlines()
             if "NCCL INFO" in line and NCCL_TOPOLOGY.search(line)]
    assert lines, "NCCL_DEBUG=INFO printed no line about channels, rings, trees or transports"
    return lines[:first]


def about_lr(t):
    """Sentences from lr_table's runs, in its order: small batch; large batch, same rate; large batch, rate x k;
    the same with warm-up. Directions are worked out from the final losses."""
    small, big, scaled, warm = (t.iloc[i] for i in range(4))
    k = big["batch_size"] / small["batch_size"]
    cmp = lambda a, b: "lower" if a < b else "higher"  # noqa: E731
    return (f"Batch {big['batch_size']} ({k:.0f}x) at the same rate takes {big['steps']} steps an epoch instead of "
            f"{small['steps']} and ends at loss {big['loss']:.3f}, {cmp(big['loss'], small['loss'])} than the small "
            f"batch's {small['loss']:.3f}. With the rate scaled {scaled['lr'] / big['lr']:.0f}x (the linear rule) it "
            f"ends at {scaled['loss']:.3f}, {cmp(scaled['loss'], big['loss'])} than at the same rate; with "
            f"{warm['warmup']} warm-up steps as well, {warm['loss']:.3f}, {cmp(warm['loss'], scaled['loss'])} than "
            f"without warm-up. " + ("In these few epochs the large batch has not caught up with the small one: "
                                    "a run this short shows where each run stands after these epochs, not where "
                                    "a longer run ends." if min(scaled["loss"], warm["loss"])
                                    > small["loss"] else "Scaled, the large batch caught up with the small one.")
            + " Each run is one seed: another seed can reverse differences this small.")


def ring_allreduce(world=4):
    """The ring all-reduce of `world` ranks, simulated chunk by chunk: each rank's tensor cut into
    `world` chunks; world - 1 steps of reduce-scatter (rank r sends chunk (r - s) mod N to rank
    r + 1, which adds it to its own), then world - 1 of all-gather (the summed chunks passed on and
    kept). Returns the steps, each with its phase, the sends (source, destination, chunk) and which
    ranks' values each rank's chunks then hold; checked: every rank ends with the sum of all, and
    each sent 2(N-1)/N of its tensor."""
    held = [[{r} for _ in range(world)] for r in range(world)]  # held[rank][chunk]: ranks summed
    steps, sent = [dict(phase="start", sends=[], held=[[set(c) for c in r] for r in held])], 0
    for phase, first in (("reduce-scatter", 0), ("all-gather", 1)):
        for s in range(world - 1):
            sends = [(r, (r + 1) % world, (r + first - s) % world) for r in range(world)]
            incoming = [(dst, chunk, set(held[src][chunk])) for src, dst, chunk in sends]
            for dst, chunk, values in incoming:  # every rank sends at once: read, then write
                held[dst][chunk] = held[dst][chunk] | values if first == 0 else values
            sent += 1
            steps.append(dict(phase=phase, sends=sends, held=[[set(c) for c in r] for r in held]))
    everyone = set(range(world))
    assert all(chunk == everyone for rank in held for chunk in rank), held
    assert sent / world == ring_factor(world)  # chunks each rank sent, as a share of its tensor
    return steps


def ring_plot(steps, name):
    """One small grid a step: a row a rank, a column a chunk, the shade how many ranks' values the
    chunk holds; the chunks sent in that step outlined."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    world = len(steps[0]["held"])
    fig, axes = plt.subplots(1, len(steps), figsize=(1.55 * len(steps), 2.6), sharey=True)
    for n, (ax, step) in enumerate(zip(axes, steps)):
        counts = [[len(c) for c in rank] for rank in step["held"]]
        ax.imshow(counts, cmap="Blues", vmin=0, vmax=world + 1)
        for r in range(world):
            for c in range(world):
                ax.text(c, r, counts[r][c], ha="center", va="center", fontsize=8)
        for _, dst, chunk in step["sends"]:  # outlined where it arrives
            ax.add_patch(Rectangle((chunk - 0.5, dst - 0.5), 1, 1, fill=False, lw=2, ec="C3"))
        ax.set_title(f"{step['phase']}" if n == 0 else f"{n}: {step['phase']}", fontsize=8)
        ax.set_xticks(range(world), [str(c) for c in range(world)], fontsize=7)
        ax.set_yticks(range(world), [f"rank {r}" for r in range(world)], fontsize=7)
        ax.set_xlabel("chunk", fontsize=7)
    fig.suptitle(f"A ring all-reduce of {world} ranks takes {2 * (world - 1)} steps; each rank "
                 f"sends 2(N-1)/N = {ring_factor(world):.2f} times its tensor", fontsize=9)
    save(fig, name)
    return fig
