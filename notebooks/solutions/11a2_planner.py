"""Solutions to lesson 11a2's exercises. Run: python notebooks/solutions/11a2_planner.py"""
from lessons import hardware
from lessons.bylesson import planner, predict
from lessons import perfmodel as pm


def checkpoint_budget(gpus=16_384, restart_s=120.0, share=0.10):
    """Exercise 1: the longest checkpoint C for which checkpoints and failures together cost at
    most `share` of the run, each C taken with its own Young/Daly interval. The overhead grows
    with C: bisection."""
    mtbf = pm.mtbf_hours(gpus, pm.failure_rate_per_gpu_hour(**predict.LLAMA3)) * 3600

    def lost(c):
        return pm.expected_overhead(pm.young_daly_interval(c, mtbf), c, mtbf, restart_s)

    low, high = 0.0, mtbf
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if lost(mid) <= share else (low, mid)
    return low


def fewest_gpus(model, global_batch, node, memory_gb=None, most=1024):
    """Exercise 2: the fewest GPUs (powers of 2) on which some layout of the planner fits, and the
    fastest layout there: (gpus, plan row), or (None, None) up to `most`."""
    gpus = 1
    while gpus <= most:
        table = planner.plan(model, global_batch, gpus, node, memory_gb)
        if not table.empty and table["fits"].iloc[0]:
            return gpus, table.iloc[0]
        gpus *= 2
    return None, None


if __name__ == "__main__":
    print(f"16,384 GPUs: a checkpoint may take {checkpoint_budget():.0f} s for 10 % lost")
    n, row = fewest_gpus(planner.llama_shaped(5120), 128, hardware.NODES["juwels_booster"], 40)
    print(f"Llama 2 13B's shape on A100s of 40 GB: {n} GPUs at least, {row['layout']}")
