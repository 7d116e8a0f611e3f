"""Solutions to lesson 11's exercises. Run: python notebooks/solutions/11_predict_the_cluster.py"""
import math

from lessons import hardware, planner, predict, slurm
from lessons import perfmodel as pm

MY_NODE = hardware.Node("my cluster: 8 A100 on NVLink, 8 InfiniBand NDR", "A100", 8, "nvlink3",
                        "ib_ndr", 8, "my cluster's documentation")


def my_cluster(gpus=64, node=MY_NODE):
    """Exercise 1: the JSC job (fitted on 1, 4 and 16 of its GPUs) on another node type. Only the
    links change; the step's compute stays the A100's."""
    grad = predict.model_facts("resnet50")["params"] * 4
    fit = predict.jsc_fit(slurm.published_times(), grad, 4, **predict.THREE_POINTS)
    return predict.what_if(fit, grad, [gpus], {node.name: node})


def crossover(p, link):
    """Exercise 2: the ring and the tree cost the same at n bytes where
    2(p-1)a + 2(p-1)/p n/b = 2L(a + n/b), L = ceil(log2 p): n = ab (2(p-1) - 2L) / (2L - 2(p-1)/p).
    Below it the tree's fewer latencies win, above it the ring's fewer bytes."""
    levels = math.ceil(math.log2(p))
    a, b = link.alpha_s, link.beta
    return a * b * (2 * (p - 1) - 2 * levels) / (2 * levels - 2 * (p - 1) / p)


def checkpoint_budget(gpus=16_384, restart_s=120.0, share=0.10):
    """Exercise 3: the longest checkpoint C for which checkpoints and failures together cost at
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
    """Exercise 4: the fewest GPUs (powers of 2) on which some layout of the planner fits, and the
    fastest layout there: (gpus, plan row), or (None, None) up to `most`."""
    gpus = 1
    while gpus <= most:
        table = planner.plan(model, global_batch, gpus, node, memory_gb)
        if not table.empty and table["fits"].iloc[0]:
            return gpus, table.iloc[0]
        gpus *= 2
    return None, None


if __name__ == "__main__":
    print(my_cluster().round(2).to_string(index=False))
    link = hardware.LINKS["ib_hdr"]
    for p in (8, 64, 4096):
        print(f"{p} ranks over {link.name}: the tree wins below {crossover(p, link) / 1e3:.0f} KB")
    print(f"16,384 GPUs: a checkpoint may take {checkpoint_budget():.0f} s for 10 % lost")
    n, row = fewest_gpus(planner.llama_shaped(5120), 128, hardware.NODES["juwels_booster"], 40)
    print(f"Llama 2 13B's shape on A100s of 40 GB: {n} GPUs at least, {row['layout']}")
