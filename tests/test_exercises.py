"""The exercises' solutions (notebooks/solutions/) run and give the right answers, on CPU, quickly.

Two real runs (a one-device run and a 2-process torchrun job) plus three tiny CPU runs for lesson 01;
lessons 07b-10 check their solutions in their own test files, against the runs those files make;
everything else is computed without training.
"""

import importlib.util
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def solution(name):
    """Import notebooks/solutions/<name>.py (its name starts with a digit, so not with `import`)."""
    path = ROOT / "notebooks" / "solutions" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"solution_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_notebook_has_exercises_and_solutions():
    import json

    for nb in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")):
        text = "".join(
            "".join(c["source"])
            for c in json.loads(nb.read_text())["cells"]
            if c["cell_type"] == "markdown"
        )
        assert "## Exercises" in text, nb.name
        assert (ROOT / "notebooks" / "solutions" / f"{nb.stem}.py").exists(), nb.name


def test_00_backends_and_ghost():
    import torch

    s = solution("00_environment")
    b = s.usable_backends()
    assert b["gloo"][0]
    assert b["nccl"][0] == (torch.distributed.is_nccl_available() and torch.cuda.is_available())
    assert s.find_and_end_ghost() == (True, True)


def test_01_dropout_and_threads(tmp_path):
    s = solution("01_cpu_baseline")
    dropout, threads = s.run_all(tmp_path / "logs", quick=True)
    assert "reached the higher test accuracy" in dropout and "loss falls" in dropout
    assert "Two threads took" in threads and (
        "faster" in threads or "slower" in threads or "as fast" in threads
    )


def test_02_one_device_and_02b_dashboard(tmp_path):
    import json

    # lesson 02's exercise makes the run whose log lesson 02b's dashboard draws
    log = solution("02_single_gpu").train(
        "ex02", tmp_path, extra=["--train-size", 256, "--test-size", 256]
    )
    s = solution("02b_feeding_the_gpu")
    fig = s.dashboard(log, tmp_path / "dashboard.png")
    assert len(fig.axes) >= 3 and (tmp_path / "dashboard.png").stat().st_size > 0
    # the same dashboard with GPU samples, as a GPU run logs them (logs/README.md, 'gpu' records)
    gpu_log = tmp_path / "with_gpu.jsonl"
    lines = log.read_text().splitlines()
    samples = [
        json.dumps(
            dict(
                type="gpu",
                run="ex02",
                time=1.0,
                gpu=0,
                utilization_pct=u,
                memory_used_mb=900.0,
                memory_total_mb=1000.0,
                sampled_at=1.0 + t,
                elapsed_s=t,
            )
        )
        for t, u in enumerate((10, 80, 95))
    ]
    gpu_log.write_text("\n".join(lines[:-1] + samples + lines[-1:]) + "\n")
    fig = s.dashboard(gpu_log, tmp_path / "dashboard_gpu.png")
    assert len(fig.axes[2].lines) == 2  # utilisation and memory of GPU 0


def test_03_pieces_and_replica():
    import torch

    s = solution("03_data_parallel")
    for batch in (1, 7, 10, 64):
        for gpus in (1, 3, 4, 8):
            assert s.pieces(batch, gpus) == [len(p) for p in torch.arange(batch).chunk(gpus)]
    assert s.idle_gpus(10, 4) == 0 and s.idle_gpus(2, 4) == 2
    r = s.replica_mib("cnn", 4)
    assert r["dp_copy_mib"] == pytest.approx(3 * r["params_mib"])
    assert r["ddp_ring_mib_per_gpu"] == pytest.approx(1.5 * r["params_mib"])


def test_04_shards():
    s = solution("04_ddp")
    assert s.check_shards()
    assert s.my_shards(10, 3, 0, 1) != s.my_shards(10, 3, 0, 2)  # set_epoch's new order


def test_04a1_ring_bytes_and_bus_bandwidth():
    s = solution("04a1_inside_ddp")
    assert s.check_formula()
    assert s.ring_bytes(8, 2) == 8 and s.ring_bytes(8, 4) == 12  # 2(N-1)/N of the size
    # 2 x 7/8 x 4,687.8 KiB at 25 GB/s, worked by hand
    assert s.cnn_allreduce_ms(world=8, bus_gbps=25.0) == pytest.approx(0.33603, abs=1e-5)


