"""Lesson 11b: a big world, simulated. The planner's bytes per GPU (lesson 11a2) set term by term
beside what torch's own FSDPMemTracker counts when one rank of a FSDP2 job of `world` ranks runs
a training step, in this one process, with nothing allocated.

    model = planner.Transformer(layers=2, hidden=4096, heads=32, seq=4096)
    simulated_world.simulate(model, world=1024)    # tracker's and planner's bytes per term
    runs = simulated_world.simulate_worlds(model, (8, 64, 1024))   # simulate() at each world
    simulated_world.table(runs)      # a row per world and term: planner, explained, tracker
    simulated_world.peak_table(runs)   # the step's peak by category, beside the planner's total
    simulated_world.plot(runs)
    cd scripts && python -m lessons.bylesson.simulated_world --worlds 8,64,1024  # the table

How one process plays rank 0 of 1,024:
- the process group is torch's fake one (torch.testing._internal.distributed.fake_pg: a FakeStore
  and init_process_group("fake")): every collective returns at once and moves nothing, so rank 0
  runs FSDP2's code, with its shapes, as it would among `world` ranks;
- the model is built and stepped under FakeTensorMode: every tensor has a shape, a dtype and a
  device but holds no data (its storage is a meta tensor's), so a 4096-wide layer costs no
  memory and its matrix products no arithmetic;
- FSDPMemTracker (torch.distributed._tools.fsdp2_mem_tracker) sorts every tensor alive into
  parameters (sharded, unsharded), gradients (sharded, unsharded), optimizer states, activations,
  temporaries and the collectives' buffers, and keeps a snapshot at each FSDP module's pre- and
  post-forward and backward.

The model is the planner's (trainup.transformer.Layer, each layer a fully_shard unit, then the
whole stack, as lesson 09's script does); the optimizer Adam. The planner's layout for it is
ZeRO-3 over `world` ranks (planner.Layout(dp=world, stage="parameters")), with the scores kept
(attention="unfused": the course's Layer writes its attention out). Its device mesh is made
before FakeTensorMode starts: DeviceMesh reads its ranks from a real tensor.

torch's RuntimeEstimator (torch.distributed._tools.runtime_estimator), the step-time half of
these tools, needs CUDA: its cost model asserts torch.cuda.is_available() and its benchmark mode
times kernels with CUDA events, so on a machine without a GPU the lesson sets no times beside it.
"""

import math

import torch

from . import planner

WORLDS = (8, 64, 1024)
PRECISIONS = ("32", "bf16")  # planner.PER_PARAM's recipes that FSDP2 runs: fp32, bf16 compute
# The planner's terms that the tracker counts in one category each
TERMS = ("param", "grad", "optim", "activations")
# FSDPMemTracker's categories (_FSDPRefType's values), in the order the lesson shows them
CATEGORIES = ("Sharded Param", "Unsharded Param", "Sharded Grad", "Unsharded Grad", "OptState",
              "Activation", "Temp", "All Gather", "Reduce Scatter", "Inputs", "Buffer")
# FSDP2 cuts every parameter into `world` fake chunks, one Python object each, so the time grows
# with the world: a bound keeps a typo from running for hours. One rank shards nothing (the
# planner's layouts have no ZeRO stage on one replica): 2 at least.
MAX_WORLD = 1 << 16


def check(model, world, micro=1, precision="32"):
    """Refuse what this simulation does not run, in one sentence (ValueError)."""
    if isinstance(world, bool) or not isinstance(world, int) or not 2 <= world <= MAX_WORLD:
        raise ValueError(f"world must be a whole number of ranks from 2 to {MAX_WORLD}, "
                         f"got {world!r}")
    if not isinstance(micro, int) or micro < 1:
        raise ValueError(f"micro must be a whole number of samples, 1 or more, got {micro!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)} (FSDP2 runs "
                         f"those recipes), got {precision!r}")
    if model.hidden % model.heads:
        raise ValueError(f"hidden size {model.hidden} must split evenly over {model.heads} "
                         f"heads")


def layout(world, micro=1):
    """The planner's layout that the simulation runs: FSDP2 (ZeRO-3) over every rank."""
    return planner.Layout(dp=world, stage="parameters", micro=micro, attention="unfused")


def planned(model, world, micro=1, precision="32"):
    """The planner's bytes per GPU for that layout: dict(param, grad, optim, activations)."""
    mem = planner.memory(model, layout(world, micro), global_batch=world * micro,
                         precision=precision)
    return {term: mem[term] for term in TERMS}


def _by_category(snapshot):
    """{category name: bytes} of one device's snapshot (the tracker keys it by enum members)."""
    (per_device,) = snapshot.values()  # one device: the simulated rank's
    return {getattr(k, "value", k): v for k, v in per_device.items()}


