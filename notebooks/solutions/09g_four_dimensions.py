"""Solutions to lesson 09g's exercises. Run: python notebooks/solutions/09g_four_dimensions.py"""

from trainup import UserError
from trainup.parallel.parallel_dims import ParallelDims

# the lesson's job: 32 samples a step, 28 rows an image, width 16, 4 layers, float64
BATCH, ROWS, WIDTH, LAYERS, BYTES = 32, 28, 16, 4, 8


def first_stage_bytes(pp=2, dp=2, cp=2, tp=2):
    """Exercise 1: what one rank of the first stage moves in a step, by dimension. Its replica
    takes BATCH / dp samples, each of ROWS / cp tokens of WIDTH values: one activation. tp: 4
    all-reduces of it per layer (2 forward, 2 backward), LAYERS / pp layers; pp: the activation
    sent on to the next stage (and its gradient received back), whatever the micro-batches."""
    activation = BATCH // dp * ROWS // cp * WIDTH * BYTES
    return {"tp all_reduce": 4 * LAYERS // pp * activation, "pp send": activation}


def refused(layouts, world=16, heads=4):
    """Exercise 2: which layouts ParallelDims refuses, with its sentence."""
    out = {}
    for layout in layouts:
        try:
            dims = ParallelDims(**layout, world_size=world)
            dims.check_model(LAYERS, heads, WIDTH, 32, ROWS, BATCH, 2)
        except UserError as e:
            out[str(layout)] = str(e)
    return out


LAYOUTS = [dict(pp=4, dp=1, cp=1, tp=4), dict(pp=1, dp=1, cp=16, tp=1),
           dict(pp=8, dp=2, cp=1, tp=1), dict(pp=1, dp=2, cp=1, tp=8),
           dict(pp=2, dp=4, cp=1, tp=2)]

if __name__ == "__main__":
    print("Exercise 1:", first_stage_bytes())
    for layout, sentence in refused(LAYOUTS).items():
        print(f"Exercise 2: {layout} refused: {sentence}")