def test_04a2_weak_scaling_and_rate():
    s = solution("04a2_tuning_ddp")
    rows = s.weak_scaling(per_process=32, samples=512)
    assert [r["global_batch"] for r in rows] == [32, 64, 128] and [
        r["steps_per_epoch"] for r in rows
    ] == [16, 8, 4]
    assert [s.linear_lr(r["global_batch"]) for r in rows] == pytest.approx([0.02, 0.04, 0.08])
    assert s.linear_lr(128) == pytest.approx(0.08)  # the notebook's batch 128 at 8 times the rate


def test_04a3_every_worker_placed():
    s = solution("04a3_nodes_and_faults")
    placed = s.check_placement(nnodes=2, nproc_per_node=4)
    assert placed[5] == (5, 1, 1)  # rank 5: node 1's local rank 1, as lesson 04's table has it
    assert len(s.check_placement(nnodes=3, nproc_per_node=2)) == 6


def test_04_several_devices(tmp_path):
    s = solution("04_ddp")
    ddp = s.several_devices(
        "ex04", tmp_path, nproc=2, extra=["--train-size", 256, "--test-size", 256]
    )
    assert ddp["world_size"] == 2


def test_04b_template_and_amdahl(tmp_path):
    from lessons.bylesson import slurm

    s = solution("04b_slurm")
    assert slurm.check_counts(s.two_by_two(tmp_path))[1] == []
    assert any(
        "one task per GPU" in p
        for p in slurm.check_counts(s.two_by_two(tmp_path, tasks_per_node=3))[1]
    )
    a = s.amdahl(slurm.published_scaling())
    assert 0 < a["serial_share"] < 0.1 and a["gpus"] == 128  # the largest published run
    a, verdict = s.main()
    assert ("BETTER" in verdict) == (a["published_speedup"] > 1.1 * a["predicted_speedup"])


def test_05_learning_rate_and_micro_weights():
    s = solution("05_horovod")
    assert s.scaled_lr(0.1, 4, 0) == 0.1 and abs(s.scaled_lr(0.1, 4, 5) - 0.4) < 1e-12
    assert (
        abs(s.scaled_lr(0.1, 4, 2.5) - 0.25) < 1e-12
        and s.scaled_lr(0.1, 4, 0, warmup_epochs=0) == 0.4
    )
    # by hand: equal micro-batches weigh alike either way; a short last one (4 of 36 samples) gets
    # 1/3 when each loss is divided by K, 3 times its share of 1/9
    assert s.micro_weights([16] * 4, "divide_by_k") == s.micro_weights([16] * 4) == [0.25] * 4
    assert s.micro_weights([16, 16, 4], "divide_by_k") == [1 / 3] * 3
    assert s.micro_weights([16, 16, 4]) == [16 / 36, 16 / 36, 4 / 36]


def test_05b_ring_and_timeline(tmp_path):
    import json

    s = solution("05b_inside_horovod")
    assert s.ring_bytes(1000, 2) == 4000 and s.ring_bytes(1000, 4) == 6000
    assert s.ring_bytes(1000, 4, fp16_allreduce=True) == 3000

    # a timeline as Horovod writes it: an open JSON list, B/E pairs per row, nested in ALLREDUCE
    def span(name, start, end):
        return [dict(ph="B", name=name, ts=start, pid=1, tid=0), dict(ph="E", ts=end, pid=1, tid=0)]

    events = [
        dict(ph="M", name="process_name", pid=1),
        *span("NEGOTIATE_ALLREDUCE", 0, 30),
        dict(ph="B", name="ALLREDUCE", ts=30, pid=1, tid=0),
        *span("MEMCPY_IN_FUSION_BUFFER", 30, 35),
        *span("GLOO_ALLREDUCE", 35, 65),
        *span("MEMCPY_OUT_FUSION_BUFFER", 65, 70),
        dict(ph="E", ts=70, pid=1, tid=0),
    ]
    path = tmp_path / "timeline.json"
    path.write_text("[\n" + ",\n".join(json.dumps(e) for e in events) + ",\n")
    shares = s.allreduce_share(path)
    # by hand: the leaves inside the ALLREDUCE (40 us): 30, 5 and 5; the negotiation waits: out
    assert shares == {
        "GLOO_ALLREDUCE": 0.75,
        "MEMCPY_IN_FUSION_BUFFER": 0.125,
        "MEMCPY_OUT_FUSION_BUFFER": 0.125,
    }


