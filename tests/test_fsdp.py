"""_trainup_fsdp.py run for real: one 2-process job (its ranks as srun starts them) running
every --shard mode in turn (DDP, ZeRO-1, ZeRO-2 by hand and as FSDP2 ships it, ZeRO-3), each
ending with the parameters of one process, ZeRO-2's parameters whole at the end of forward; the sharded (DCP) checkpoints
it wrote resumed by 1 process and by 4, continuing as an uninterrupted run; the bytes each rank holds
within 10 % of the formulas; the collectives each stage adds; hybrid sharding (HSDP) on a
2-D mesh of a model built on the meta device; bad input. The one-process runs are
in-process (no new interpreter)."""

import importlib
import os
import sys

import pytest
import torch

from conftest import ROOT, SCRIPTS, Ranks, assert_clean_error, finish_job, in_process
from lessons import checks, launch
from lessons.bylesson import planner, zero_stages as lesson
from trainup import models
from trainup.parallel.sharding import MODES, RESUMABLE, STAGES

SCRIPT = str(SCRIPTS / "_trainup_fsdp.py")
# a tiny model and data set: 4 steps an epoch; 4 processes on 2 cores stay quick
TINY = [
    "--quick",
    "--train-size",
    "128",
    "--test-size",
    "64",
    "--batch-size",
    "32",
    "--blocks",
    "2",
    "--width",
    "32",
    "--no-progress",
    *checks.PROOF,
]
VALUE = 8  # bytes per value in these float64 runs
ATOL = checks.FLOAT64_ATOL  # float64 (checks.PROOF): sums in another order move ~1e-16


def fsdp_main():
    sys.path.insert(0, str(SCRIPTS))
    return importlib.import_module("_trainup_fsdp").main


def torchrun(log_dir, name, nproc, *args):
    """A job of nproc ranks, started as srun starts them (no launcher: this file is not about
    torchrun), each a fresh interpreter."""
    cmd = [
        sys.executable,
        SCRIPT,
        *TINY,
        *map(str, args),
        "--run-name",
        name,
        "--log-dir",
        str(log_dir),
        "--checkpoint-dir",
        str(log_dir / "checkpoints"),
    ]
    return Ranks(cmd, launch.environment(), ntasks=nproc)


def ok(proc):
    assert proc.returncode == 0, (
        f"exit {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )


def one_process(log_dir, name, *args):
    """The script's main() in this interpreter, world size 1 (it joins and leaves a 1-process gloo group)."""
    saved = dict(os.environ)
    try:
        fsdp_main()(
            [
                *TINY,
                *map(str, args),
                "--run-name",
                name,
                "--log-dir",
                str(log_dir),
                "--checkpoint-dir",
                str(log_dir / "checkpoints"),
            ]
        )
    finally:
        os.environ.clear()
        os.environ.update(saved)  # setup() sets MASTER_ADDR/PORT for its group


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """two_<mode>: 2 processes, every mode, 1 epoch (its DCP checkpoints are what the resumes load);
    one_1: the one-process baseline after 1 epoch."""
    log_dir = tmp_path_factory.mktemp("fsdp") / "logs"
    two = torchrun(log_dir, "two", 2, "--shard", ",".join(MODES), "--epochs", 1)
    # HSDP, 2 replicas x 2 shards, every rank but 0 building the model on the meta device; with
    # FSDP2's other options on: each block prefetching the next's gather, shards offloaded
    hybrid = torchrun(
        log_dir,
        "hybrid",
        4,
        "--shard",
        "parameters",
        "--replicate",
        2,
        "--meta-init",
        "--prefetch",
        1,
        "--offload",
        "--epochs",
        1,
    )
    one_process(log_dir, "one_1", "--shard", "none", "--epochs", 1)  # while the jobs run
    ok(finish_job(two))
    ok(finish_job(hybrid))
    return log_dir


@pytest.fixture(scope="module")
def with_resumes(runs):
    """Beside runs: one_2, the baseline after 2 epochs; r1_/r4_<mode>: resumed from two_ in 1 and
    in 4 processes for epoch 2 (a test of the modes alone, as the breakages run it, skips them)."""
    resumable = ",".join(RESUMABLE)
    r4 = torchrun(runs, "r4", 4, "--shard", resumable, "--epochs", 2, "--resume-from", "two")
    one_process(runs, "one_2", "--shard", "none", "--epochs", 2)  # while the job runs
    one_process(runs, "r1", "--shard", resumable, "--epochs", 2, "--resume-from", "two")
    ok(finish_job(r4))
    return runs


def params(log_dir, name):
    return torch.load(log_dir / "checkpoints" / f"{name}.pt", weights_only=True)["model"]


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=ATOL, msg=k)


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_ends_with_the_parameters_of_one_process(runs, mode):
    assert_same(params(runs, f"two_{mode}"), params(runs, "one_1"))
    from lessons import report

    one, two = (report.read_run(runs / f"{n}.jsonl") for n in ("one_1", f"two_{mode}"))
    assert two["problems"] == [] and two["summary"]["status"] == "finished"
    assert two["epochs"][0]["loss"] == pytest.approx(one["epochs"][0]["loss"], abs=ATOL)
    assert two["epochs"][0]["samples"] == 128


