"""Lesson 11's model: each formula against a hand computation, and the predictions of published
runs against their goals (the numbers are published, so these are exact checks, not timings)."""

import math

import pytest

from lessons import hardware, perfmodel as pm
from lessons.bylesson import predict, slurm

A, B = 1e-5, 1e9  # 10 us, 1 GB/s: hand-friendly


def test_the_collectives_cost_what_the_alpha_beta_model_says():
    n = 1e9  # one GB
    assert pm.p2p(n, A, B) == pytest.approx(1 + 1e-5)
    # ring of 4: 6 latencies, 2 * 3/4 of the bytes
    assert pm.ring_all_reduce(n, 4, A, B) == pytest.approx(6e-5 + 1.5)
    # tree of 4: 2 * log2(4) = 4 rounds, each the whole buffer
    assert pm.tree_all_reduce(n, 4, A, B) == pytest.approx(4 * (1e-5 + 1))
    assert pm.ring_all_gather(n, 4, A, B) == pytest.approx(3e-5 + 0.75)
    assert pm.ring_reduce_scatter(n, 4, A, B) == pm.ring_all_gather(n, 4, A, B)
    for f in (pm.ring_all_reduce, pm.tree_all_reduce, pm.ring_all_gather):
        assert f(n, 1, A, B) == 0  # one rank sends nothing
    # the tree wins small messages on many ranks, the ring large ones
    assert pm.tree_all_reduce(8, 1024, A, B) < pm.ring_all_reduce(8, 1024, A, B)
    assert pm.ring_all_reduce(n, 1024, A, B) < pm.tree_all_reduce(n, 1024, A, B)


def test_a_step_of_collectives_costs_each_calls_latency_and_all_its_bytes():
    n = 1e9
    # a tree broadcast over 2 ranks is one message; over 8, three rounds of the whole buffer
    assert pm.tree_broadcast(n, 2, A, B) == pytest.approx(1e-5 + 1)
    assert pm.tree_broadcast(n, 8, A, B) == pytest.approx(3 * (1e-5 + 1))
    assert pm.tree_broadcast(n, 1, A, B) == 0
    # 2 ranks: 4 all-reduce calls of 1 GB in all (2 latencies each, the bytes once), then 10
    # broadcasts of 1 KB in all (a latency each, every byte)
    ops = {
        "all_reduce": {"calls": 4, "bytes": n},
        "broadcast": {"calls": 10, "bytes": 1000},
        "all_gather": {"calls": 0, "bytes": 0},
    }
    by_hand = 4 * 2 * A + n / B + 10 * A + 1000 / B
    assert pm.collectives(ops, 2, A, B) == pytest.approx(by_hand)
    assert pm.collectives(ops, 1, A, B) == 0  # one rank sends nothing
    assert pm.collectives({}, 2, A, B) == 0


def test_a_hierarchical_all_reduce_is_the_node_rings_plus_one_ring_across_nodes():
    n, intra, inter = 1e9, (1e-6, 100e9), (A, B)
    inside = 2 * (3 * 1e-6 + 0.75 * n / 100e9)  # reduce-scatter and all-gather over 4 GPUs
    across = 2 * 7 * A + 2 * 7 / 8 * n / B  # ring all-reduce over 8 nodes at the node's bandwidth
    assert pm.hierarchical_all_reduce(n, 8, 4, intra, inter) == pytest.approx(inside + across)


def test_overlap_hides_communication_behind_backward_bucket_by_bucket():
    assert pm.exposed(3.0, 6.0, 1) == 3.0  # one bucket: sent after backward, all exposed
    # 3 buckets of 1 s ready at 2, 4, 6 s: sent at 2-3, 4-5, 6-7: 1 s past backward
    assert pm.exposed(3.0, 6.0, 3) == pytest.approx(1.0)
    # more communication than backward: the queue runs past it; 3 buckets of 3 s from 2 s: 11 s
    assert pm.exposed(9.0, 6.0, 3) == pytest.approx(5.0)
    # backward 2 s of a 3 s step; buckets of 1 s ready at 2/3, 4/3, 2 s, sent back to back from
    # 2/3 s: the last ends at 3 2/3 s, 1 2/3 s past backward
    assert pm.step_time(3.0, 3.0, backward_share=2 / 3, buckets=3) == pytest.approx(3.0 + 5 / 3)
    assert pm.step_time(1.0, bubble=0.5, fixed_s=0.25) == pytest.approx(2.25)
    assert pm.efficiency(1.0, 1.25) == 0.8


def test_zero_traffic_and_the_pipeline_bubble():
    assert pm.zero_traffic(1e9, 4, 0) == pytest.approx(1.5e9)
    assert pm.zero_traffic(1e9, 4, 2) == pm.zero_traffic(1e9, 4, 0)
    assert pm.zero_traffic(1e9, 4, 3) == pytest.approx(2.25e9)  # 1.5 times DDP's
    # 4 stages, 4 micro-batches: bubble 3/7, so a quarter of the compute over 4/7
    assert pm.pipeline_step(8.0, 4, 4) == pytest.approx(2.0 / (4 / 7))


