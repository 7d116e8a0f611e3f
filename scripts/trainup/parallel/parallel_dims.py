"""The layout of a job of four dimensions: data (FSDP2), pipeline, context and tensor parallel,
checked once and made into one device mesh (lesson 09g).

    dims = ParallelDims(dp=2, tp=2, pp=2, cp=1, world_size=8)
    dims.check_model(blocks=4, heads=4, width=16, hidden=32, rows=28, batch=32, microbatches=2)
    mesh = dims.build_mesh("cpu")          # one mesh; mesh["tp"], mesh["pp"], ... its groups

As torchtitan's ParallelDims (torchtitan/distributed/parallel_dims.py): the degrees whose product
is the world size, validated in one place before any process waits for another, and one
init_device_mesh with named dimensions, outermost first: "pp", "dp", "cp", "tp". The order sets
which ranks are neighbours: rank = ((pp_index x dp + dp_index) x cp + cp_index) x tp + tp_index,
so the tp processes of a layer are adjacent (on a GPU server, one machine's NVLink: tensor
parallelism talks inside every layer, forward and backward) and pp is outermost (a stage sends
one activation per micro-batch to the next: the least traffic, fit for the slowest links).
torchtitan orders them the same way (pp, dp_replicate, dp_shard, cp, tp).
"""
from dataclasses import dataclass

from .. import UserError, cli

NAMES = ("pp", "dp", "cp", "tp")  # the mesh's dimensions, outermost first


def add_flags(p):
    """The four degrees, the pipeline's micro-batches and the attention's heads (the rest of the
    model's size: tensor_parallel's add_flags)."""
    p.add_argument("--pp", type=cli.positive(int), default=1,
                   help="pipeline stages: the layers cut into this many consecutive groups")
    p.add_argument("--cp", type=cli.positive(int), default=1,
                   help="context-parallel processes: each image's rows (the sequence) cut "
                        "over them, attention by ring")
    p.add_argument("--heads", type=cli.positive(int), default=4,
                   help="attention heads in each layer (each tp process holds heads/tp of them)")
    p.add_argument("--microbatches", type=cli.positive(int), default=2,
                   help="micro-batches each pipeline step is cut into (with --pp > 1)")


@dataclass(frozen=True)
class ParallelDims:
    """How many processes share each dimension; their product is the job's world size."""
    dp: int
    tp: int
    pp: int
    cp: int
    world_size: int

    def __post_init__(self):
        for name in NAMES:
            degree = getattr(self, name)
            if not isinstance(degree, int) or degree < 1:
                raise UserError(f"--{name} {degree} is not a number of processes: every "
                                f"dimension needs at least 1")
        if self.product != self.world_size:
            raise UserError(f"the layout --pp {self.pp} x --dp {self.dp} x --cp {self.cp} x "
                            f"--tp {self.tp} needs {self.product} processes, and this job has "
                            f"{self.world_size}; start it with torchrun --nproc-per-node "
                            f"{self.product}, or change the degrees")

    @classmethod
    def from_args(cls, args, world_size):
        """The layout the flags ask for; --dp left out: the processes the others leave."""
        rest = args.pp * args.cp * (args.tp or 1)
        dp = args.dp or max(world_size // rest, 1)
        return cls(dp=dp, tp=args.tp or 1, pp=args.pp, cp=args.cp, world_size=world_size)

    @property
    def product(self):
        return self.pp * self.dp * self.cp * self.tp

    @property
    def shape(self):
        """The mesh's shape, in NAMES' order."""
        return tuple(getattr(self, name) for name in NAMES)

    def check_model(self, blocks, heads, width, hidden, rows, batch, microbatches):
        """One sentence on a model or batch this layout cannot cut; before anyone waits."""
        if blocks % self.pp:
            raise UserError(f"--blocks {blocks} cannot be cut into --pp {self.pp} stages of "
                            f"equal size; use a multiple of {self.pp} layers")
        if width % heads:
            raise UserError(f"--width {width} cannot be split into --heads {heads} heads of "
                            f"equal size; use a multiple of {heads}")
        if heads % self.tp:
            raise UserError(f"--heads {heads} cannot be shared by --tp {self.tp} processes: "
                            f"each holds whole heads; use a multiple of {self.tp} heads")
        if hidden % self.tp:
            raise UserError(f"--hidden {hidden} cannot be cut into --tp {self.tp} equal "
                            f"slices; use a multiple of {self.tp}")
        if rows % self.cp:
            raise UserError(f"the images' {rows} rows (the sequence) cannot be cut evenly over "
                            f"--cp {self.cp} processes; use a --cp that divides {rows}")
        if batch % self.dp:
            raise UserError(f"--batch-size {batch} cannot be split evenly over --dp {self.dp} "
                            f"replicas")
        if self.pp > 1 and (batch // self.dp) % microbatches:
            raise UserError(f"--microbatches {microbatches} does not divide the "
                            f"{batch // self.dp} samples each replica takes a step; use a "
                            f"divisor of {batch // self.dp}")

    def coordinates(self, rank):
        """{dimension: index} of a rank in the mesh (row-major in NAMES' order)."""
        where = {}
        for name in reversed(NAMES):
            rank, where[name] = divmod(rank, getattr(self, name))
        return {name: where[name] for name in NAMES}

    def build_mesh(self, device_type):
        """The one device mesh of the job: a process group per line along each dimension."""
        from torch.distributed.device_mesh import init_device_mesh
        return init_device_mesh(device_type, self.shape, mesh_dim_names=NAMES)

    def layout(self):
        """The degrees as flags, for logs and checkpoints."""
        return " ".join(f"--{name} {getattr(self, name)}" for name in NAMES)