def test_06_placement_and_stage_memory():
    s = solution("06_pipeline_parallel")
    assert s.check_placement()
    # by hand: lesson 06's 2 processes, 2 stages each; a V brings the last stage back to rank 0
    assert s.stages_of(0, 2, 2, "loop") == [0, 2] and s.stages_of(0, 2, 2, "v") == [0, 3]
    assert s.stages_of(2, 4, 2, "v") == [2, 5] and s.stages_of(1, 4, 1, "loop") == [1]
    mem = s.stage_memory_mb(blocks=4, width=10, stages=2)
    assert (
        abs(mem["parameters_mb"] - 2 * 110 * 4 / 1e6) < 1e-12
        and mem["with_grads_and_adam_mb"] == 4 * mem["parameters_mb"]
    )


def test_06b_1f1b_order_and_the_gpipe_step():
    s = solution("06b_pipeline_schedules")
    assert s.check_order() and s.check_gpipe()
    # by hand: rank 0 of 2 warms up with one forward; the last rank alternates from the start
    assert s.one_f_one_b(2, 4, 0) == [
        ("F", 0),
        ("F", 1),
        ("B", 0),
        ("F", 2),
        ("B", 1),
        ("F", 3),
        ("B", 2),
        ("B", 3),
    ]
    assert s.one_f_one_b(2, 2, 1) == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]
    assert s.gpipe_step(4, 8, 1.0, 2.0) == 33.0 and s.idle_share(4, 8) == pytest.approx(3 / 11)


def test_06c_bubble_activations_and_memory():
    s = solution("06c_bubble_and_memory")
    for p in (2, 4, 8):
        m = s.microbatches_for(p)
        assert s.bubble(p, m) <= 0.10 < s.bubble(p, m - 1)
    assert s.activations_held(4, 8, "gpipe") == [8, 8, 8, 8]
    assert s.activations_held(4, 8, "1f1b") == [4, 3, 2, 1] and s.activations_held(
        4, 2, "1f1b"
    ) == [2, 2, 2, 1]
    # exercise 3 against the stages' own activation meter: the last of 2 stages holds 2 blocks and
    # the head, which keeps its input (width values a sample) besides
    import torch
    from trainup import models
    from trainup.parallel import pipeline

    for recompute in (False, True):
        torch.manual_seed(0)
        stages = pipeline.cut(models.BlockStack((1, 28, 28), 10, 4, 32).double(), 2, recompute)
        out = stages[1](torch.randn(8, 32, dtype=torch.float64, requires_grad=True))  # kept: so is
        head = 32 * 8 * 8  # what autograd saved for its backward
        assert stages[1].meter.bytes == s.kept_per_microbatch(2, 32, 8, recompute, 8) + head
        out.sum().backward()


def test_07_steps_per_epoch_and_the_padded_test_set():
    s = solution("07_lightning")
    assert s.steps_per_epoch(4000, 48, 6) == (667, 84) and s.steps_per_epoch(512, 64, 2) == (256, 8)
    with pytest.raises(ValueError, match="evenly"):
        s.steps_per_epoch(4000, 64, 6)  # 64 samples over 6 processes
    from torch.utils.data import DistributedSampler

    for n, world in ((257, 2), (257, 4), (256, 4), (3, 4)):
        real = [
            list(DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=False))
            for r in range(world)
        ]
        assert s.padded_shares(n, world) == real
        assert s.overcount(n, world) == sum(map(len, real)) - n


def test_07c_lightning2_flags_and_what_bfloat16_rounds_away():
    import torch

    s = solution("07c_lightning_options")
    assert s.to_lightning2(dict(gpus=4, num_nodes=2, precision=16)) == dict(
        devices=4, accelerator="gpu", num_nodes=2, precision="16-mixed"
    )
    with pytest.raises(ValueError, match="dp"):
        s.to_lightning2(dict(strategy="dp"))
    for dtype, bits in ((torch.bfloat16, 7), (torch.float16, 10), (torch.float32, 23)):
        assert s.spacing_above_one(bits) == torch.finfo(dtype).eps
    # a step of 0.001 on a weight of 1.0: lost in bfloat16 (spacing 1/128), kept in the others
    kinds = (torch.bfloat16, torch.float16, torch.float32)
    assert [s.update_kept(d, 1.0, 1e-3) for d in kinds] == [False, True, True]
    assert s.update_kept(torch.bfloat16, 1.0, 2**-7)  # one whole spacing is kept


