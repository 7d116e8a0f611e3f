"""--profile for real: a trace of the single-process baseline and of a 2-process DDP job (gloo), read back;
the computation/communication split checked on the real traces and, to the microsecond, on a hand-made one;
the course's logs written as TensorBoard scalars and read back; bad input."""

import importlib.util
import json
import sys

import pytest

from conftest import ROOT, SCRIPTS, Ranks, assert_clean_error, finish_job, in_process, start_job
from lessons import launch, report
from lessons.bylesson import traces
from trainup import profiling

# 320 samples: 5 steps an epoch (batch 64, or 32 a rank); the first 2 are not recorded, the next 2 are
TINY = [
    "--quick",
    "--train-size",
    "320",
    "--test-size",
    "64",
    "--epochs",
    "1",
    "--profile",
    "2",
    "--no-progress",
]
STEPS = 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One single-process run and one 2-process DDP job, started side by side."""
    log_dir = tmp_path_factory.mktemp("profiling") / "logs"
    out = ["--log-dir", str(log_dir), "--checkpoint-dir", str(log_dir / "checkpoints")]
    jobs = [
        start_job(
            [sys.executable, str(SCRIPTS / "_trainup_cpu.py"), *TINY, "--run-name", "cpu", *out],
            launch.environment(),
        ),
        Ranks(
            [sys.executable, str(SCRIPTS / "_trainup_ddp.py"), *TINY, "--run-name", "ddp", *out],
            launch.environment(),
        ),
    ]  # as srun starts them: no launcher's interpreter
    for done in map(finish_job, jobs):
        assert done.returncode == 0, f"{done.args}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        assert "traced in" in done.stdout
    return log_dir


@pytest.mark.parametrize("run, ranks", [("cpu", [0]), ("ddp", [0, 1])])
def test_a_readable_trace_per_rank_with_the_recorded_steps(runs, run, ranks):
    found = traces.traces(run, runs)
    assert sorted(found) == ranks
    for path in found.values():
        trace = json.loads(
            path.read_text()
        )  # chrome-trace JSON, as Perfetto and TensorBoard read it
        assert len(traces.steps(trace)) == STEPS
        assert any(e.get("cat") == "cpu_op" for e in trace["traceEvents"])


@pytest.mark.parametrize("run", ["cpu", "ddp"])
def test_the_split_is_shares_that_sum_to_one(runs, run):
    table = traces.split_table(run, runs)
    for _, r in table.iterrows():
        parts = [r[p] for p in traces.PARTS]
        assert all(0 <= p <= 1 for p in parts) and sum(parts) == pytest.approx(1, abs=1e-9)
        assert r["communication"] == pytest.approx(r["overlap"] + r["communication only"], abs=1e-9)
        assert r["computation"] == pytest.approx(r["overlap"] + r["computation only"], abs=1e-9)
        assert r["steps"] == STEPS and r["computation"] > 0.2
    if run == "cpu":
        assert (table["communication"] == 0).all()  # one process: no collective at all
    else:  # DDP all-reduces gradients every step, mostly while backward still runs
        assert (table["communication"] > 0).all() and (table["comm_in_backward"] > 0).all()
        assert len(traces.about_split(table)) == 2


def test_a_ddp_step_runs_ddp_s_collectives_alone(runs):
    """Every collective of a recorded step is launched inside its backward: DDP's buckets. The stop check
    (trainup/preempt.py) runs no collective in a step: the profile measures DDP, not the course."""
    for rank, path in traces.traces("ddp", runs).items():
        counts = traces.launches(json.loads(path.read_text()))
        assert len(counts) == STEPS, (rank, counts)
        for inside, elsewhere in counts:
            assert inside >= 1 and elsewhere == 0, (rank, counts)
        assert len(set(counts)) == 1, (rank, counts)  # the same buckets every step


def test_top_operators_are_the_model_s_own(runs):
    cpu, ddp = (
        traces.top_operators("cpu", log_dir=runs),
        traces.top_operators("ddp", rank=1, log_dir=runs),
    )
    assert "aten::convolution_backward" in set(cpu["operator"]) and "gloo:all_reduce" in set(
        ddp["operator"]
    )
    for t in (cpu, ddp):
        assert (
            t["self_ms_per_step"].is_monotonic_decreasing
            and (t["self_ms_per_step"] <= t["total_ms_per_step"]).all()
        )
        assert ((0 < t["self_share"]) & (t["self_share"] <= 1 + 1e-9)).all()
    assert (
        cpu["self_share"].sum() <= 1 + 1e-9
    )  # one thread: its operators' self times fit in the steps


@pytest.mark.parametrize("run, rank", [("cpu", 0), ("ddp", 1)])
def test_each_step_holds_one_range_per_phase(runs, run, rank):
    """The ranges trainup/profiling.py's hooks open (data, forward, backward, optimizer): one of
    each per recorded step, in that order, on the step's thread, inside the step."""
    trace = traces.load(traces.traces(run, runs)[rank])
    table = traces.phase_table(trace)
    assert len(table) == STEPS
    for phase in profiling.PHASES:
        assert (table[f"{phase}_ranges"] == 1).all(), table.to_string()
        assert (table[f"{phase}_ms"] > 0).all()
    assert (table["other_ms"] >= 0).all()  # the phases fit in their step, one after the other
    for start, end in traces.steps(trace):
        order = [p for p, a, b in traces.phase_ranges(trace) if start <= a and b <= end]
        assert order == list(profiling.PHASES)
    memory = traces.memory_by_phase(trace).set_index("phase")
    # forward keeps its activations for backward; backward frees them (profile_memory)
    assert memory.loc["forward", "kept_mb"] > 0 and memory.loc["backward", "freed_mb"] > 0


