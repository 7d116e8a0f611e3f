"""The plumbing of pipeline parallelism: which stages a rank holds, its piece of the model, the
schedules, and the measurements (when each micro-batch's forward and backward ran, activation
bytes); a rank's stages run by their schedule (Pipe) and its measured steps, for lesson 06.

A job of `stages` x `data_parallel` processes: rank = pipeline * stages + position in the pipeline.
Schedules with 2 stages a rank (interleaved, zero-bubble) cut the model into 2 x stages pieces.
"""
import os
import time
import weakref

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import pipelining as pp
from torch.utils.checkpoint import checkpoint

from .. import UserError, devices
from ..checkpoint import load_ranks, plain, save_ranks, whole
from ..meter import Meter

# name: (schedule class, stages a rank holds, how stages map to ranks)
#   loop: rank r holds stages r, r+P, ...;  v: rank r holds r and 2P-1-r (the last stage, and the loss, on rank 0)
SCHEDULES = {
    "naive": (pp.ScheduleGPipe, 1, "loop"),  # the whole batch as one micro-batch: one stage busy at a time
    "gpipe": (pp.ScheduleGPipe, 1, "loop"),
    "1f1b": (pp.Schedule1F1B, 1, "loop"),
    "interleaved1f1b": (pp.ScheduleInterleaved1F1B, 2, "loop"),
    "looped_bfs": (pp.ScheduleLoopedBFS, 2, "loop"),
    "interleaved_zb": (pp.ScheduleInterleavedZeroBubble, 2, "loop"),
    "zbv": (pp.ScheduleZBVZeroBubble, 2, "v"),
    "dualpipev": (pp.ScheduleDualPipeV, 2, "v"),
}


# torch 2.11's schedules warm their stages up by sending to each neighbour stage, its own rank's
# too; 2.13's PipelineStage votes instead (schedules.py's warm-up protocol). Measured on 2.11.
V_OVER_GLOO = (2, 13)


def runs_over_gloo(schedule, release=None):
    """Whether torch `release` (this one's by default) runs `schedule` with its stages on CPU
    processes over gloo: every schedule but the V-shaped ones always, those from V_OVER_GLOO on."""
    release = devices.torch_release() if release is None else release
    return SCHEDULES[schedule][2] != "v" or release >= V_OVER_GLOO


def check_shape(args, world_size):
    """The bad inputs that would otherwise fail deep inside torch or hang: one sentence each."""
    per_rank = SCHEDULES[args.schedule][1]
    n_stages = args.stages * per_rank if args.stages > 1 else 1
    if n_stages > args.blocks:
        raise UserError(f"--schedule {args.schedule} with --stages {args.stages} cuts the model into {n_stages} "
                        f"stages, more than its --blocks {args.blocks}; every stage needs at least one block")
    if args.batch_size % args.data_parallel:
        raise UserError(f"--batch-size {args.batch_size} cannot be split evenly over --data-parallel "
                        f"{args.data_parallel} pipelines")
    per_pipeline = args.batch_size // args.data_parallel
    for m in (args.microbatches, *(args.sweep or ())):
        if per_pipeline % m:
            raise UserError(f"--microbatches {m} does not divide the {per_pipeline} samples each pipeline takes "
                            f"a step (--batch-size {args.batch_size} / --data-parallel {args.data_parallel}); "
                            f"use a divisor of {per_pipeline}")
    if args.stages > 1 and args.device != "cuda" and not runs_over_gloo(args.schedule):
        raise UserError(f"--schedule {args.schedule} needs torch 2.13 or newer over gloo, and this "
                        f"is torch {torch.__version__}: its pipelining first sends to a V stage's "
                        "neighbour on the same rank, which gloo refuses (Pair is not connected); "
                        "choose another schedule, or a newer torch")
    if world_size != args.stages * args.data_parallel:
        raise UserError(f"--stages {args.stages} x --data-parallel {args.data_parallel} needs "
                        f"{args.stages * args.data_parallel} processes, and this job has {world_size}; start it "
                        f"with torchrun --nproc-per-node {args.stages * args.data_parallel}")
    return n_stages


def stage_ids(schedule, rank_in_pipeline, ranks):
    """The stage indices one rank of a pipeline holds under a schedule."""
    _, per_rank, shape = SCHEDULES[schedule]
    if shape == "v":
        return [rank_in_pipeline, 2 * ranks - 1 - rank_in_pipeline]
    return [rank_in_pipeline + k * ranks for k in range(per_rank)]