def test_09a1_bytes_sent_and_accumulation():
    s = solution("09a1_sharding_costs")
    ddp = s.ring_bytes("none", 10, 4)
    assert ddp == 2 * 10 * 4 * 3 / 4  # an all-reduce: 2Ψ(N-1)/N values of 4 bytes
    assert s.ring_bytes("gradients", 10, 4) == ddp  # reduce-scatter + all-gather
    assert s.ring_bytes("parameters", 10, 4) / ddp == pytest.approx(1.5)  # gathered twice
    assert s.ring_bytes("optimizer", 10, 4) / ddp == pytest.approx(1.5)  # + the broadcasts
    for mode in ("none", "gradients", "parameters"):  # one micro-batch: exercise 1's step
        assert s.accumulated_bytes(mode, 10, 4, 1) == s.ring_bytes(mode, 10, 4)
    assert s.accumulated_bytes("none", 10, 4, 8) == ddp  # no_sync: one all-reduce a step
    assert s.accumulated_bytes("gradients", 10, 4, 4) == pytest.approx(2.5 * ddp)  # 4 RS + 1 AG
    assert s.six_times_ddp() == 4  # 3K/2 = 6


def test_09a2_hybrid_sharding_and_resharding():
    s = solution("09a2_fsdp_at_scale")
    layouts = s.hybrid(1000)
    assert layouts["fsdp"] == (16 * 1000 / 8, ("all_gather", "reduce_scatter"))
    assert layouts["hsdp"] == (16 * 1000 / 4, ("all_reduce",))  # a replica's 4 GPUs share it
    # by hand: torch.chunk cuts 10 rows into 5 + 5 (saved by 2) and 3 + 3 + 3 + 1 (loaded by 4)
    assert s.pieces(10, 2, 4) == {
        0: [(0, 0, 3)],
        1: [(0, 3, 5), (1, 5, 6)],
        2: [(1, 6, 9)],
        3: [(1, 9, 10)],
    }
    assert s.pieces(10, 2, 3) == {0: [(0, 0, 4)], 1: [(0, 4, 5), (1, 5, 8)], 2: [(1, 8, 10)]}
    assert s.pieces(10, 2, 1) == {0: [(0, 0, 5), (1, 5, 10)]}  # one process reads both files
    assert s.pieces(5, 4, 2) == {0: [(0, 0, 2), (1, 2, 3)], 1: [(1, 3, 4), (2, 4, 5)]}  # 2+2+1


def test_09b_longest_sequence_and_crossover():
    from trainup import transformer

    s = solution("09b_activations")
    plain, full = s.longest_sequence(40e9), s.longest_sequence(40e9, full=True)
    assert 32 * transformer.activation_bytes(plain, 1, 4096, 32, 2) <= 40e9
    assert 32 * transformer.activation_bytes(plain + 1, 1, 4096, 32, 2) > 40e9
    # full recomputation: every layer's input, plus one layer's activations while it is recomputed
    peak = lambda n: 32 * 2 * n * 4096 + transformer.activation_bytes(n, 1, 4096, 32, 2)  # noqa: E731
    assert peak(full) <= 40e9 < peak(full + 1) and 22_000 < full < 22_200 and full > 5 * plain
    assert s.crossover() == 256 and 4 * 256 * 256 == 16 * 256 * 64  # a*s*s = 16*s*h there


def test_11_crossover_and_even_size():
    from lessons import hardware, perfmodel as pm

    s = solution("11_predict_the_cluster")
    link = hardware.LINKS["ib_hdr"]
    for p in (8, 64):
        n = s.crossover(p, link)
        # equal there; the tree cheaper below, the ring above
        assert math.isclose(
            pm.ring_all_reduce(n, p, link.alpha_s, link.beta),
            pm.tree_all_reduce(n, p, link.alpha_s, link.beta),
            rel_tol=1e-9,
        )
        assert pm.tree_all_reduce(n / 2, p, link.alpha_s, link.beta) < pm.ring_all_reduce(
            n / 2, p, link.alpha_s, link.beta
        )
        # where latency and bytes are even, the ring takes twice its latency alone
        even = s.even_size(p, link.alpha_s, link.beta)
        assert math.isclose(
            pm.ring_all_reduce(even, p, link.alpha_s, link.beta),
            2 * pm.ring_all_reduce(0, p, link.alpha_s, link.beta),
            rel_tol=1e-9,
        )
    assert s.even_size(2, 1e-5, 1e9) == pytest.approx(2e4)  # 2 x 10 us x 1 GB/s, by hand


def test_11a1_my_cluster():
    s = solution("11a1_published_runs")
    row = s.my_cluster(64).iloc[0]
    assert row["gpus"] == 64 and 0 < row["efficiency"] < 1


