"""Solutions to lesson 11a1's exercises. Run: python notebooks/solutions/11a1_published_runs.py"""
from lessons import hardware
from lessons.bylesson import predict, slurm

MY_NODE = hardware.Node("my cluster: 8 A100 on NVLink, 8 InfiniBand NDR", "A100", 8, "nvlink3",
                        "ib_ndr", 8, "my cluster's documentation")


def my_cluster(gpus=64, node=MY_NODE):
    """Exercise 1: the JSC job (fitted on 1, 4 and 16 of its GPUs) on another node type. Only the
    links change; the step's compute stays the A100's."""
    grad = predict.model_facts("resnet50")["params"] * 4
    fit = predict.jsc_fit(slurm.published_times(), grad, 4, **predict.THREE_POINTS)
    return predict.what_if(fit, grad, [gpus], {node.name: node})


if __name__ == "__main__":
    print(my_cluster().round(2).to_string(index=False))
