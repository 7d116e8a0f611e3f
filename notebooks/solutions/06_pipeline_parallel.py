"""Solutions to lesson 06's exercises. Run: python notebooks/solutions/06_pipeline_parallel.py"""
from lessons import report
from lessons.bylesson import schedules
from trainup.parallel import pipeline


def stages_of(rank, ranks, per_rank, shape):
    """Exercise 1: the stages one rank of a pipeline of `ranks` processes holds, `per_rank` each.
    Looped (GPipe, 1F1B, interleaved, looped BFS, interleaved ZB): rank r holds r, r + ranks, ...;
    in a V (ZBV, DualPipeV: two a rank): r and 2 ranks - 1 - r, so rank 0 holds the first stage
    and the last, with the loss."""
    if shape == "v":
        return [rank, 2 * ranks - 1 - rank]
    return [rank + k * ranks for k in range(per_rank)]


def check_placement(most_ranks=8):
    """stages_of agrees with trainup.parallel.pipeline.stage_ids for every schedule and pipeline
    depth."""
    for name, (_, per_rank, shape) in pipeline.SCHEDULES.items():
        for ranks in range(1, most_ranks + 1):
            for rank in range(ranks):
                mine = stages_of(rank, ranks, per_rank, shape)
                assert mine == pipeline.stage_ids(name, rank, ranks), (name, ranks, rank, mine)
    return True


def check_logs(names=("pp_gpipe", "pp_interleaved1f1b", "pp_zbv")):
    """stages_of against the placement the lesson's runs logged, where they are here: the runs
    checked."""
    checked = []
    for name in names:
        if not report.left_here(name, checkpoint=False):
            continue
        cfg = schedules.layout(name)
        _, per_rank, shape = pipeline.SCHEDULES[cfg["schedule"]]
        for p in cfg["placement"]:
            mine = stages_of(p["position"], cfg["pipeline_ranks"], per_rank, shape)
            assert p["stages"] == mine, (name, p, mine)
        checked.append(name)
    return checked


def stage_memory_mb(blocks, width, stages, bytes_per_value=4):
    """Exercise 2: parameters (weights and biases of `blocks` width x width linear layers) held by
    one stage when the blocks are cut evenly, in MB; with Adam's two moments and the gradient, four
    times that."""
    per_block = (width * width + width) * bytes_per_value
    per_stage = -(-blocks // stages) * per_block
    return dict(parameters_mb=per_stage / 1e6, with_grads_and_adam_mb=4 * per_stage / 1e6)


if __name__ == "__main__":
    print("stages_of agrees with trainup.parallel.pipeline.stage_ids:", check_placement())
    print("and with the placement logged by:", ", ".join(check_logs()) or "no run here yet")
    for ranks in (2, 4):
        print(f"{ranks} ranks, V:", [stages_of(r, ranks, 2, "v") for r in range(ranks)],
              "looped:", [stages_of(r, ranks, 2, "loop") for r in range(ranks)])
    print(stage_memory_mb(blocks=48, width=4096, stages=4))
