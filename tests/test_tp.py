"""_trainup_tp.py run for real: the one-process baseline, tensor parallelism over 2 processes and a
2-D mesh (2 data-parallel replicas x 2 tensor-parallel processes), ranks started as srun starts
them (gloo). Both must end with the baseline's parameters; each rank must hold 1/tp of the cut
layers; one step must communicate what Megatron-LM counts. Bad input: one sentence, exit status 2, checked in this process (no job started)."""

import importlib.util
import os
import sys

import pytest
import torch

from conftest import (
    ROOT,
    SCRIPTS,
    Ranks,
    assert_clean_error,
    finish_job,
    in_process,
    notebook_or_own,
)
from lessons import checks, launch, report
from lessons.bylesson import tp_runs as lesson
from trainup import models

SCRIPT = str(SCRIPTS / "_trainup_tp.py")
BLOCKS, WIDTH, HIDDEN, BATCH = 2, 16, 32, 64
# notebook 09c's quick runs, the same flags: in a session that runs it, the tests read its runs
TINY = [
    "--quick",
    "--blocks",
    BLOCKS,
    "--width",
    WIDTH,
    "--hidden",
    HIDDEN,
    "--no-progress",
    *checks.PROOF,
]
READS_NOTEBOOK = "notebooks/09c_tensor_parallel.ipynb"
VALUE = 8  # bytes per value in these float64 runs
ATOL = checks.FLOAT64_ATOL  # float64 (checks.PROOF): sums in another order move ~1e-16
JOBS = {"tp_2": (2, []), "tp_2x2": (4, ["--tp", 2])}  # name: (processes, flags)


def ok(proc):
    assert proc.returncode == 0, (
        f"exit {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )
    return proc


def job(log_dir, name, nproc, flags):
    """nproc ranks started as srun starts them (no launcher, each a fresh interpreter)."""
    cmd = [
        sys.executable,
        SCRIPT,
        *map(str, TINY + flags),
        "--run-name",
        name,
        "--log-dir",
        str(log_dir),
        "--checkpoint-dir",
        str(log_dir / "checkpoints"),
    ]
    return Ranks(cmd, launch.environment(), ntasks=nproc)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, request):
    """The notebook's runs where this session ran notebook 09c, else this module's own: both jobs
    side by side, and the baseline in this process meanwhile (no interpreter to start)."""

    def load():
        logs = ROOT / "logs"
        return all((logs / f"{n}.jsonl").exists() for n in ("tp_one", *JOBS)) and logs

    return notebook_or_own(request, READS_NOTEBOOK, load, lambda: own(tmp_path_factory))