def block_ranges(blocks, n_stages):
    """Split `blocks` blocks as evenly as possible over n_stages stages: [(first, end), ...]."""
    sizes = [blocks // n_stages + (i < blocks % n_stages) for i in range(n_stages)]
    starts = [sum(sizes[:i]) for i in range(n_stages)]
    return [(s, s + n) for s, n in zip(starts, sizes)]


class _Saved:
    """What autograd keeps instead of a saved tensor while the meter counts it."""
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor):
        self.tensor = tensor


class ActivationMeter:
    """Bytes of the tensors autograd keeps for backward (activations), alive now and at most.

    A saved-tensor hook (public: torch.autograd.graph.saved_tensors_hooks) sees every tensor saved
    in forward; it is counted once (a tensor saved twice, once) until autograd lets it go (after its backward).
    Parameters are not activations: their storage is skipped. CPU has no max_memory_allocated, this works anywhere.
    The parameters' storages are looked up each time saving starts: moving the stage (`.to("cuda")`,
    or to another dtype) gives every parameter a new storage, and a set taken before would count
    the weights autograd saves (a Linear's weight, a LayerNorm's) as activations.
    """
    def __init__(self, params):
        self._params = list(params)  # the Parameter objects stay; .to() swaps their storage
        self.params = set()
        self.live, self.bytes, self.peak, self.base, self.enabled = {}, 0, 0, 0, True

    def _skip(self):
        self.params = {p.untyped_storage().data_ptr() for p in self._params}

    def _pack(self, t):
        storage = t.untyped_storage().data_ptr()
        if not self.enabled or storage in self.params or storage == 0:
            return t
        # the tensor's own bytes: a micro-batch is a view into the whole batch's storage
        key = (storage, t.storage_offset(), tuple(t.shape))
        saved = _Saved(t)
        if key not in self.live:
            self.live[key] = [0, t.numel() * t.element_size()]
            self.bytes += self.live[key][1]
            self.peak = max(self.peak, self.bytes)
        self.live[key][0] += 1
        weakref.finalize(saved, self._release, key)
        return saved

    def _release(self, key):
        entry = self.live[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.bytes -= entry[1]
            del self.live[key]

    @staticmethod
    def _unpack(saved):
        return saved.tensor if isinstance(saved, _Saved) else saved

    def saving(self):
        self._skip()
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def reset_peak(self):
        """A new measurement: what stays alive from before (the library's first shape-inferring forward
        keeps one) is its base, not part of it."""
        self.peak = self.base = self.bytes

    @property
    def step_peak(self):
        return self.peak - self.base


class StagePart(nn.Module):
    """One stage's piece of a BlockStack: its blocks (the stem first, the head last), under the full
    model's parameter names, so the stages' state dicts together are the whole model's. recompute:
    each block's activations are computed again in its backward (torch.utils.checkpoint), so a
    micro-batch in flight keeps only each block's input."""
    def __init__(self, model, first, end, has_stem, has_head, recompute=False):
        super().__init__()
        self.stem = model.stem if has_stem else None
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in range(first, end)})
        self.head = model.head if has_head else None
        self.meter = ActivationMeter(self.parameters())
        self.recompute = recompute

    def forward(self, x):
        with self.meter.saving():
            if self.stem is not None:
                x = self.stem(x.flatten(1))
            for block in self.blocks.values():
                x = KeptInput.apply(checkpoint(block, x, use_reentrant=False), x) \
                    if self.recompute else block(x)
            return self.head(x) if self.head is not None else x


class KeptInput(torch.autograd.Function):
    """The output of a checkpointed block, unchanged, with the block's input saved for backward.
    checkpoint keeps that input alive itself, where no saved-tensor hook sees it (its own hooks
    replace the meter's inside the block): saved here as well, under the meter's hook, it is
    counted until the block's backward, as the memory it is."""
    @staticmethod
    def forward(ctx, out, inp):
        ctx.save_for_backward(inp)
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def cut(model, n_stages, recompute=False):
    """The model's pieces, one per stage, cut by hand: each a StagePart that knows the model."""
    ranges = block_ranges(len(model.blocks), n_stages)
    return [StagePart(model, a, b, i == 0, i == n_stages - 1, recompute)
            for i, (a, b) in enumerate(ranges)]