@pytest.mark.parametrize("n, world", [(64, 2), (65, 2), (2001, 2), (5000, 3), (10, 4)])
def test_every_rank_evaluates_as_many_batches_and_every_test_sample_once(n, world):
    """Under FSDP each forward gathers with the other ranks: a rank with a batch fewer would leave
    them waiting (2001 samples on 2 ranks: 1001 and 1000, 2 batches of 1000 against 1)."""
    from types import SimpleNamespace
    from trainup.parallel.sharding import test_batches

    ranks = [test_batches(n, SimpleNamespace(rank=r, world_size=world)) for r in range(world)]
    assert len({len(b) for b in ranks}) == 1 and max(len(x) for b in ranks for x in b) <= 1000
    assert sorted(i for b in ranks for x in b for i in x) == list(range(n))


def test_hybrid_sharding_built_on_the_meta_device_ends_like_one_process(runs):
    """--replicate 2 --meta-init on 4 ranks: only rank 0 built the model in memory; each rank holds
    half the parameters (sharded over its replica's 2 ranks, not over 4); each step all-gathers and
    reduce-scatters inside a replica as the 2-rank job does, then all-reduces the gradient shards
    between replicas; and the run ends with one process's parameters, its blocks prefetching
    and its shards offloaded (CPUOffloadPolicy) as well."""
    assert_same(params(runs, "hybrid"), params(runs, "one_1"))
    record = lesson._records("hybrid", "sharding", runs)[0]
    assert (record["prefetch"], record["offload"]) == (1, True)
    whole = sum(v.numel() * VALUE for v in params(runs, "one_1").values())
    assert lesson.built("hybrid", runs) == [whole, 0, 0, 0]
    assert lesson.built("two_parameters", runs) == [whole, whole]
    memory = lesson._records("hybrid", "shard_memory", runs)[0]
    assert memory["param_bytes"] == [whole // 2] * 4 == [memory["expected_bytes"][0]] * 4
    ops, two = (
        lesson._records(r, "shard_comm", runs)[0]["ops"] for r in ("hybrid", "two_parameters")
    )
    assert {k: ops[k] for k in two} == two  # inside a replica: the 2-rank job's collectives
    assert ops.keys() - two.keys() == {"all_reduce"} and ops["all_reduce"]["bytes"] == whole // 2


def test_the_baseline_trained_far_beyond_the_tolerance(runs):
    torch.manual_seed(1)
    init = models.BlockStack((1, 28, 28), 10, 2, 32).state_dict()
    one = params(runs, "one_1")
    assert max((one[k] - init[k]).abs().max().item() for k in one) > 100 * ATOL


@pytest.mark.parametrize("resumed", ["r1", "r4"])
@pytest.mark.parametrize("mode", RESUMABLE)
def test_a_checkpoint_saved_by_2_processes_resumes_in_another_number_and_continues_identically(
    with_resumes, resumed, mode
):
    runs = with_resumes
    assert lesson.started_at(f"{resumed}_{mode}", log_dir=runs) == (
        2,
        [2],
    )  # it loaded epoch 1, trained epoch 2
    assert_same(params(runs, f"{resumed}_{mode}"), params(runs, "one_2"))  # as if never stopped
    assert (runs / "checkpoints" / f"two_{mode}.dcp" / ".metadata").exists()


def test_each_rank_holds_what_the_formulas_say_within_10_percent(with_resumes):
    runs = with_resumes
    table = lesson.memory_table(
        ["one_1", *(f"two_{m}" for m in MODES), *(f"r4_{m}" for m in RESUMABLE)], log_dir=runs
    )
    assert sorted(set(table["N"])) == [1, 2, 4] and len(table) == 3 * (
        1 + len(MODES) + len(RESUMABLE)
    )
    lesson.check_memory(table)
    by = table.set_index(["shard", "N", "state"])
    psi = int(table["psi"].iloc[0])
    # what is sharded halves at N=2 and quarters at N=4; what is replicated stays whole
    v = VALUE  # bytes per value: weights, gradients, Adam's two moments
    assert by.loc[("parameters", 4, "param"), "max_bytes"] == pytest.approx(v * psi / 4, rel=0.02)
    assert by.loc[("gradients", 2, "param"), "max_bytes"] == v * psi
    assert by.loc[("gradients", 2, "grad"), "max_bytes"] == pytest.approx(v * psi / 2, rel=0.02)
    assert by.loc[("optimizer", 2, "grad"), "max_bytes"] == v * psi
    assert by.loc[("optimizer", 2, "optim"), "mean_bytes"] == pytest.approx(
        2 * v * psi / 2, rel=0.02
    )
    # FSDP2's ZeRO-2 between steps: its parameters sharded too, as ZeRO-3's
    z2f = by.loc[("gradients_fsdp", 2, "param"), "max_bytes"]
    assert z2f == pytest.approx(v * psi / 2, rel=0.02)
    # the check fails on a rank holding 20 % more than its formula
    worse = table.copy()
    worse.loc[worse["shard"] == "parameters", "max_vs_formula"] *= 1.2
    with pytest.raises(AssertionError, match="formula"):
        lesson.check_memory(worse)


def test_the_planners_model_states_are_what_the_ranks_held(with_resumes):
    """lessons/bylesson/planner's first term, against these real runs (float64: 8+8+16 bytes a
    parameter): within 10 % on every rank (ZeRO-1's optimizer state: the mean, whole tensors per
    rank)."""
    table = lesson.memory_table(
        [*(f"two_{m}" for m in MODES), *(f"r4_{m}" for m in RESUMABLE)], log_dir=with_resumes
    )
    for (run, shard, n), g in table.groupby(["run", "shard", "N"]):
        planned = planner.states(
            g["psi"].iloc[0], planner.Layout(dp=n, stage=shard), (VALUE, VALUE, 2 * VALUE)
        )
        for state, want in zip(lesson.STATES, planned):
            row = g[g["state"] == state].iloc[0]
            held = (
                row["mean_bytes"] if (shard, state) == ("optimizer", "optim") else row["max_bytes"]
            )
            assert held == pytest.approx(want, rel=0.10), (run, state, held, want)


def test_at_the_end_of_forward_both_zero_2s_hold_whole_parameters_and_zero_3_its_root(runs):
    """The peak against at rest: FSDP2 without resharding keeps every unit gathered from forward to
    the end of backward, as the hand-written ZeRO-2 keeps its parameters whole; ZeRO-3 only its
    root group (stem, head)."""
    t = lesson.forward_table([f"two_{m}" for m in MODES], log_dir=runs).set_index("zero")
    formula = t["forward_formula"].to_numpy()
    assert t["forward_x_model"].to_numpy() == pytest.approx(formula, rel=0.02)
    z2, z2f, z3 = (t.loc[lesson.LABELS[m]] for m in ("gradients", "gradients_fsdp", "parameters"))
    assert z2["forward_x_model"] == z2f["forward_x_model"] == 1 == z2["at_rest_x_model"]
    assert z2f["at_rest_x_model"] == pytest.approx(0.5, rel=0.02)
    assert z3["at_rest_x_model"] < z3["forward_x_model"] < 1


def test_each_stage_runs_the_collectives_it_should(runs):
    comm = lesson.comm_table([f"two_{m}" for m in MODES], log_dir=runs).set_index("zero")
    ddp, z1, z2, z3, z2f = (comm.loc[lesson.LABELS[m]] for m in MODES)
    # DDP: the whole gradient all-reduced once a step (one bucket: the model is small)
    assert ddp["all_reduce_x_model"] == pytest.approx(1) and ddp["all_gather_calls"] == 0
    # ZeRO-1: the same all-reduce, then each rank broadcasts the parameters it updated
    assert z1["all_reduce_x_model"] == pytest.approx(1) and z1[
        "broadcast_x_model"
    ] == pytest.approx(1, rel=0.01)
    # ZeRO-2: gradients reduce-scattered, updated slices all-gathered: no all-reduce
    assert (z2["all_reduce_calls"], z2["reduce_scatter_x_model"], z2["all_gather_x_model"]) == (
        0,
        1,
        1,
    )
    # ZeRO-3: parameters all-gathered before forward and again before backward (the root group stays gathered)
    assert z3["reduce_scatter_x_model"] == pytest.approx(1) and 1 < z3["all_gather_x_model"] < 2
    assert z3["all_reduce_calls"] == 0
    # FSDP2's ZeRO-2: parameters gathered once, for forward, kept to the end of backward; gradients
    # reduce-scattered: what the hand-written ZeRO-2 sends, and DDP
    assert z2f["all_gather_x_model"] == pytest.approx(1, rel=0.01) and z2f["all_reduce_calls"] == 0
    assert z2f["reduce_scatter_x_model"] == pytest.approx(1, rel=0.01)
    assert z2f["sent_x_model"] == pytest.approx(z2["sent_x_model"], rel=0.01)
    assert z2f["sent_x_model"] == pytest.approx(ddp["sent_x_model"], rel=0.01)


def test_bad_input_is_one_sentence_and_a_nonzero_exit(log_dir, capsys, monkeypatch):
    main = fsdp_main()
    out = ["--log-dir", log_dir, "--checkpoint-dir", log_dir / "checkpoints"]
    cases = [
        (["--shard", "parameters", "--model", "cnn"], ["--model cnn has no blocks"]),
        (["--shard", "zero4"], ["--shard takes none, optimizer, gradients, parameters"]),
        (
            ["--shard", "gradients", "--resume"],
            ["--resume", "--shard none, optimizer, parameters only"],
        ),
        (["--shard", "none,parameters", "--meta-init"], ["--meta-init", "--shard parameters or "]),
        (["--shard", "optimizer", "--replicate", "2"], ["--replicate", "--shard parameters or "]),
        (["--shard", "none", "--prefetch", "1"], ["--prefetch is an option of FSDP2"]),
        (["--shard", "gradients", "--offload"], ["--offload is an option of FSDP2"]),
        (["--shard", "parameters", "--replicate", "2"], ["--replicate 2", "1 process(es)"]),
    ]
    if not torch.cuda.is_available():
        cases.append(
            (["--precision", "bf16"], ["--precision bf16", "on the CPU every state stays fp32"])
        )
    cases.append(
        (["--precision", "bf16", "--shard", "none,parameters"], ["with --shard parameters alone"])
    )
    for flags, words in cases:
        assert_clean_error(in_process(main, TINY + flags + out, capsys), *words)
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(
            name, value
        )  # rank 0 of a 2-process job, told the mesh holds 4: stops before waiting
    assert_clean_error(
        in_process(main, TINY + ["--mesh", "4"] + out, capsys), "--mesh 4", "2 process(es)"
    )
    assert not log_dir.exists() or not any(log_dir.rglob("*.jsonl"))  # nothing half-written


def test_09_solutions_agree_with_the_lesson():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "solution_09", ROOT / "notebooks" / "solutions" / "09_sharding.py"
    )
    s = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(s)
    fits = s.largest_model(24, 8)
    table = lesson.largest_model(memory_gb=24, ns=(8,), per_param=(2, 2, 12)).set_index("zero")[
        "N=8"
    ]
    assert [fits[m] / 1e9 for m in STAGES] == pytest.approx(
        [table[lesson.LABELS[m]] for m in STAGES]
    )
    assert fits["none"] == pytest.approx(24e9 / 16) and fits["parameters"] == pytest.approx(
        8 * 24e9 / 16
    )
    # the bytes each stage sends: lesson 09a1's solutions, tests/test_exercises.py