def own(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("tp") / "logs"
    procs = {name: job(log_dir, name, nproc, flags) for name, (nproc, flags) in JOBS.items()}
    environ = dict(os.environ)
    try:
        import _trainup_tp

        _trainup_tp.main(
            [
                *map(str, TINY),
                "--threads",
                "1",
                "--run-name",
                "tp_one",
                "--log-dir",
                str(log_dir),
                "--checkpoint-dir",
                str(log_dir / "checkpoints"),
            ]
        )
    finally:
        os.environ.clear()
        os.environ.update(environ)  # the run set MASTER_ADDR/MASTER_PORT for its one-process group
        done = {name: finish_job(p) for name, p in procs.items()}
    for proc in done.values():
        ok(proc)
    return log_dir


def params(log_dir, name):
    """The whole model a run saved: beside its log here, in the course's checkpoints/ for the
    notebook's."""
    ckpt = ROOT / "checkpoints" if log_dir == ROOT / "logs" else log_dir / "checkpoints"
    return torch.load(ckpt / f"{name}.pt", weights_only=True)["model"]


@pytest.mark.parametrize("name", JOBS)
def test_tensor_parallel_ends_with_the_parameters_of_one_process(runs, name):
    one, cut = params(runs, "tp_one"), params(runs, name)
    assert cut.keys() == one.keys()  # the gathered slices are the whole model, under its own names
    for k in one:
        assert cut[k].shape == one[k].shape, k
        torch.testing.assert_close(cut[k], one[k], rtol=0, atol=ATOL, msg=k)
    first = report.read_run(runs / "tp_one.jsonl")["epochs"][0]
    run = report.read_run(runs / f"{name}.jsonl")
    assert run["problems"] == [] and run["summary"]["status"] == "finished"
    assert run["epochs"][0]["loss"] == pytest.approx(first["loss"], abs=ATOL)
    assert (
        run["epochs"][0]["samples"] == first["samples"] == 512
    )  # each sample counted once, not once per tp rank
    assert run["epochs"][0]["samples_per_s"] > 0


def test_the_baseline_trained_far_beyond_the_tolerance(runs):
    torch.manual_seed(1)
    init = models.FeedForwardStack((1, 28, 28), 10, BLOCKS, WIDTH, HIDDEN).state_dict()
    one = params(runs, "tp_one")
    assert (
        min((one[k] - init[k]).abs().max().item() for k in one if k.startswith("blocks."))
        > 100 * ATOL
    )


def test_each_rank_holds_one_tp_th_of_the_cut_layers(runs):
    cut_layers = (
        BLOCKS * (WIDTH * HIDDEN + HIDDEN + HIDDEN * WIDTH) * VALUE
    )  # up's weight and bias, down's weight
    for name, (nproc, _) in JOBS.items():
        cfg = lesson.layout(name, log_dir=runs)
        tp, dp = cfg["tp"], cfg["dp"]
        assert (tp, dp, cfg["mesh"]) == ((2, 1, [1, 2]) if nproc == 2 else (2, 2, [2, 2]))
        assert [(p["dp"], p["tp"]) for p in cfg["placement"]] == [
            divmod(r, tp) for r in range(nproc)
        ]
        assert cfg["full_sharded_bytes"] == cut_layers
        whole = cfg["full_param_bytes"] - cut_layers
        for held, sharded in zip(cfg["param_bytes"], cfg["sharded_bytes"]):
            assert sharded * tp * dp == cut_layers
            assert (
                held * dp == whole + cut_layers // tp
            )  # FSDP shards these sizes evenly: no padding counted
    assert lesson.layout("tp_one", log_dir=runs)["param_bytes"] == [
        lesson.layout("tp_one", log_dir=runs)["full_param_bytes"]
    ]


def test_one_step_communicates_what_megatron_lm_counts(runs):
    for name, (nproc, _) in JOBS.items():
        rec = [
            r for r in report.read_run(runs / f"{name}.jsonl")["extra"] if r["type"] == "tp_comm"
        ][-1]
        assert len(rec["collectives"]) == nproc
        batch = BATCH // lesson.layout(name, log_dir=runs)["dp"]
        for rows in rec["collectives"]:
            assert rows == rec["collectives"][0]  # every rank takes part in the same collectives
            got = {(phase, op, dim): (calls, size) for phase, op, dim, calls, size in rows}
            for phase in (
                "forward",
                "backward",
            ):  # one all-reduce of batch x width floats per block
                assert got[(phase, "all_reduce", "tp")] == (BLOCKS, BLOCKS * batch * WIDTH * VALUE)
            assert not [k for k in got if k[0] == "step"]  # the optimizer step is local
            dp_ops = {k[1] for k in got if k[2] == "dp"}
            assert dp_ops == (set() if nproc == 2 else {"all_gather", "reduce_scatter"})
        if nproc == 4:  # the gradients reduce-scattered are every parameter a tp rank holds, once
            cfg = lesson.layout(name, log_dir=runs)
            assert got[("backward", "reduce_scatter", "dp")][1] == cfg["param_bytes"][0] * cfg["dp"]
    one = [r for r in report.read_run(runs / "tp_one.jsonl")["extra"] if r["type"] == "tp_comm"][-1]
    assert one["collectives"] == [[]]


def test_the_lessons_sentences_read_the_runs(runs):
    t = lesson.memory_table(["tp_one", *JOBS], log_dir=runs)
    assert t["same_on_every_rank"].all() and (abs(t["held_mb"] - t["expected_mb"]) < 1e-9).all()
    assert all("as the plan says" in s for s in lesson.about_memory(t)[1:])
    for name in JOBS:
        text = " ".join(lesson.about_comm(name, log_dir=runs))
        assert text.count("as Megatron-LM counts") == 2 and "NOT" not in text
        assert "communicated nothing" in text
    assert "FSDP over dp added" in " ".join(lesson.about_comm("tp_2x2", log_dir=runs))


def test_when_tp_pays_adds_up_the_measured_step(runs):
    """The sentence weighing tp's all-reduces against the compute they save: its numbers add up
    (tp's step is 1/tp of one process's plus the rest, spread over the all-reduces tp_comm counted)
    and its verdict is the throughput's."""
    pays = lesson.when_tp_pays("tp_one", "tp_2", log_dir=runs)
    assert pays["calls"] == 2 * BLOCKS
    assert pays["tp_step_s"] == pytest.approx(pays["one_step_s"] / 2 + pays["extra_s"])
    rate = lesson.throughput(["tp_one", "tp_2"], log_dir=runs)
    slower = rate["tp_2"] < rate["tp_one"]
    assert (pays["ratio"] > 1) == slower
    assert ("was slower than one process" if slower else "was faster than one process") in pays[
        "sentence"
    ]
    # with lesson 11's alpha and beta the step's excess splits into the all-reduces and the rest
    split = lesson.when_tp_pays("tp_one", "tp_2", log_dir=runs, alpha_beta=(300e-6, 1e9))
    t = lesson.comm_table("tp_2", log_dir=runs)
    size = t[(t["op"] == "all_reduce") & (t["dimension"] == "tp")]["bytes"].sum()
    # a ring all-reduce over 2: 2 latencies and the message once
    assert split["collective_s"] == pytest.approx(pays["calls"] * 2 * 300e-6 + size / 1e9)
    assert "everything else" in split["sentence"]


def test_the_cut_picture_draws_the_runs_plan_on_each_rank(runs):
    cfg = lesson.layout("tp_2", runs)
    fig = lesson.plot_cuts("tp_2", "test_tp_cuts", runs)
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert [f"rank {r}" in texts for r in range(cfg["tp"] + 1)] == [True] * cfg["tp"] + [False]
    assert f"{cfg['width']} x {cfg['hidden']}: its columns" in texts  # up: colwise
    assert f"{cfg['hidden']} x {cfg['width']}: its rows" in texts  # down: rowwise
    assert f"batch x {cfg['hidden'] // cfg['tp']}" in texts and "one all-reduce" in texts
    assert texts.count("ColwiseParallel") == texts.count("RowwiseParallel") == cfg["tp"]


def test_the_exercise_solution_matches_the_measured_bytes(runs):
    path = ROOT / "notebooks" / "solutions" / "09c_tensor_parallel.py"  # lesson 09c's exercises
    spec = importlib.util.spec_from_file_location("solution_09c_tp", path)
    s = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(s)
    cfg = lesson.layout("tp_2", log_dir=runs)
    stem_and_head = (28 * 28 * WIDTH + WIDTH + WIDTH * 10 + 10) * VALUE
    assert (
        BLOCKS * s.block_bytes_per_rank(WIDTH, HIDDEN, 2, VALUE) + stem_and_head
        == cfg["param_bytes"][0]
    )
    calls, message, sent = s.allreduce_bytes_per_step(BATCH, WIDTH, BLOCKS, 2)
    assert (calls, message, sent) == (
        2 * BLOCKS,
        BATCH * WIDTH * 4,
        2 * BLOCKS * BATCH * WIDTH * 4 * 2 * 1 / 2,
    )
    assert s.allreduce_bytes_per_step(BATCH, WIDTH, BLOCKS, 1) == (0, 0, 0.0)
    one_block = s.block_bytes_per_rank(8, 32, 1)
    assert s.largest_tp_that_fits(8, 32, 1, 4 * one_block) == 1
    assert (
        s.largest_tp_that_fits(8, 32, 1, 4 * one_block - 1) == 2
        and s.largest_tp_that_fits(8, 32, 1, 1) is None
    )
    assert s.largest_tp_that_fits(4096, 16384, 48, 16e9) == 8  # the exercise's question


@pytest.mark.parametrize(
    "world, flags, words",
    [
        (2, ["--tp", 3], ["--tp 3 does not divide the 2 process(es)"]),
        (4, ["--tp", 2, "--dp", 3], ["--dp 3 x --tp 2 needs 6 processes", "this job has 4"]),
        (1, ["--dp", 2], ["--dp 2 x --tp 1 needs 2 processes", "this job has 1"]),
        (4, ["--hidden", 30, "--tp", 4], ["--hidden 30 cannot be cut into --tp 4 equal slices"]),
    ],
)
def test_bad_input_is_one_sentence_and_a_nonzero_exit(
    monkeypatch, capsys, log_dir, world, flags, words
):
    import _trainup_tp

    (
        monkeypatch.setenv("RANK", "0"),
        monkeypatch.setenv("WORLD_SIZE", str(world)),
        monkeypatch.setenv("LOCAL_RANK", "0"),
    )
    proc = in_process(
        _trainup_tp.main,
        ["--quick", *flags, "--log-dir", log_dir, "--checkpoint-dir", log_dir],
        capsys,
    )
    assert proc.returncode == 2
    assert_clean_error(proc, *words)
    assert not log_dir.exists()  # nothing half-written, and no process group was joined


def test_the_batch_splits_over_the_data_parallel_groups_only(log_dir):
    """Each tp rank takes its replica's whole batch: with dp 1, a global batch of 3 on 2 tp ranks is
    a valid job, not 'cannot be split over 2 processes'."""
    cmd = [
        sys.executable,
        SCRIPT,
        *map(str, TINY),
        "--batch-size",
        "3",
        "--epochs",
        "1",
        "--train-size",
        "12",
        "--test-size",
        "12",
        "--run-name",
        "odd",
        "--log-dir",
        str(log_dir),
        "--checkpoint-dir",
        str(log_dir / "checkpoints"),
    ]
    done = Ranks(cmd, launch.environment(), ntasks=2).finish()
    assert done.returncode == 0, done.stderr[-3000:]
    checks.finished("odd", log_dir)
