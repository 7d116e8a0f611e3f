"""The plumbing of _trainup_tp_sp.py: tensor parallelism of a transformer (trainup/transformer.py's
Classifier) as Megatron-LM cuts it, sequence parallelism between the cut layers, and the loss on
class scores still cut over the ranks (loss_parallel).

Megatron-LM (Shoeybi et al. 2019): q, k and v cut by output features, so each rank holds whole
heads and attends with them alone; the attention's output projection cut by input features, its
partial sums added by one all-reduce; the MLP's fc1 and fc2 the same way. Per layer: 2 all-reduces
of batch x seq x hidden values in forward (after proj, after fc2) and 2 in backward (the input
gradients of attention and MLP). Sequence parallelism (Korthikanti et al. 2022): the LayerNorms,
residuals and the layers' inputs are cut by sequence instead of whole on every rank; each
all-reduce becomes a reduce-scatter (into sequence slices) and an all-gather (before the next cut
layer): as many bytes on a ring, and those activations divided by tp.
"""
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                               RowwiseParallel, SequenceParallel,
                                               parallelize_module)

from .. import UserError, cli


def add_flags(p):
    """The attention's heads and the switch to sequence parallelism."""
    p.add_argument("--heads", type=cli.positive(int), default=4,
                   help="attention heads in each layer (each rank holds heads/tp of them)")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="keep LayerNorms and residuals cut by sequence between the cut layers")


def check_shape(args, tp, shape, num_classes=None):
    """One sentence on a model the job cannot cut; before anyone waits for anyone."""
    if args.width % args.heads:
        raise UserError(f"--width {args.width} cannot be split into --heads {args.heads} heads "
                        f"of equal size; use a multiple of {args.heads}")
    if args.heads % tp:
        raise UserError(f"--heads {args.heads} cannot be shared by --tp {tp} processes: each "
                        f"holds whole heads; use a multiple of {tp} heads")
    rows, features = shape[1], shape[0] * shape[2]  # the images' tokens and their features
    if args.sequence_parallel and (rows % tp or features % tp):
        raise UserError(f"--sequence-parallel cuts the {rows} tokens of an image, and the "
                        f"embedding its {features} features, over --tp {tp}: use a --tp that "
                        f"divides both")
    if num_classes is not None and num_classes % tp:
        # the head is cut by class (Shard(-1)): 10 classes over 4 ranks would be cut 3, 3, 3, 1,
        # over 8 ranks 2, 2, 2, 2, 2, 0, 0, 0: uneven and empty shards under loss_parallel, a
        # path no test of the course runs
        raise UserError(f"the head's {num_classes} classes cannot be cut evenly over --tp {tp}: "
                        f"each process scores its own classes; use a --tp that divides "
                        f"{num_classes}")


def _cut(input_layouts):
    """q, k, v and fc1 cut by output features, proj and fc2 by input features. Each block's input
    is made whole once (PrepareModuleInput): three ColwiseParallels on a plain tensor would each
    all-reduce its gradient in backward."""
    whole = PrepareModuleInput(input_layouts=(input_layouts,),
                               desired_input_layouts=(Replicate(),))
    out = Shard(1) if input_layouts == Shard(1) else Replicate()  # back to sequence slices, or sum
    return {"attn": whole, "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(), "attn.proj": RowwiseParallel(output_layouts=out),
            "mlp": whole, "mlp.fc1": ColwiseParallel(),
            "mlp.fc2": RowwiseParallel(output_layouts=out)}


def plan(sequence_parallel):
    """(the model's plan, each layer's plan). The head's class scores stay cut by class (Shard(-1),
    a DTensor): loss_parallel computes the cross-entropy on them without gathering them."""
    head = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    if not sequence_parallel:
        return {"head": head}, _cut(Replicate())
    # the embedding cut by input features, its partial sums reduce-scattered into sequence slices
    model = {"embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
             "norm": SequenceParallel(),
             "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1),
                                     use_local_output=False)}
    return model, {"ln1": SequenceParallel(), "ln2": SequenceParallel(), **_cut(Shard(1))}


def described(sequence_parallel):
    """Each layer's plan by name (the log's "plan"): the style applied to each of its modules."""
    return {name: type(style).__name__ for name, style in plan(sequence_parallel)[1].items()}


def parallelize(model, mesh, sequence_parallel):
    """Cut the model over the mesh's 'tp' dimension; with dp > 1, FSDP2 over 'dp' (per layer, then
    the whole model), which also averages the gradients over the replicas."""
    whole, per_layer = plan(sequence_parallel)
    parallelize_module(model, mesh["tp"], whole)
    for layer in model.layers:
        parallelize_module(layer, mesh["tp"], per_layer)
    if mesh["dp"].size() > 1:
        for layer in model.layers:
            fully_shard(layer, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])  # it sums the partial gradients below itself
    else:
        for p in model.parameters():
            if any(place.is_replicate() for place in getattr(p, "placements", ())):
                p.register_post_accumulate_grad_hook(_summed)
    return model


def _summed(p):
    """A LayerNorm's weight, whole on every rank, gets from each rank the gradient of its slice
    of the sequence (a Partial DTensor): summed once, as soon as complete. Left Partial, the
    optimizer would all-reduce it again at every use (Adadelta: three times a step)."""
    if p.grad.placements != p.placements:
        p.grad = p.grad.redistribute(placements=p.placements)