def test_the_profiler_s_own_tables_beside_the_trace(runs):
    tables = traces.key_averages("cpu", log_dir=runs)
    assert len(tables) == len(profiling.TABLES)
    by_self, by_total, by_shapes, by_memory = (traces.table_rows(t) for t in tables.values())
    assert {"aten::convolution_backward", "aten::mkldnn_convolution"} <= set(by_self["Name"])
    assert len(by_self) == profiling.TABLE_ROWS
    calls = dict(zip(by_total["Name"], by_total["# of Calls"]))
    assert all(calls[f"phase:{p}"] == STEPS for p in profiling.PHASES if f"phase:{p}" in calls)
    assert calls["phase:backward"] == calls["phase:forward"] == STEPS  # the costliest ranges
    assert by_shapes["Input Shapes"].str.startswith("[[").any()  # record_shapes
    assert "Self CPU Mem" in by_memory.columns and by_memory["Self CPU Mem"].iloc[0].endswith("B")
    with pytest.raises(AssertionError, match="no nothing.rank0.key_averages.txt"):
        traces.key_averages("nothing", log_dir=runs)


def test_the_hooks_are_gone_after_the_run(tmp_path):
    """The phases' hooks (and the wrapped Tensor.backward) last as long as the profiler: after
    stop(), a model, its backward and its optimizer run as without --profile."""
    import argparse
    import torch
    from torch.nn.modules import module
    from torch.optim import optimizer

    def state():
        return (
            torch.Tensor.backward,
            len(module._global_forward_hooks),
            len(optimizer._global_optimizer_pre_hooks),
        )

    before = state()
    args = argparse.Namespace(profile=1, log_dir=tmp_path, run_name="hooks")
    on = profiling.start(args)
    assert torch.Tensor.backward is not before[0]
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in on.steps([torch.ones(1, 2)] * 3):
        model(x).sum().backward()
        opt.step()
    on.stop()
    assert state() == before
    assert (tmp_path / "profiles" / "hooks" / "hooks.rank0.key_averages.txt").exists()


def X(name, ts, dur, tid=1, cat="cpu_op"):
    return dict(ph="X", name=name, ts=ts, dur=dur, pid=7, tid=tid, cat=cat)


# Two steps of 100 us on thread 1. Step 1: forward 0-40, backward 40-80 with DDP's hand-off (c10d) at
# 60-62, the collective 60-90 on a gloo thread. Step 2: computes 100-150 and 170-200, collective 140-180.
HAND_MADE = {
    "traceEvents": [
        X("ProfilerStep#2", 0, 100, cat="user_annotation"),
        X("aten::conv2d", 0, 40),
        X("autograd::engine::evaluate_function: ConvolutionBackward0", 40, 40),
        X("aten::convolution_backward", 41, 30),
        X("c10d::allreduce_", 60, 2),
        X("gloo:all_reduce", 60, 30, tid=2, cat="user_annotation"),
        X("ProfilerStep#3", 100, 100, cat="user_annotation"),
        X("aten::mm", 100, 50),
        X("aten::add_", 170, 30),
        X("gloo:all_reduce", 140, 40, tid=3, cat="user_annotation"),
        X("gloo:all_reduce", 300, 50, tid=3, cat="user_annotation"),
    ]
}