def test_failures_and_the_young_daly_interval():
    rate = pm.failure_rate_per_gpu_hour(**predict.LLAMA3)
    assert rate == pytest.approx(419 / (54 * 24 * 16384))
    assert pm.mtbf_hours(16384, rate) == pytest.approx(54 * 24 / 419)
    c, m = 60.0, 3600.0 * 24
    young = math.sqrt(2 * c * m)
    tau = pm.young_daly_interval(c, m)
    assert young * 0.98 < tau < young * 1.02  # Daly's correction is small when C << M
    assert pm.young_daly_interval(10.0, 4.0) == 4.0  # a checkpoint longer than 2M: as often as M
    # the interval that loses least is Young/Daly's, not one much shorter or longer
    lost = [pm.expected_overhead(t, c, m, 300) for t in (tau / 4, tau, tau * 4)]
    assert lost[1] < lost[0] and lost[1] < lost[2]
    assert pm.cost(8, 10, 2.5) == 200
    table = predict.reliability([8, 16384], 60, 300)
    assert (
        table["mtbf_h"].iloc[0] > table["mtbf_h"].iloc[1] and table["lost"].is_monotonic_increasing
    )


def test_the_published_links_are_per_direction_and_the_nodes_name_theirs():
    for link in hardware.LINKS.values():
        assert link.alpha_s > 0 and link.beta > 1e9 and link.source
    booster = hardware.NODES["juwels_booster"]
    assert booster.inter_link()[1] == 4 * 25e9  # four HDR200 adapters
    assert booster.intra_link()[1] == 300e9


@pytest.fixture(scope="module")
def facts():
    return {
        n: predict.model_facts(n)
        for n in ("resnet50", "resnet101", "resnet152", "vgg16", "inception_v3")
    }


def test_the_architectures_are_counted_as_torchvision_builds_them(facts):
    assert facts["resnet50"]["params"] == 25_557_032
    assert facts["vgg16"]["params"] == 138_357_544
    # forward and backward: about 3 x 2 x the multiply-adds (ResNet-50: 4.1 G)
    assert 23e9 < facts["resnet50"]["flops"] < 26e9
    # ResNet-101's images/s lies between ResNet-50's and ResNet-152's
    r = predict.P100_IMAGES_PER_S
    rate = predict.interpolate(
        facts["resnet101"]["flops"],
        r["resnet50"],
        r["resnet152"],
        facts["resnet50"]["flops"],
        facts["resnet152"]["flops"],
    )
    assert r["resnet152"] < rate < r["resnet50"]


def test_horovods_512_gpu_efficiencies_are_predicted_within_10_points(facts):
    table = predict.horovod_predictions(facts)
    assert set(table["model"]) == set(predict.HOROVOD_512)
    assert (table["points"].abs() <= predict.HOROVOD_GOAL).all(), table
    # VGG-16 sends the most and scales worst, as published
    assert table.set_index("model")["predicted"].idxmin() == "vgg16"


def test_the_jsc_runs_held_out_are_predicted_from_two_runs_and_the_hardware(facts):
    runs, grad = slurm.published_times(), facts["resnet50"]["params"] * 4
    two = predict.jsc_predictions(runs, grad, buckets=4)
    assert two.loc[two["fitted"], "error"].abs().max() < 1e-3  # two points, two unknowns
    held = two[~two["fitted"]].set_index("gpus")["error"]
    assert held.index.tolist() == [16, 32, 64, 128]
    assert (held.abs() <= predict.JSC_GOAL).all(), held
    # the epoch's start costs the same minutes on 128 GPUs as on 16: its share of the run grows
    fit = predict.jsc_fit(runs, grad, 4)
    assert fit["sync"] == fit["fixed"] == 0 and fit["epoch_start"] > 0
    start = predict.JSC_COSTS["epoch_start"]
    assert start(16, 128) == start(128, 128) == start(1, 256) / 2
    # the same two runs with the excess put on each step instead: the 128-GPU run missed by far
    # more than the goal, every held-out run short by about the same minutes
    steps = predict.jsc_predictions(runs, grad, buckets=4, **predict.PER_STEP)
    assert steps.set_index("gpus").loc[128, "error"] < -predict.JSC_GOAL, steps
    assert all(0.5 < e < 3 for e in predict.implied_fixed_minutes(steps))
    # with the 16-GPU run as a third point, a cost per step and one per job: within 20 % too
    three = predict.jsc_predictions(runs, grad, buckets=4, **predict.THREE_POINTS)
    assert (three.loc[~three["fitted"], "error"].abs() <= predict.JSC_GOAL).all(), three