def _module_snapshots(tracker):
    """Every snapshot the tracker kept: each FSDP module's, at each of its states."""
    return [_by_category(s) for stats in tracker.memory_tracking.values()
            for per_state in stats.snapshots.values() for s in per_state if s]


def shapes(model):
    """(rows, columns) of one Layer's parameters, in FSDP2's terms: a parameter is cut along its
    first dimension. q, k, v and proj's weights, fc1's and fc2's; their biases; two LayerNorms'
    weights and biases."""
    h, inner = model.hidden, 4 * model.hidden
    weights = [(h, h)] * 4 + [(inner, h), (h, inner)]
    return weights + [(h, 1)] * 4 + [(inner, 1), (h, 1)] + [(h, 1)] * 4


def padding(model, world):
    """Values of a rank's shards beyond an even split: FSDP2 cuts each parameter along its first
    dimension with torch.chunk, ceil(rows / world) rows a chunk, and every rank allocates its
    shard at the first chunk's size (FSDPParam: "0th always padded"), so a parameter of fewer
    rows than ranks still costs each rank a whole row."""
    extra = sum(math.ceil(rows / world) * cols - rows * cols / world
                for rows, cols in shapes(model))
    return model.layers * extra


def explained(model, world, micro=1, precision="32"):
    """What the tracker counts in each of the planner's terms that the planner does not, by
    name: {term: {reason: bytes}} (negative: the planner counts it, the tracker elsewhere).
    - padding: a shard's rows beyond an even split (padding()), in fp32 weights, fp32 gradients
      and Adam's two fp32 states;
    - Adam's step counters: torch.optim.Adam keeps state["step"], one fp32 scalar a parameter
      (on the CPU, unless capturable or fused: on a GPU they hold none of its memory);
    - LayerNorm's statistics: native_layer_norm keeps a mean and an inverse deviation a token for
      backward, two LayerNorms a layer (trainup.transformer.activation_bytes leaves them out);
    - the batch: the first layer keeps its input, which in fp32 is the batch itself, counted by
      the tracker as Inputs (in bf16 the layer keeps FSDP2's bf16 copy of it: an Activation);
    - the loss: one fp32 value."""
    value = 2 if precision == "bf16" else 4  # the compute precision's bytes
    pad = padding(model, world)
    tokens = model.seq * micro
    acts = {"LayerNorm's statistics": model.layers * 2 * 2 * tokens * value, "the loss": 4}
    if precision == "32":
        acts["the batch, counted as Inputs"] = -4 * tokens * model.hidden
    return dict(param={"padding": 4 * pad}, grad={"padding": 4 * pad},
                optim={"padding": 8 * pad,
                       "Adam's step counters": 4 * len(shapes(model)) * model.layers},
                activations=acts)


def simulate(model, world, micro=1, precision="32"):
    """The second training step of rank 0 of `world` under FSDPMemTracker: dict(
    tracker: the planner's terms as the tracker counts them: sharded parameters and Adam's
        states after the step, sharded gradients after backward, activations at the end of
        forward;
    planner: planned(); explained: explained();
    held: {category: bytes} at the end of forward, after backward and after the step;
    largest: {category: its largest bytes in any snapshot} (each at its own moment);
    peak: {category: bytes} at the tracker's peak, when all together were largest)."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from trainup import transformer

    check(model, world, micro, precision)
    if dist.is_initialized():
        raise ValueError("a process group is already running in this process: the simulation "
                         "starts its own fake one; destroy_process_group() first")
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if precision == "bf16" else MixedPrecisionPolicy())
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        with FakeTensorMode():
            layers = torch.nn.Sequential(*(transformer.Layer(model.hidden, model.heads)
                                           for _ in range(model.layers)))
            for layer in layers:
                fully_shard(layer, mesh=mesh, mp_policy=policy)
            fully_shard(layers, mesh=mesh, mp_policy=policy)
            adam = torch.optim.Adam(layers.parameters(), lr=1e-4)
            x = torch.randn(micro, model.seq, model.hidden)
            # a first step makes Adam's states; the tracked one is a step as every later one is,
            # with them held throughout
            layers(x).float().sum().backward()
            adam.step()
            adam.zero_grad()  # set_to_none: the gradients go until backward makes them again
            tracker = FSDPMemTracker(layers, adam)
            tracker.track_inputs((x,))
            held = {}
            with tracker:
                # a sum keeps nothing for backward: what stays is what the layers keep
                loss = layers(x).float().sum()
                held["forward"] = _by_category(tracker.get_tracker_snapshot())
                loss.backward()
                held["backward"] = _by_category(tracker.get_tracker_snapshot())
                adam.step()
                held["step"] = _by_category(tracker.get_tracker_snapshot())
            peak = _by_category(tracker.get_tracker_snapshot("peak"))
            snapshots = _module_snapshots(tracker) + [peak, *held.values()]
    finally:
        dist.destroy_process_group()
    largest = {c: max(s.get(c, 0) for s in snapshots) for c in CATEGORIES}
    counted = dict(param=held["step"]["Sharded Param"], grad=held["backward"]["Sharded Grad"],
                   optim=held["step"]["OptState"], activations=held["forward"]["Activation"])
    return dict(tracker=counted, planner=planned(model, world, micro, precision),
                explained=explained(model, world, micro, precision), held=held,
                largest=largest, peak=peak)


def simulate_worlds(model, worlds=WORLDS, micro=1, precision="32"):
    """simulate() at each world size: {world: its result}."""
    return {world: simulate(model, world, micro, precision) for world in worlds}


def table(runs):
    """A row per world size and term: the planner's MB, the bytes explained() adds, the tracker's
    MB, their ratio, and the bytes left unexplained (0 when every difference is accounted for)."""
    import pandas as pd

    rows = []
    for world, sim in runs.items():
        for term in TERMS:
            ours, theirs = sim["planner"][term], sim["tracker"][term]
            extra = sum(sim["explained"][term].values())
            rows.append(dict(world=world, term=term, planner_mb=ours / 1e6,
                             explained_bytes=round(extra), tracker_mb=theirs / 1e6,
                             tracker_vs_planner=theirs / ours,
                             unexplained_bytes=theirs - ours - extra))
    return pd.DataFrame(rows)


def peak_table(runs):
    """A row per world size: the planner's total (its four terms; FSDP keeps no DDP buckets),
    the tracker's peak and what it held then, MB, by category."""
    import pandas as pd

    rows = []
    for world, sim in runs.items():
        row = dict(world=world, planner_total_mb=sum(sim["planner"].values()) / 1e6,
                   tracker_peak_mb=sim["peak"]["Total"] / 1e6)
        row.update({f"{c} at peak": sim["peak"].get(c, 0) / 1e6 for c in CATEGORIES})
        rows.append(row)
    return pd.DataFrame(rows)