def test_the_split_of_a_hand_made_trace_is_exact():
    s = traces.split(HAND_MADE)
    # computing: 0-60, 62-80, 100-150, 170-200 (158 us: the hand-off is communication); communicating:
    # 60-90, 140-180 (70 us; 300-350 is outside the steps); both: 62-80, 140-150, 170-180 (38 us);
    # neither: 90-100 (10 us); of 200 us
    assert s["steps"] == 2 and s["step_ms"] == pytest.approx(0.1)
    assert {p: round(s[p], 6) for p in traces.PARTS} == {
        "computation only": 0.6,
        "overlap": 0.19,
        "communication only": 0.16,
        "idle": 0.05,
    }
    assert s["comm_in_backward"] == pytest.approx(
        20 / 70
    )  # 60-80 of the collectives ran during backward
    ops = {e["name"]: t for e, t in traces.self_times(HAND_MADE["traceEvents"][1:6])}
    assert (
        ops["autograd::engine::evaluate_function: ConvolutionBackward0"] == 10
    )  # 40 less its 30 inside
    assert "no GPU kernels" in traces.engine_sentence(HAND_MADE)


# A CUDA trace: Kineto writes each ProfilerStep#N and phase: range on the CPU thread and again on
# the GPU rows (gpu_user_annotation), where a step's range spans the kernels it launched, later than
# the CPU's. Step 2 on the CPU 0-100, its kernels 50-160 (compute 50-120, NCCL 100-160); step 3 on
# the CPU 100-200, its kernels 160-260 (compute 160-230, NCCL 230-260); a warm-up kernel 0-40.
CPU = "user_annotation"
GPU_MADE = {
    "traceEvents": [
        X("ProfilerStep#2", 0, 100, cat=CPU),
        X("ProfilerStep#3", 100, 100, cat=CPU),
        X("phase:forward", 0, 30, cat=CPU),
        X("phase:forward", 100, 30, cat=CPU),
        X("ProfilerStep#2", 50, 110, tid=9, cat="gpu_user_annotation"),
        X("ProfilerStep#3", 160, 100, tid=9, cat="gpu_user_annotation"),
        X("phase:forward", 50, 40, tid=9, cat="gpu_user_annotation"),
        X("phase:forward", 160, 40, tid=9, cat="gpu_user_annotation"),
        X("warmup_kernel", 0, 40, tid=9, cat="kernel"),
        X("sm80_gemm", 50, 70, tid=9, cat="kernel"),
        X("ncclDevKernel_AllReduce", 100, 60, tid=10, cat="kernel"),
        X("sm80_gemm", 160, 70, tid=9, cat="kernel"),
        X("ncclDevKernel_AllReduce", 230, 30, tid=10, cat="kernel"),
    ]
}


def test_a_cuda_trace_counts_each_step_and_phase_once_and_splits_its_kernels_on_the_gpu_rows():
    assert traces.steps(GPU_MADE) == [(0, 100), (100, 200)]  # the CPU's, not doubled
    assert traces.steps(GPU_MADE, gpu=True) == [(50, 160), (160, 260)]
    assert [r[0] for r in traces.phase_ranges(GPU_MADE)] == ["forward", "forward"]
    s = traces.split(GPU_MADE)
    # kernels in 50-260 (210 us): compute 50-120 and 160-230 (140), NCCL 100-160 and 230-260 (90),
    # both 100-120 (20); nothing 0 us; the warm-up kernel and the CPU windows play no part
    assert s["steps"] == 2 and s["step_ms"] == pytest.approx(0.105)
    assert {p: round(s[p], 6) for p in traces.PARTS} == {
        "computation only": round(120 / 210, 6),
        "overlap": round(20 / 210, 6),
        "communication only": round(70 / 210, 6),
        "idle": 0.0,
    }


def test_logs_round_trip_through_tensorboard(runs, tmp_path):
    traces.to_tensorboard(["cpu", "ddp"], tmp_path / "tb", log_dir=runs)
    table = traces.scalars(tmp_path / "tb")
    assert set(table["run"]) == {"cpu", "ddp"}
    loss = table[(table["run"] == "ddp") & (table["tag"] == "train/loss")]
    epoch = report.read_run(runs / "ddp.jsonl")["epochs"][0]
    # TensorBoard keeps float32: 6e-8 relative
    assert loss["step"].tolist() == [1] and loss["value"].iloc[0] == pytest.approx(
        epoch["loss"], rel=1e-6
    )
    assert "no GPU" in traces.gpu_note(runs, tmp_path / "no_reference") or traces.gpu_runs(runs)