def traced(model, n_stages, example):
    """The same pieces cut by torch's tracer instead (pipeline(), a SplitPoint where each stage
    but the first begins): the model's forward on one example micro-batch, recorded as a graph and
    split there. Each piece is a GraphModule that keeps the whole model's parameter names; its
    forward is wrapped in the same activation meter as a StagePart's."""
    ranges = block_ranges(len(model.blocks), n_stages)
    split = {f"blocks.{first}": pp.SplitPoint.BEGINNING for first, _ in ranges[1:]}
    pipe = pp.pipeline(model, mb_args=(example,), split_spec=split)
    parts = [pipe.get_stage_module(i) for i in range(n_stages)]
    for part in parts:
        part.meter = ActivationMeter(part.parameters())
        part.forward = _metered(part.forward, part.meter)  # on the instance: names unchanged
    return parts


def _metered(forward, meter):
    def run(*args):
        with meter.saving():
            return forward(*args)
    return run


class TimedStage(pp.PipelineStage):
    """A PipelineStage that notes when each micro-batch's forward and backward ran on it (its own
    wrappers around the public per-micro-batch methods the schedules call): (stage, kind, micro-batch,
    start, end), kind F forward, B backward, I backward to the input only, W weight gradients
    (zero bubble).

    On a GPU the times are CUDA events recorded on the stream, read after the step (times()): the
    kernels' own times, with nothing made to wait (a clock around each micro-batch would need
    torch.cuda.synchronize, which stops the next micro-batch and the sends from overlapping it)."""
    clock = staticmethod(time.perf_counter)

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.events, self.timing = [], True
        self.on_gpu = torch.device(self.device).type == "cuda"
        self.origin = None  # on a GPU: (an event recorded as the step began, the clock then)

    def begin(self):
        self.events.clear()
        if self.on_gpu:
            ref = torch.cuda.Event(enable_timing=True)
            ref.record()
            self.origin = (ref, self.clock())

    def _start(self):
        if self.on_gpu:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            return start
        return self.clock()

    def _note(self, kind, mb, start):
        if not self.timing:
            return
        if self.on_gpu:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.events.append((self.stage_index, kind, mb, start, end))
        else:
            self.events.append((self.stage_index, kind, mb, start, self.clock()))

    def times(self):
        """The events with clock times: on a GPU, the step's events placed after the clock reading
        taken when its first event was recorded (waits for the GPU to finish them)."""
        if not self.on_gpu or not self.events:
            return list(self.events)
        torch.cuda.synchronize(self.device)
        ref, at = self.origin
        return [(s, kind, mb, at + ref.elapsed_time(a) / 1e3, at + ref.elapsed_time(b) / 1e3)
                for s, kind, mb, a, b in self.events]

    def forward_one_chunk(self, fwd_chunk_id, *a, **kw):
        start = self._start()
        out = super().forward_one_chunk(fwd_chunk_id, *a, **kw)
        self._note("F", fwd_chunk_id, start)
        return out

    def backward_one_chunk(self, bwd_chunk_id, *a, **kw):
        start = self._start()
        out = super().backward_one_chunk(bwd_chunk_id, *a, **kw)
        self._note("B" if kw.get("full_backward", True) else "I", bwd_chunk_id, start)
        return out

    def backward_weight_one_chunk(self, bwd_chunk_id, *a, **kw):
        start = self._start()
        out = super().backward_weight_one_chunk(bwd_chunk_id, *a, **kw)
        self._note("W", bwd_chunk_id, start)
        return out


class Layout:
    """Where this rank sits: its pipeline (data-parallel index), its position in it, its groups."""
    def __init__(self, rank, stages, data_parallel):
        self.pipeline, self.position = divmod(rank, stages)
        self.stages, self.data_parallel = stages, data_parallel
        self.pipe_group = self.dp_group = None
        if dist.is_initialized() and dist.get_world_size() > 1:
            # every rank takes part in creating every group (new_group is collective)
            for d in range(data_parallel):
                g = dist.new_group([d * stages + s for s in range(stages)])
                if d == self.pipeline:
                    self.pipe_group = g
            for s in range(stages):
                g = dist.new_group([d * stages + s for d in range(data_parallel)])
                if s == self.position:
                    self.dp_group = g