def plot(runs, name="simulated_world"):
    """Planner against tracker, a panel per term, a pair of bars per world size (MB, log scale);
    then the tracker's peak by category beside the planner's total. Saved to images/<name>.png
    and returned closed: end the cell with it."""
    import matplotlib.pyplot as plt
    import numpy as np

    from ..report import save

    worlds = list(runs)
    fig, axes = plt.subplots(1, len(TERMS) + 1, figsize=(15, 3.8))
    at = np.arange(len(worlds))
    for ax, term in zip(axes, TERMS):
        for shift, who in ((-0.2, "planner"), (0.2, "tracker")):
            ax.bar(at + shift, [runs[w][who][term] / 1e6 for w in worlds], width=0.4,
                   label=who if who == "planner" else "FSDPMemTracker")
        # the states fall as 1/world: a log scale; the activations do not move with it
        ax.set(xticks=at, xticklabels=worlds, xlabel="world size", ylabel="MB per rank",
               title=term, yscale="linear" if term == "activations" else "log")
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize="small")
    ax, bottom = axes[-1], np.zeros(len(worlds))
    for i, category in enumerate(CATEGORIES):
        heights = np.array([runs[w]["peak"].get(category, 0) / 1e6 for w in worlds])
        if heights.any():  # colours apart from the planner's and the tracker's above
            ax.bar(at + 0.2, heights, width=0.4, bottom=bottom, label=category,
                   color=plt.cm.tab20(4 + i))
            bottom += heights
    ax.bar(at - 0.2, [sum(runs[w]["planner"].values()) / 1e6 for w in worlds], width=0.4,
           color="0.6", label="planner's total")
    ax.set(xticks=at, xticklabels=worlds, xlabel="world size", ylabel="MB per rank",
           title="the step's peak (right bars)")
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1, 1))
    fig.suptitle("The planner's bytes per GPU against torch's FSDPMemTracker, one rank of a "
                 "simulated FSDP2 job")
    save(fig, name)
    plt.close(fig)
    return fig


def main(argv=None):
    """The table in a terminal; a bad world or layout ends with one sentence (error:, exit 2)."""
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", default=",".join(map(str, WORLDS)),
                   help="world sizes to simulate, comma-separated")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--micro", type=int, default=1, help="samples a rank's micro-batch")
    p.add_argument("--precision", default="32", choices=PRECISIONS)
    args = p.parse_args(argv)
    try:
        worlds = [int(w) for w in args.worlds.split(",")]
    except ValueError:
        p.error(f"--worlds takes whole numbers, comma-separated, got {args.worlds}")
    model = planner.Transformer(args.layers, args.hidden, args.heads, args.seq)
    try:
        for world in worlds:
            check(model, world, args.micro, args.precision)
        runs = simulate_worlds(model, worlds, args.micro, args.precision)
    except ValueError as refused:
        p.error(str(refused))
    print(table(runs).round(3).to_string(index=False))


if __name__ == "__main__":
    main()