def test_the_jsc_fit_shows_how_far_2_percent_of_one_run_moves_it(facts):
    """The two-point fit takes its second unknown from the difference of the 1- and 4-GPU runs:
    2 % more or less of the 4-GPU time moves the 128-GPU prediction by more than the 20 % goal."""
    runs, grad = slurm.published_times(), facts["resnet50"]["params"] * 4
    moved = predict.jsc_sensitivity(runs, grad, 4)
    low, high = moved[128]
    assert low < -predict.JSC_GOAL < predict.JSC_GOAL < high
    assert 0.10 < moved[64][1] < predict.JSC_GOAL < high  # less far from the fitted runs
    # moving nothing moves nothing
    assert predict.jsc_sensitivity(runs, grad, 4, by=0.0)[128] == (0.0, 0.0)


def test_the_jsc_fit_solves_the_costs_it_names_by_hand():
    """Two made-up runs of known per-image time and epoch start: the fit gives them back."""
    import pandas as pd

    per_image, start = 2e-3, 0.1
    rows = []
    for gpus, batch in ((1, 256), (4, 256)):
        fit = dict.fromkeys(predict.JSC_COSTS, 0.0)
        fit.update(per_sample_s=per_image, epoch_start=start)
        comm = predict.jsc_comm(gpus, 1e6) if gpus > 1 else 0.0
        rows.append(
            dict(
                nodes=1,
                gpus=gpus,
                per_gpu_batch=batch,
                minutes=predict.jsc_minutes(fit, gpus, batch, comm, 4),
            )
        )
    got = predict.jsc_fit(pd.DataFrame(rows), 1e6, 4)
    assert got["per_sample_s"] == pytest.approx(per_image)
    assert got["epoch_start"] == pytest.approx(start)
    # by hand: 1 GPU, 256 a step: 10 epochs of ceil(1,281,167 / 256) = 5,005 steps, and 10
    # epoch starts of 256 images
    assert rows[0]["minutes"] * 60 == pytest.approx(10 * 5005 * 256 * per_image + 10 * 256 * start)
    with pytest.raises(ValueError, match="2 runs fit 2 unknowns"):
        predict.jsc_fit(pd.DataFrame(rows), 1e6, 4, costs=("sync", "fixed"))


def test_alpha_and_beta_come_back_from_a_sweep_the_model_made():
    import pandas as pd

    sizes = [2**k for k in range(10, 23, 2)]
    sweep = pd.DataFrame(
        dict(
            size_bytes=sizes,
            world_size=2,
            time_s=[pm.ring_all_reduce(s, 2, 3e-5, 2e9) for s in sizes],
        )
    )
    alpha, beta, table = predict.fit_alpha_beta(sweep)
    assert alpha == pytest.approx(3e-5) and beta == pytest.approx(2e9)
    assert table["error"].abs().max() < 1e-9


def test_a_sweep_tilted_below_the_origin_gets_no_negative_latency():
    """Noise (a busy machine) can put the least-squares line's intercept below 0: the fit is then
    the best line through the origin, alpha 0, as non-negative least squares gives."""
    import numpy as np
    import pandas as pd

    sizes = [2**k for k in range(10, 23, 2)]
    times = [s / 2e9 for s in sizes]
    times[0] *= 0.5  # the smallest message faster than the line allows
    sweep = pd.DataFrame(dict(size_bytes=sizes, world_size=2, time_s=times))
    alpha, beta, _ = predict.fit_alpha_beta(sweep)
    x = np.array(sizes) / np.array(times)  # the weighted rows' size column
    assert alpha == 0 and beta == pytest.approx(2 * (2 - 1) / 2 / (x.sum() / (x**2).sum()))


def test_a_sweep_tilted_down_gets_a_flat_line_not_a_negative_bandwidth():
    """Noise can make the small messages slower than the large (seen once in notebook 11's quick
    sweep): no cost per byte shows, and the fit is the best flat line, beta infinite."""
    import numpy as np
    import pandas as pd

    sizes = [2**k for k in range(10, 23, 2)]
    times = [2e-3 - 1e-4 * k for k in range(len(sizes))]  # each size a little faster
    sweep = pd.DataFrame(dict(size_bytes=sizes, world_size=2, time_s=times))
    alpha, beta, table = predict.fit_alpha_beta(sweep)
    inv = 1 / np.array(times)
    assert beta == float("inf") and alpha == pytest.approx(inv.sum() / (inv**2).sum() / 2)
    assert (table["predicted_s"] == 2 * alpha).all()  # ring on 2 ranks: 2 alpha, no bytes term


def test_what_if_keeps_one_gpu_at_efficiency_1_and_slower_links_cost_more(facts):
    from dataclasses import replace

    runs, grad = slurm.published_times(), facts["resnet50"]["params"] * 4
    fit = predict.jsc_fit(runs, grad, 4, **predict.THREE_POINTS)
    booster = hardware.NODES["juwels_booster"]
    nodes = {"ib": booster, "eth": replace(booster, inter="eth25", nics=1)}
    t = predict.what_if(fit, grad, [1, 16, 128], nodes).set_index(["node", "gpus"])
    assert t.loc[("ib", 1), "efficiency"] == pytest.approx(1.0)
    assert t.loc[("eth", 128), "minutes"] > t.loc[("ib", 128), "minutes"]
    assert t.loc["ib", "efficiency"].is_monotonic_decreasing
