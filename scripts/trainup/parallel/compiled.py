"""Lesson 09f's plumbing: torch.compile on a DDP model, its flags, and what the log keeps of it.

Where compile goes. `torch.compile(DDP(model))`, compile after DDP, as torch's own note asks
(Note [DDPOptimizer], torch/_dynamo/backends/distributed.py): compiled whole, a model's backward
is one fused function, "such that all gradients become 'ready' at the same time", so DDP's hooks
would start every all-reduce only after the whole backward, with no overlap. Seeing the model
inside DDP, Dynamo's DDPOptimizer counts the parameters backwards up to DDP's bucket cap
(`bucket_cap_mb`, DDP's `bucket_bytes_cap`) and cuts the graph there: one compiled piece per
bucket, so each bucket's gradients are ready when its piece's backward ends; the first bucket
closes at 1 MiB, as DDP's does. It is on by default (`torch._dynamo.config.optimize_ddp = True`);
--bucket-cap-mb chooses the cap, hence the pieces (1 or more: DDPOptimizer refuses a cap below
its first bucket's).

What Dynamo meets on the way (torch 2.13, `TORCH_LOGS=graph_breaks` shows it): it cannot trace
DDP's own forward through, since `_pre_forward` calls DDP's C++ logger and `_inside_ddp_forward`
is on Dynamo's skip list, three graph breaks that capture no operation of the model; the model's
own forward is then compiled as a frame of its own, one graph, which DDPOptimizer cuts.

The modes (`torch._inductor.list_mode_options()`): "reduce-overhead" adds CUDA graphs, which
Inductor does not apply to a graph on the CPU (`check_multiple_devices_or_any_cpu_nodes` in
torch/_inductor/cudagraph_utils.py: "skipping cudagraphs due to cpu device"), so on a CPU it
compiles as "default"; "max-autotune-no-cudagraphs" lets Inductor time its own C++ matrix kernel
against ATen's, for float32 and lower only (`use_cpp_gemm_template` in torch/_inductor/utils.py
has no float64), and tunes Triton kernels by coordinate descent, which a CPU does not run.

What is counted (`torch._dynamo.utils.counters`, on each rank, since the process started):
`stats/unique_graphs` the graphs Dynamo captured, `aot_autograd/total` the graphs compiled (one per
DDPOptimizer piece), `graph_break` each reason's count; `get_compilation_metrics()` one entry per
frame compiled, where `recompile_reason` says why a frame compiled again (a batch of another
shape, for example). `TORCH_LOGS=graph_breaks,recompiles` prints them as they happen.
"""
import statistics
import time

import torch

from .. import UserError, devices

MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
# DDPOptimizer's first bucket (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES, as DDP's): its
# __init__ raises where the bucket cap is smaller, at the first compiled step
FIRST_BUCKET_BYTES = 2**20


def add_flags(p):
    p.add_argument("--compile", action="store_true", help="torch.compile the DDP model (Inductor)")
    p.add_argument("--compile-mode", default="default", choices=MODES,
                   help="torch.compile's mode; on CPU reduce-overhead is default (no CUDA graphs)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0,
                   help="DDP's bucket size cap: compiled, one graph per bucket (DDPOptimizer)")


def check(args):
    """The flags that only mean something together: a sentence, before any process waits."""
    if args.compile_mode != "default" and not args.compile:
        raise UserError(f"--compile-mode {args.compile_mode} needs --compile: without it the "
                        f"model runs eagerly and no mode applies")
    if not args.bucket_cap_mb > 0:
        raise UserError(f"--bucket-cap-mb must be greater than 0, got {args.bucket_cap_mb}: "
                        f"DDP would put every gradient in a bucket of its own")
    if args.compile and args.bucket_cap_mb * 2**20 < FIRST_BUCKET_BYTES:
        raise UserError(f"--bucket-cap-mb {args.bucket_cap_mb} is below DDPOptimizer's first "
                        f"bucket of 1 MiB, which torch refuses to compile; take 1 or more")


def blocks(model, args):
    """--compile on the block stack of lesson 09 (_trainup_fsdp.py): each block compiled on its
    own, before fully_shard wraps it, as torchtitan's apply_compile compiles each transformer
    block (torchtitan/models/llama3/infra/parallelize.py). fully_shard's hooks, which gather a
    block's parameters before its forward and free them after, run around the compiled block, not
    in its graph: FSDP2 disables Dynamo in them (`_dynamo_disable` in
    torch/distributed/fsdp/_fully_shard/_fsdp_common.py). The blocks are identical, so one graph
    serves them all. `Module.compile` compiles each block in place, where torchtitan replaces it
    by `torch.compile(block)`: the parameters keep their names (no `_orig_mod.`), so the
    checkpoints are those of an eager run."""
    if args.compile:
        for block in model.blocks:
            block.compile()
    return model


def wrap(model, args):
    """The DDP model compiled (after DDP, see above), or as it is. The compiled module forwards
    attribute reads to the original, so `model.module` is still the plain model."""
    return torch.compile(model, mode=args.compile_mode) if args.compile else model


class StepClock:
    """Wraps a loader: each step's seconds, from asking for its batch to asking for the next (so
    the batch's loading counts too), waiting for the GPU first where there is one."""

    def __init__(self, batches, device):
        self.batches, self.device, self.steps = batches, device, []

    def __iter__(self):
        self.steps = []
        tick = time.perf_counter()
        for batch in self.batches:
            yield batch
            devices.synchronize(self.device)
            now = time.perf_counter()
            self.steps.append(now - tick)
            tick = now


def counted():
    """What Dynamo has done in this process so far."""
    from torch._dynamo.utils import counters, get_compilation_metrics
    frames = get_compilation_metrics()
    return dict(graphs=counters["stats"]["unique_graphs"],
                compiled_graphs=counters["aot_autograd"]["total"],
                graph_breaks=sum(counters["graph_break"].values()),
                recompiles=sum(f.recompile_reason is not None for f in frames),
                compile_s=sum(f.entire_frame_compile_time_s or 0.0 for f in frames))


def record(epoch, clock, args):
    """The 'compile' record of an epoch: the first step apart (it compiles, in epoch 1), the
    median of the others and their quartiles (the spread a comparison must beat), and Dynamo's
    counts so far (this rank's)."""
    rest = clock.steps[1:] or clock.steps or [0.0]
    quartiles = statistics.quantiles(rest, n=4) if len(rest) > 1 else [rest[0]] * 3
    return dict(epoch=epoch, compiled=args.compile,
                mode=args.compile_mode if args.compile else "eager",
                bucket_cap_mb=args.bucket_cap_mb, steps=len(clock.steps),
                first_step_s=clock.steps[0] if clock.steps else 0.0,
                step_s=statistics.median(rest), step_quartiles_s=[quartiles[0], quartiles[2]],
                **counted())