def test_the_traffic_is_counted_in_values_whatever_the_dtype_on_the_wire(tmp_path):
    """A bf16 run all-gathers 2-byte values and reduce-scatters 4-byte ones: counted in values,
    ZeRO-3's step sends what an fp32 run's does (never "less than DDP" for half the bytes)."""
    import json

    psi, n = 1000, 2
    for name, precision, gather in (("fp32", "32", 4), ("bf16", "bf16", 2)):
        ops = {
            "all_gather": {"calls": 2, "bytes": 2 * gather * psi},
            "reduce_scatter": {"calls": 1, "bytes": 4 * psi},
        }
        records = [
            dict(
                type="config",
                run=name,
                time=0.0,
                schema_version=1,
                script="_trainup_fsdp.py",
                lesson="09",
                args={"precision": precision},
            ),
            dict(
                type="shard_comm",
                run=name,
                time=0.0,
                shard="parameters",
                world_size=n,
                parameters=psi,
                ops=ops,
            ),
        ]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    table = lesson.comm_table(["fp32", "bf16"], tmp_path).set_index("run")
    assert table.loc["bf16", "sent_x_model"] == pytest.approx(table.loc["fp32", "sent_x_model"])
    assert table.loc["fp32", "sent_x_model"] == pytest.approx(3 * (n - 1) / n)  # 3Ψ(N-1)/N


def test_the_prefetch_sentence_weighs_the_step_against_what_prefetching_hid():
    """A step difference larger than the gathers prefetching hid is the machine's, not said as
    prefetching's gain; one within it is still not told from noise by 3 steps."""
    import pandas as pd
    from lessons.bylesson import fsdp_prefetch as pf

    def table(step_with):
        rows = []
        for run, step, hidden in (("p0", 36.0, 0.0), ("p1", step_with, 0.3)):
            for phase in pf.PASSES:
                rows.append(
                    dict(
                        run=run,
                        rank=0,
                        phase=phase,
                        hidden=hidden / 2,
                        gather_ms=2.0,
                        hidden_ms=hidden,
                        step_ms=step,
                    )
                )
        return pd.DataFrame(rows)

    far = pf.about(table(28.6), "p0", "p1")[-1]
    assert "difference of 7.4 ms" in far and "hid took 0.6 ms" in far
    assert "more than prefetching could save" in far and "shorter" not in far
    near = pf.about(table(35.8), "p0", "p1")[-1]
    assert "within what prefetching could save" in near and "cannot tell it from noise" in near