def test_11a2_checkpoint_budget_and_fewest_gpus():
    from lessons import hardware, perfmodel as pm
    from lessons.bylesson import planner, predict

    s = solution("11a2_planner")
    c = s.checkpoint_budget(16_384, 120.0, 0.10)
    mtbf = pm.mtbf_hours(16_384, pm.failure_rate_per_gpu_hour(**predict.LLAMA3)) * 3600
    lost = pm.expected_overhead(pm.young_daly_interval(c, mtbf), c, mtbf, 120.0)
    assert 0 < c and math.isclose(lost, 0.10, rel_tol=1e-6)
    node, model = hardware.NODES["juwels_booster"], planner.llama_shaped(5120)
    n, row = s.fewest_gpus(model, 128, node, 40)
    assert row["fits"] and row["total_gb"] <= 40
    assert not planner.plan(model, 128, n // 2, node, 40)["fits"].any()  # half as many: none fits


def test_04c_spot_break_even_and_the_padded_return():
    from lessons.bylesson import elastic

    s = solution("04c_elastic")
    rate = s.break_even(4.0, 1.2, 0.25)
    below, above = (elastic.spot_cost(10, 4.0, 1.2, r, 0.25) for r in (rate * 0.9, rate * 1.05))
    assert below["spot_cost"] < below["on_demand_cost"]
    assert above["spot_cost"] > above["on_demand_cost"]
    assert "1001 samples do not split evenly" in s.padded_return()
    assert s.padded_return(samples=1000) is None  # even: the epoch goes on from the step


def test_12_expert_parameters_and_capacity():
    answers = solution("09e_experts")
    used, share = answers.expert_parameters_used()
    assert used == 2 * 2 * 4096 * 14336 and share == pytest.approx(2 / 64)
    limit, kept = answers.kept_at_most()
    assert limit == 160 and kept == 4096 * 2  # 64 x 160 places, more than the 8192 assignments


def test_11b_padding_at_8192_ranks_and_bf16_against_fp32():
    from lessons.bylesson import simulated_world as sw

    answers = solution("11b_simulated_world")
    held, even = answers.weights_at()
    model = answers.MODEL
    # by hand, a rank's rows: one of each 4096-row parameter (half a row split evenly), two of
    # fc1's 16384; q, k, v and proj's rows are h values, fc1's h, fc2's 4h; the 9 vectors of h
    # values one value each, fc1's bias (4h) two
    h = model.hidden
    per_layer = 4 * h + 2 * h + 4 * h + 9 + 2
    assert held == pytest.approx(4 * model.layers * per_layer)
    assert even == pytest.approx(4 * model.params() / 8192) and held / even > 1.5
    changed = answers.bf16_against_fp32()
    # FSDP2 gathers and computes in bf16: what it gathers and computes halves; the fp32 shards,
    # gradients, Adam's states and the fp32 reduce-scatter do not change
    assert changed["All Gather"] == (4 * model.layer_params(), 2 * model.layer_params())
    assert set(changed) == {"Unsharded Param", "Unsharded Grad", "Activation", "Temp", "All Gather"}
    assert set(sw.CATEGORIES) > set(changed)  # every other category is the same in both


def test_09f_buckets_and_when_compiling_pays():
    answers = solution("09f_compile")
    first_bucket = [["fc2", "fc1"], ["conv2", "conv1"]]  # fc1 alone passes 1 MiB
    assert answers.buckets(1) == answers.buckets(25) == first_bucket
    # a bucket that holds exactly the cap is full: 1 MiB each for a and b, then c alone
    assert answers.buckets(1, sizes={"a": 2**17, "b": 2**17, "c": 1}) == [["a"], ["b"], ["c"]]
    steps = answers.steps_to_pay()
    saved = (steps - 1) * (0.75 - 0.70)
    assert saved >= 150.0 - 0.75 > saved - 0.05  # the first step after which it has paid


def test_09h_float8_values_and_the_margin_that_stops_saturation():
    import torch

    answers = solution("09h_float8")
    # by hand: E4M3fn's positive patterns 0x01 to 0x7F but its one NaN (all ones); E5M2's 0x01 to
    # 0x7B (its top exponent, 0x7C to 0x7F, is infinity and NaN)
    assert answers.finite_positive_values(torch.float8_e4m3fn) == 126
    assert answers.finite_positive_values(torch.float8_e5m2) == 123
    # amax 1, 1, then 4: the delayed scale is 4 times too large at the last step; 2^2 takes it back
    grads = [torch.full((4,), v) for v in (1.0, 1.0, 4.0)]
    assert answers.margin_without_saturation(grads, torch.float8_e4m3fn)[0] == 2
    m, error, plain = answers.margin_without_saturation()  # the lesson's 12 steps
    assert m >= 1 and error > 0 and plain > 0  # margin 0 saturates there (lesson 09h asserts it)