def replicated(part, layout, device):
    """Pipeline x data parallel as production runs it (torchtitan wraps stages in FSDP): each stage
    in DDP over the same stage of every pipeline. The schedule runs every micro-batch's backward
    but the last under DDP's no_sync; the last one's backward all-reduces the stage's gradient
    buckets as they fill, while the earlier layers still compute. One process per pipeline: the
    part itself."""
    if layout.data_parallel == 1:
        return part
    from torch.nn.parallel import DistributedDataParallel as DDP
    return DDP(part, process_group=layout.dp_group,
               device_ids=[device.index] if device.type == "cuda" else None)


def gather_model(parts, full_model):
    """Rank 0 gets every stage's parameters back into one whole model (for the checkpoint)."""
    mine = {k: v.detach().cpu() for part in parts for k, v in part.state_dict().items()}
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return full_model
    everyone = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, everyone, dst=0)
    if dist.get_rank() == 0:
        merged = {}
        for state in everyone:
            merged.update(state)
        full_model.load_state_dict(merged)
    return full_model


def save_model(path, model, epoch, args):
    """The whole model's parameters, atomically (temporary file, then os.replace): what checks.same_parameters reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with whole(path, tmp):  # a full disk: one sentence, the last whole one kept
        torch.save({"model": model.state_dict(), "epoch": epoch, "args": plain(args)}, tmp)
        os.replace(tmp, path)
    return path


def layout(args):
    """Which stages each rank holds, as the flags that decide it: a resumed job needs the same."""
    return {"--stages": args.stages, "--data-parallel": args.data_parallel,
            "--schedule": args.schedule if args.stages > 1 else "none", "--split": args.split}


def save_stages(folder, parts, optimizer, scheduler, epoch, args, position=None):
    """Every rank saves what it holds: its stages' parameters, their optimizer's and the
    scheduler's state (checkpoint.save_ranks); position: where a stop left the epoch
    (preempt.Stopper)."""
    state = {"model": {k: v for part in parts for k, v in part.state_dict().items()},
             "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    save_ranks(folder, state, epoch, args, layout(args), position)


def stage_saver(folder, parts, optimizer, scheduler, args):
    """What a stop (preempt.Stopper) calls on every rank: save_stages with where it stopped."""
    def save(epochs_done, position):
        save_stages(folder, parts, optimizer, scheduler, epochs_done, args, position)
    return save


def load_stages(folder, parts, optimizer, scheduler, args):
    """--resume: every rank takes back its stages from save_stages's folder; (the epoch to start
    from, where a stop left it: None at an epoch's end). Another layout is one sentence."""
    mine, epoch, position = load_ranks(folder, layout(args), args)
    if mine is None:
        return 1, None
    try:
        for part in parts:
            part.load_state_dict({k: mine["model"][k] for k in part.state_dict()})
        optimizer.load_state_dict(mine["optimizer"])
        scheduler.load_state_dict(mine["scheduler"])
    except (KeyError, RuntimeError, ValueError):
        raise UserError(f"checkpoint {folder} holds stages whose weights do not fit this run's "
                        f"(--blocks, --width); resume with the flags it was saved with, or use "
                        f"another --run-name") from None
    return epoch, position


@torch.no_grad()
def forward_only(parts, ids, x, schedule, layout, width):
    """The whole batch through the stages in order, no micro-batches, no backward (for the test set):
    the owner of each stage computes it and sends the activations to the next stage's owner.
    Returns the logits on the rank that holds the last stage, None elsewhere."""
    n_stages = len(ids) * layout.stages
    owner = {i: p for p in range(layout.stages) for i in stage_ids(schedule, p, layout.stages)}
    rank_of = lambda p: layout.pipeline * layout.stages + p  # noqa: E731
    mine = dict(zip(ids, parts))
    h = x
    for i in range(n_stages):
        if i not in mine:
            continue
        if i > 0 and owner[i - 1] != layout.position:
            h = torch.empty(len(x), width, device=x.device)
            dist.recv(h, src=rank_of(owner[i - 1]))
        h = mine[i](h)
        if i < n_stages - 1 and owner[i + 1] != layout.position:
            dist.send(h.contiguous(), dst=rank_of(owner[i + 1]))
    return h if n_stages - 1 in mine else None



@torch.no_grad()
def evaluate(model, pipe, loader, device):
    """The test set's loss and accuracy: through the whole model in one process, or through the
    stages in order (forward_only), summed on the rank that holds the last stage."""
    meter = Meter()
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        if pipe is None:
            logits = model(x)
        else:
            logits = forward_only(pipe.parts, pipe.ids, x, pipe.schedule_name, pipe.layout,
                                  pipe.width)
        if logits is not None:
            meter.add(F.cross_entropy(logits, y), logits, y)
    return meter

