"""Inside DDP, run for real with 2 gloo processes: the collectives, all_reduce bandwidth, DDP's broadcast and
buckets, no_sync accumulation, BatchNorm statistics, and what mistakes and bad flags look like."""

import os
import sys

import pytest
import torch

from conftest import SCRIPTS, Ranks, assert_clean_error, in_process, start_wanted
from lessons import checks, launch, report
from lessons.bylesson import collectives
from test_ddp import finish, ok, start

COLLECTIVES = str(SCRIPTS / "_trainup_collectives.py")
TUNED = str(SCRIPTS / "_trainup_ddp_tuned.py")  # lesson 04's second script: --accumulate, --sync-bn
TINY = ["--quick", "--dropout", "0", "--no-progress"]
SHORT_LAST = ["--train-size", "200"]  # 100 a rank: batches of 32, 32, 32 and 4


def torchrun(script, *args, nproc=2):
    return start(launch.TORCHRUN + launch.torchrun_flags(nproc=nproc) + [script, *map(str, args)])


def ranks(script, *args, nproc=2):
    """As srun starts them, no launcher: each rank a fresh interpreter."""
    return Ranks([sys.executable, script, *map(str, args)], launch.environment(), ntasks=nproc)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory, request):
    """Every job of this file that the selected tests read (their jobs marks), started together (the
    machine has 2 cores; most of each job is waiting)."""
    log_dir = tmp_path_factory.mktemp("inside") / "logs"
    common = ["--log-dir", log_dir]
    train = [
        *TINY,
        *checks.PROOF,
        "--batch-size",
        64,
        *common,
        "--checkpoint-dir",
        log_dir / "checkpoints",
    ]
    out = start_wanted(
        request,
        dict(
            shows=lambda: ranks(
                COLLECTIVES,
                "--show",
                "collectives,bandwidth,ddp",
                "--sizes",
                "1K,64K,1M",
                "--run-name",
                "shows",
                *common,
            ),
            # 3 processes: the ring factor 2(N-1)/N is 4/3 (with 2 it is 1, and a missing factor hides)
            # --rounds 2: the sweep twice over, each size's time the mean of the two
            bw3=lambda: ranks(
                COLLECTIVES,
                "--show",
                "bandwidth",
                "--sizes",
                "1K,64K",
                "--rounds",
                2,
                "--run-name",
                "bw3",
                *common,
                nproc=3,
            ),
            # 200 samples: each rank's epoch ends with a short batch of 4 (one micro-batch of the last step)
            acc1=lambda: ranks(TUNED, *train, *SHORT_LAST, "--accumulate", 1, "--run-name", "acc1"),
            acc4=lambda: ranks(TUNED, *train, *SHORT_LAST, "--accumulate", 4, "--run-name", "acc4"),
            mismatch=lambda: start(
                launch.TORCHRUN
                + launch.torchrun_flags(nproc=2)
                + [COLLECTIVES, "--show", "mismatch"],
                {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
            ),
            hang=lambda: torchrun(COLLECTIVES, "--show", "hang", "--timeout", 3),
        ),
    )
    for name in ("shows", "bw3", "acc1", "acc4"):
        if out[name] is not None:
            ok(out[name])
    return dict(out, log_dir=log_dir)


def extra(jobs, name, kind):
    return [
        r for r in report.read_run(jobs["log_dir"] / f"{name}.jsonl")["extra"] if r["type"] == kind
    ]


@pytest.mark.jobs("shows")
def test_each_collective_gives_every_rank_what_it_defines(jobs):
    got = {r["op"]: r for r in extra(jobs, "shows", "collective")}
    assert got["broadcast"]["before"] == [[1, 1], [2, 2]] and got["broadcast"]["after"] == [
        [1, 1],
        [1, 1],
    ]
    assert got["all_reduce"]["after"] == [[3, 30], [3, 30]]
    assert got["all_gather"]["after"] == [[[1, 10], [2, 20]]] * 2
    assert got["reduce_scatter"]["before"] == [[0, 1, 2, 3], [100, 101, 102, 103]]
    assert got["reduce_scatter"]["after"] == [[100, 102], [104, 106]]
    assert got["reduce_scatter"]["how"]  # the call that did it, or the fallback, from the attempt
    assert (
        collectives.check_collectives("shows", jobs["log_dir"]).count("hold what it defines") == 4
    )


def test_the_collectives_check_catches_a_wrong_result():
    before = [[1.0, 10.0], [2.0, 20.0]]
    assert collectives.expected("all_reduce", before, 2) == [[3.0, 30.0]] * 2
    assert collectives.expected("reduce_scatter", [[0, 1, 2, 3], [100, 101, 102, 103]], 2) == [
        [100, 102],
        [104, 106],
    ]
    assert collectives.expected("broadcast", before, 2) != before


@pytest.mark.jobs("shows", "bw3")
def test_bus_bandwidth_is_algbw_times_the_ring_factor(jobs):
    assert collectives.ring_factor(2) == 1.0 and collectives.ring_factor(8) == 1.75
    assert collectives.bus_bandwidth(1e9, 1.0, 8) == pytest.approx(1.75e9)
    assert collectives.bus_bandwidth(2**20, 0.5, 4) == pytest.approx(2**21 * 1.5)
    t = collectives.bandwidth_table(
        "shows", jobs["log_dir"]
    )  # checks every row against the definitions
    assert t["size_bytes"].tolist() == [1024, 65536, 2**20] and (t["time_s"] > 0).all()
    assert (t["busbw_gbps"] == t["algbw_gbps"]).all()  # N=2: 2(N-1)/N = 1
    three = collectives.bandwidth_table(
        "bw3", jobs["log_dir"]
    )  # checked against the definitions, N = 3
    assert (three["world_size"] == 3).all() and len(three) == 2
    assert three["repeats"].tolist() == [40, 40] and t["repeats"].tolist() == [20, 20, 20]
    assert three["busbw_gbps"].tolist() == pytest.approx(
        (three["algbw_gbps"] * 4 / 3).tolist(), rel=1e-12
    )


@pytest.mark.jobs("shows")
def test_ddp_broadcasts_rank_0s_state_and_buckets_gradients_during_backward(jobs):
    log_dir = jobs["log_dir"]
    b = extra(jobs, "shows", "ddp_broadcast")[0]
    assert (
        b["params_before"][0] != b["params_before"][1]
        and b["buffers_before"][0] != b["buffers_before"][1]
    )
    assert (
        b["params_after"] == [b["params_before"][0]] * 2
        and b["buffers_after"] == [b["buffers_before"][0]] * 2
    )
    buckets = {r["bucket_cap_mb"]: r for r in extra(jobs, "shows", "ddp_buckets")}
    assert buckets[25.0]["buckets"] == 1 and buckets[0.05]["buckets"] > buckets[1.0]["buckets"] > 1
    assert (
        buckets[0.05]["before_backward_end"] >= 1
    )  # an all-reduce started while backward still ran
    for r in buckets.values():
        assert r["allreduce_calls"] == r["buckets"] == len(r["bucket_mb"])
    step = extra(jobs, "shows", "ddp_step")[0]
    assert step["params_after"][0] == step["params_after"][1] != step["params_before"][0]
    assert "each rank runs the optimizer" in collectives.about_step("shows", log_dir)
    (
        collectives.about_broadcast("shows", log_dir),
        collectives.about_buckets(collectives.buckets_table("shows", log_dir)),
    )


@pytest.mark.jobs("shows")
def test_batchnorm_statistics_differ_per_rank_unless_summed_over_ranks(jobs):
    r = extra(jobs, "shows", "bn_stats")[0]
    assert r["running_mean_rank_diff"] > 1e-6
    # the ranks' sums are float32 (rounding ~1e-7 of means below 1); one rank's own mean misses by > 1e-4
    assert min(r["local_mean_vs_full"]) > 1e-4 and max(r["allreduced_mean_vs_full"]) < 1e-6
    assert "SyncBatchNorm" in collectives.about_bn_stats("shows", jobs["log_dir"])


@pytest.mark.jobs("acc1", "acc4")
def test_no_sync_accumulation_equals_the_big_batch_with_fewer_allreduces(jobs):
    ck = jobs["log_dir"] / "checkpoints"
    one, four = (torch.load(ck / f"{n}.pt", weights_only=True)["model"] for n in ("acc1", "acc4"))
    for k in one:
        torch.testing.assert_close(
            four[k], one[k], rtol=0, atol=checks.FLOAT64_ATOL, msg=k
        )  # float64
    a1, a4 = extra(jobs, "acc1", "accumulate"), extra(jobs, "acc4", "accumulate")
    assert [r["micro_batch"] for r in (a1[0], a4[0])] == [32, 8]
    # 4 backward passes per step, but 1 for the short last batch...
    assert a1[0]["micro_batches"] == 4 and a4[0]["micro_batches"] == 3 * 4 + 1
    for r1, r4 in zip(a1, a4, strict=True):
        assert (
            r4["allreduce_calls"] == r1["allreduce_calls"] > 0
        )  # ...and all-reduces only on the last one
        assert r4["allreduce_calls"] < r4["micro_batches"]  # not one per backward pass
    e1, e4 = (report.read_run(jobs["log_dir"] / f"{n}.jsonl")["epochs"] for n in ("acc1", "acc4"))
    assert [e["loss"] for e in e4] == pytest.approx(
        [e["loss"] for e in e1], abs=checks.FLOAT64_ATOL
    )


@pytest.mark.jobs("mismatch", "hang")
def test_a_shape_mismatch_and_a_skipped_collective_say_what_went_wrong(jobs):
    mismatch, hang = jobs["mismatch"], jobs["hang"]
    assert mismatch.returncode != 0 and hang.returncode != 0
    line = collectives.key_line(mismatch.stdout + mismatch.stderr, "mismatch")
    assert "TensorShape=[4]" in line and "TensorShape=[3]" in line
    assert "3000ms" in collectives.key_line(hang.stdout + hang.stderr, "hang")


def test_bad_flags_are_one_sentence_and_a_nonzero_exit(tmp_path, monkeypatch, capsys):
    """The flags refused before any process group: checked in this interpreter (seconds, not an interpreter
    each); the --sync-bn ones are refused after the script joined its group of one, so in a process of their own."""
    import _trainup_collectives
    import _trainup_ddp
    import _trainup_ddp_tuned

    for k in [
        k
        for k in os.environ
        if k.startswith(("SLURM_", "TORCHELASTIC_")) or k in ("RANK", "WORLD_SIZE")
    ]:
        monkeypatch.delenv(k)
    py = [sys.executable]
    alone = [
        (py + [TUNED, "--quick", "--sync-bn"], ["BatchNorm", "cnn_bn"]),
        (
            py + [TUNED, "--quick", "--model", "cnn_bn", "--sync-bn", "--device", "cpu"],
            ["--sync-bn needs GPUs"],
        ),
    ]
    procs = [start([*map(str, cmd), "--log-dir", str(tmp_path)]) for cmd, _ in alone]
    here = [
        (
            _trainup_ddp_tuned.main,
            ["--quick", "--batch-size", 64, "--accumulate", 5],
            ["--accumulate 5", "divide"],
        ),
        (_trainup_ddp_tuned.main, ["--quick", "--accumulate", 2, "--sweep", 32], ["--sweep"]),
        (
            _trainup_ddp.main,
            ["--quick", "--accumulate", 2],
            ["unrecognized arguments", "--accumulate"],
        ),
        (_trainup_collectives.main, ["--show", "ddp"], ["2 or more processes"]),
        (_trainup_collectives.main, ["--show", "bandwidth", "--sizes", "1Q"], ["--sizes"]),
        (_trainup_collectives.main, ["--show", "hang,ddp"], ["alone"]),
    ]
    for main, flags, words in here:
        done = in_process(main, [*flags, "--log-dir", tmp_path], capsys)
        assert done.returncode == 2, flags
        assert_clean_error(done, *words)
    assert not torch.distributed.is_initialized()  # refused before joining anything
    for proc, (cmd, words) in zip(procs, alone):
        done = finish(proc)
        assert done.returncode == 2, cmd
        assert_clean_error(done, *words)
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.fast
@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_the_ring_drawn_is_a_ring_all_reduce(world):
    """Lesson 04a1's picture of the ring: each step every rank sends one chunk to the next rank;
    after the reduce-scatter rank r holds chunk r + 1 summed over all ranks (as NCCL's ring), after
    the all-gather every rank holds every chunk summed, in 2(N-1) steps."""
    steps = collectives.ring_allreduce(world)
    assert len(steps) == 1 + 2 * (world - 1)
    everyone = set(range(world))
    for step in steps[1:]:
        assert sorted((src, dst) for src, dst, _ in step["sends"]) == [
            (r, (r + 1) % world) for r in range(world)
        ]
    scattered = steps[world - 1]["held"]
    for r in range(world):
        assert scattered[r][(r + 1) % world] == everyone
        assert sum(chunk == everyone for chunk in scattered[r]) == 1
    assert all(chunk == everyone for rank in steps[-1]["held"] for chunk in rank)
