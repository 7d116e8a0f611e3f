"""trainup/parallel/parallel_dims.py: the layout of a four-dimensional job is checked in one place,
each bad layout one sentence (a UserError), and a rank's place in the mesh is where init_device_mesh
puts it (the mesh itself is built by the real jobs of tests/test_four_d.py)."""

import itertools
from types import SimpleNamespace

import pytest

from trainup import UserError
from trainup.parallel.parallel_dims import NAMES, ParallelDims

pytestmark = pytest.mark.fast

MODEL = dict(blocks=4, heads=4, width=16, hidden=32, rows=28, batch=32, microbatches=2)


def test_a_good_layout_is_kept_whole_and_frozen():
    dims = ParallelDims(dp=2, tp=2, pp=2, cp=2, world_size=16)
    dims.check_model(**MODEL)
    assert dims.shape == (2, 2, 2, 2) and NAMES == ("pp", "dp", "cp", "tp")
    assert dims.layout() == "--pp 2 --dp 2 --cp 2 --tp 2"
    with pytest.raises(AttributeError):  # frozen: checked once, never changed after
        dims.tp = 4


@pytest.mark.parametrize(
    "degrees, world, words",
    [
        (dict(dp=2, tp=2, pp=2, cp=1), 4, ["needs 8 processes, and this job has 4"]),
        (dict(dp=1, tp=3, pp=2, cp=1), 8, ["--tp 3 needs 6 processes", "--nproc-per-node 6"]),
        (dict(dp=0, tp=2, pp=2, cp=1), 4, ["--dp 0 is not a number of processes"]),
        (dict(dp=1, tp=1, pp=-1, cp=1), 1, ["--pp -1 is not a number of processes"]),
    ],
)
def test_a_layout_whose_product_is_not_the_world_is_one_sentence(degrees, world, words):
    with pytest.raises(UserError) as refused:
        ParallelDims(**degrees, world_size=world)
    assert "\n" not in str(refused.value)
    for w in words:
        assert w in str(refused.value)


@pytest.mark.parametrize(
    "degrees, model, words",
    [
        (dict(pp=3), dict(blocks=4), ["--blocks 4 cannot be cut into --pp 3 stages"]),
        (dict(tp=8), dict(heads=4, width=32, hidden=64), ["--heads 4 cannot be shared by --tp 8"]),
        (dict(tp=4), dict(hidden=30), ["--hidden 30 cannot be cut into --tp 4"]),
        (dict(), dict(heads=5, width=16), ["--width 16 cannot be split into --heads 5"]),
        (dict(cp=3), dict(), ["28 rows (the sequence) cannot be cut evenly over --cp 3"]),
        (dict(dp=3), dict(), ["--batch-size 32 cannot be split evenly over --dp 3"]),
        (dict(pp=2, dp=2), dict(microbatches=3), ["--microbatches 3 does not divide the 16"]),
    ],
)
def test_a_model_the_layout_cannot_cut_is_one_sentence(degrees, model, words):
    full = {**dict(dp=1, tp=1, pp=1, cp=1), **degrees}
    dims = ParallelDims(**full, world_size=full["dp"] * full["tp"] * full["pp"] * full["cp"])
    with pytest.raises(UserError) as refused:
        dims.check_model(**{**MODEL, **model})
    assert "\n" not in str(refused.value)
    for w in words:
        assert w in str(refused.value)


def test_micro_batches_are_not_checked_without_a_pipeline():
    ParallelDims(dp=2, tp=1, pp=1, cp=1, world_size=2).check_model(**{**MODEL, "microbatches": 3})


def test_dp_left_out_takes_the_processes_the_others_leave():
    args = SimpleNamespace(dp=None, tp=2, pp=2, cp=2)
    assert ParallelDims.from_args(args, 16).dp == 2
    args = SimpleNamespace(dp=None, tp=None, pp=1, cp=1)
    assert ParallelDims.from_args(args, 1) == ParallelDims(dp=1, tp=1, pp=1, cp=1, world_size=1)


def test_coordinates_are_the_mesh_row_major_tp_innermost():
    """init_device_mesh lays ranks out as torch.arange(world).view(shape): the coordinates of a
    rank are its index there, so the tp ranks of a layer are neighbours and pp the outermost."""
    import torch

    dims = ParallelDims(dp=2, tp=2, pp=2, cp=2, world_size=16)
    grid = torch.arange(16).view(dims.shape)
    for index in itertools.product(*(range(n) for n in dims.shape)):
        rank = int(grid[index])
        assert dims.coordinates(rank) == dict(zip(NAMES, index))
    assert dims.coordinates(1) == dict(pp=0, dp=0, cp=0, tp=1)
    assert dims.coordinates(8) == dict(pp=1, dp=0, cp=0, tp=0)