# --- a rank's stages run by their schedule, and its measured steps (the lesson's script)

class Pipe:
    """This rank's stages and the schedule that drives them, for m micro-batches."""

    def __init__(self, args, model, layout, device, microbatches):
        schedule_cls, per_rank, _ = SCHEDULES[args.schedule]
        self.n_stages = args.stages * per_rank
        example = torch.zeros(args.batch_size // args.data_parallel // microbatches,
                              *args.image_shape)  # a micro-batch, for the tracer
        parts = (traced(model, self.n_stages, example) if args.split == "traced"
                 else cut(model, self.n_stages, args.recompute))
        ids = stage_ids(args.schedule, layout.position, args.stages)
        self.parts = [parts[i].to(device) for i in ids]
        self.stages = [TimedStage(replicated(parts[i], layout, device), i, self.n_stages, device,
                                  group=layout.pipe_group) for i in ids]
        self.first, self.last = 0 in ids, self.n_stages - 1 in ids
        try:
            # the loss averaged, and gradients / m: the batch mean
            stages = self.stages if per_rank > 1 else self.stages[0]
            self.schedule = schedule_cls(stages, microbatches, loss_fn=F.cross_entropy)
        except ValueError as e:  # a schedule's own limits (e.g. micro-batches against stages)
            raise UserError(f"--schedule {args.schedule} with {microbatches} micro-batches: "
                            f"{e}") from None
        self.microbatches, self.ids, self.layout = microbatches, ids, layout
        self.schedule_name, self.width = args.schedule, args.width

    def params(self):
        return [p for part in self.parts for p in part.parameters()]

    def run(self, x, y):
        """One batch through the pipeline; on the last stage's rank, the logits and the
        micro-batch losses."""
        losses = []
        inputs = (x,) if self.first else ()
        target = y if self.last else None
        out = self.schedule.step(*inputs, target=target, losses=losses)
        return (out, torch.stack(losses).mean()) if self.last else (None, None)

    def timing(self, on):
        for s in self.stages:
            s.timing = on
        for part in self.parts:
            part.meter.enabled = on


def begin_step(pipe, layout):
    """The stages of a pipeline start a measured step together: event times are from now."""
    if pipe is not None:
        dist.barrier(group=layout.pipe_group)
        for s in pipe.stages:
            s.begin()
        for part in pipe.parts:
            part.meter.reset_peak()
    return time.perf_counter()


def end_step(pipe, layout, tick, epoch, step):
    """This rank's 'pipe_step' record: its events (times from the step's start) and activation
    peaks."""
    if pipe is not None:
        devices.synchronize(pipe.stages[0].device)  # a GPU step ends when its kernels do
    seconds = time.perf_counter() - tick
    if pipe is None:
        return None
    events = [[s, kind, mb, start - tick, end - tick]
              for st in pipe.stages for s, kind, mb, start, end in st.times()]
    return dict(epoch=epoch, step=step, microbatches=pipe.microbatches, rank=dist.get_rank(),
                pipeline=layout.pipeline, stages=[s.stage_index for s in pipe.stages],
                step_s=seconds,
                start_s=tick,  # this machine's monotonic clock: the ranks of one machine align
                events=sorted(events, key=lambda e: e[3]),
                peak_activation_bytes=[part.meter.step_peak for part in pipe.parts])


def write_steps(log, log_steps):
    """Every rank's step records, gathered to rank 0, which writes them."""
    alone = not dist.is_initialized() or dist.get_world_size() == 1
    if alone or not log_steps or log_steps[0] is None:
        return
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, log_steps)
    for rank_steps in everyone:
        for record in rank_steps:
            log.write("pipe_step", **record)
    log_steps.clear()


def full_batches(dataset, batch_size, sampler):
    """Only full batches: every micro-batch of a step must have the same size."""
    order = torch.tensor(list(sampler))
    for idx in order.split(batch_size):
        if len(idx) == batch_size:
            yield dataset[idx]


class Batches:
    def __init__(self, dataset, batch_size, sampler):
        self.dataset, self.batch_size, self.sampler = dataset, batch_size, sampler

    def __iter__(self):
        return full_batches(self.dataset, self.batch_size, self.sampler)

    def __len__(self):
        return len(self.sampler) // self.batch_size