def test_bad_profile_flags_are_one_sentence(capsys, tmp_path):
    sys.path.insert(0, str(SCRIPTS))
    from _trainup_cpu import main

    common = [
        "--quick",
        "--log-dir",
        tmp_path / "logs",
        "--checkpoint-dir",
        tmp_path / "ck",
        "--no-progress",
    ]
    assert_clean_error(
        in_process(main, ["--profile", "0", *common], capsys), "--profile", "greater than 0"
    )
    from _trainup_hogwild import main as hogwild

    assert_clean_error(
        in_process(hogwild, ["--profile", "2", *common], capsys),
        "--profile",
        "Hogwild",
        "_trainup_cpu.py",
    )
    assert not (tmp_path / "logs").exists()  # nothing half-written
    # 64 samples at batch 64: 2 steps in all, both before recording starts
    short = in_process(main, ["--profile", "3", "--train-size", "64", *common], capsys)
    assert_clean_error(short, "--profile 3", "only 2 training steps")


def solution(name):
    """notebooks/solutions/<name>.py, imported (its name starts with a digit, so not with `import`)."""
    path = ROOT / "notebooks" / "solutions" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"solution_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_exercise_solutions_of_lesson_08a(runs):
    s = solution("08a_profiling_ddp")
    assert s.communication_share(HAND_MADE) == pytest.approx(70 / 200)
    assert s.exposed_communication(HAND_MADE) == pytest.approx(0.16)
    real = traces.split(traces.load(traces.traces("ddp", runs)[0]))  # the same on a real trace
    trace = traces.load(traces.traces("ddp", runs)[0])
    assert s.communication_share(trace) == pytest.approx(real["communication"], abs=1e-9)
    assert s.exposed_communication(trace) == pytest.approx(real["communication only"], abs=1e-9)


def test_the_exercise_solution_of_lesson_08(runs):
    s = solution("08_monitoring_and_profiling")
    cpu = traces.load(traces.traces("cpu", runs)[0])
    shares, table = s.phase_shares(cpu), traces.phase_table(cpu)
    assert list(shares) == list(profiling.PHASES)
    total = (table[[f"{p}_ms" for p in profiling.PHASES]].sum(axis=1) + table["other_ms"]).sum()
    for phase, p in shares.items():
        assert p["share"] == pytest.approx(table[f"{phase}_ms"].sum() / total, rel=1e-9)
    kept = traces.memory_by_phase(cpu).set_index("phase")["kept_mb"] * 2**20
    assert {p: v["kept_bytes"] for p, v in shares.items()} == pytest.approx(kept.to_dict())


def test_the_exercise_solution_of_lesson_08b(runs, tmp_path):
    s = solution("08b_tensorboard")
    back = s.ranks_to_tensorboard("ddp", tmp_path / "tb", runs)
    assert sorted(back) == [0, 1] and all(len(points) == 1 for points in back.values())


def test_one_step_of_a_hand_made_trace_is_drawn_where_it_ran():
    """Lesson 08a's picture of one step: the phases on the main thread, the collectives of the
    other threads merged (the main thread's hand-off is a tick, not a bar), times from the step's
    start; and its sentence, every number from those ranges. HAND_MADE's microseconds read as
    milliseconds here (times 1000), with step 3's phases and its hand-off added."""
    events = [
        *HAND_MADE["traceEvents"],
        X("phase:forward", 100, 50, cat="user_annotation"),
        X("phase:backward", 150, 40, cat="user_annotation"),
        X("c10d::allreduce_", 185, 1),  # after the collective: a tick, never a bar
        X("phase:optimizer", 190, 10, cat="user_annotation"),
    ]
    trace = {"traceEvents": [dict(e, ts=e["ts"] * 1000, dur=e["dur"] * 1000) for e in events]}
    table, launched, step_ms = traces.step_timeline(trace)  # the last recorded step: 100-200
    assert [tuple(r) for r in table.itertuples(index=False)] == [
        ("main thread", "forward", 0, 50),
        ("main thread", "backward", 50, 90),
        ("main thread", "optimizer", 90, 100),
        ("collectives", "in flight", 40, 80),  # 140-180; 300-350 is after the step
    ]
    assert launched == [85] and step_ms == 100
    assert traces.about_timeline(0, table, launched) == (
        "Rank 0: backward() ran from 50.0 to 90.0 ms; DDP launched 1 of 1 all-reduce(s) inside "
        "it, the first collective in flight from 40.0 ms, 50.0 ms before backward() returned."
    )
    fig = traces.timeline_plot({0: (table, launched, step_ms)}, "test_timeline")
    assert len(fig.axes[0].patches) == 4 and fig.axes[0].lines  # four ranges, the tick
