"""_trainup_compile.py run for real: the DDP model compiled by torch.compile (Inductor's C++ on
the CPU) on 2 processes under torchrun over gloo, against the eager script on one process. In
float64 (Inductor compiles float64 on the CPU) the compiled pair must end with the eager process's
parameters; the log must keep the first step, which compiles, apart from the others, and count
the graphs (one per DDP bucket), the graph breaks and the recompiles. Bad flags: one sentence,
exit status 2, checked in this process (no job started). Lesson 09's block stack compiled
as torchtitan compiles a transformer (each block, then fully_shard: FSDP2), on 2 processes, must
end with one eager process's parameters too, its one graph holding the block's operations and no
collective.

Inductor keeps what it compiled in /tmp/torchinductor_<user> and reuses it; these jobs must also
pass where that cache is empty (a fresh machine, CI): their guard is sized for a cold compile."""

import subprocess
from types import SimpleNamespace

import pytest
import torch

from conftest import assert_clean_error, in_process, kill_tree, start_run
from lessons import checks, report
from trainup import models

SCRIPT = "_trainup_compile.py"  # under scripts/ (conftest.SCRIPTS)
# 480 samples: each rank's last batch holds 16 samples, not 32, so the compiled forward meets a
# second shape in epoch 1 and compiles again (a recompile, with that dimension dynamic from then
# on); one process takes 7 batches of 64 and one of 32, the same samples and the same means.
TRAIN, BATCH = 480, 64
SIZE = [
    "--quick",
    "--train-size",
    TRAIN,
    "--batch-size",
    BATCH,
    "--dropout",
    0,
    "--device",
    "cpu",
    *checks.PROOF,
    "--no-progress",
]
# 1 MB: the float64 CNN's buckets, counted backwards as DDPOptimizer counts them, are
# [fc2, fc1] (fc1 alone holds 9.4 MB) and [conv2, conv1]: 2 graphs compiled
CAP, BUCKETS = 1, 2
# A cold Inductor compile of a float64 CNN's forward and backward, on each of 2 ranks sharing 2
# busy cores, took about 150 s here, and the recompile adds to it: far above conftest's
# HANG_GUARD_S, which is sized for eager jobs.
COMPILE_GUARD_S = 900


def finish(proc):
    try:
        out, err = proc.communicate(timeout=COMPILE_GUARD_S)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, err = proc.communicate(timeout=30)
        raise AssertionError(f"{proc.args} did not end within {COMPILE_GUARD_S} s\n{err[-4000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The eager script on one process with the whole batch, and the compiled script on 2
    processes with half each, side by side: their log folder."""
    log_dir = tmp_path_factory.mktemp("compile") / "logs"
    wanted = {"eager_one": (1, []), "compiled_two": (2, ["--compile", "--bucket-cap-mb", CAP])}
    started = {
        name: start_run(SCRIPT, nproc, SIZE + flags, log_dir, name)
        for name, (nproc, flags) in wanted.items()
    }
    for name, proc in started.items():
        done = finish(proc)
        assert done.returncode == 0, f"{name}: exit {done.returncode}\n{done.stderr[-4000:]}"
    return log_dir


def params(log_dir, name):
    return torch.load(log_dir / "checkpoints" / f"{name}.pt", weights_only=True)["model"]


def records(log_dir, name, kind):
    return [r for r in report.read_run(log_dir / f"{name}.jsonl")["extra"] if r["type"] == kind]


def test_two_compiled_ranks_end_with_the_parameters_of_one_eager_process(runs):
    one, two = params(runs, "eager_one"), params(runs, "compiled_two")
    assert two.keys() == one.keys()  # the plain model's names: no _orig_mod. prefix saved
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=0, atol=checks.FLOAT64_ATOL, msg=k)
    init = models.build(
        SimpleNamespace(model="cnn", seed=1, dropout=0.0),
        SimpleNamespace(shape=(1, 28, 28), num_classes=10),
    ).state_dict()
    assert max((one[k] - init[k]).abs().max().item() for k in one) > 1e-2  # far beyond atol
    first = report.read_run(runs / "eager_one.jsonl")["epochs"]
    run = report.read_run(runs / "compiled_two.jsonl")
    assert run["problems"] == [] and run["summary"]["status"] == "finished"
    for e, f in zip(run["epochs"], first, strict=True):
        assert e["samples"] == f["samples"] == TRAIN
        assert e["loss"] == pytest.approx(f["loss"], abs=checks.FLOAT64_ATOL)
        assert e["test_loss"] == pytest.approx(f["test_loss"], abs=checks.FLOAT64_ATOL)


def test_the_log_keeps_the_compiling_step_apart_and_counts_graphs_and_recompiles(runs):
    first, second = records(runs, "compiled_two", "compile")
    assert first["compiled"] and first["mode"] == "default" and first["bucket_cap_mb"] == CAP
    assert first["steps"] == second["steps"] == TRAIN // 2 // (BATCH // 2) + 1  # 7 whole, 1 short
    # one graph of the model's forward, compiled in DDPOptimizer's pieces: one per bucket
    assert first["graphs"] >= 1 and first["compiled_graphs"] >= BUCKETS
    assert first["recompiles"] >= 1  # the short last batch: a second shape
    # the record is written before the test pass: its compile time was spent in the epoch's steps
    # (the first and the short last one; how it splits between them varies with the machine)
    epoch_one = report.read_run(runs / "compiled_two.jsonl")["epochs"][0]
    assert 0 < first["compile_s"] <= epoch_one["wall_s"]
    assert first["first_step_s"] > 5 * first["step_s"]  # the compile, far above a step's time
    # epoch 2 compiles nothing new: the same shapes, the last one now dynamic
    counts = ("graphs", "compiled_graphs", "graph_breaks", "recompiles", "compile_s")
    assert {k: second[k] for k in counts} == {k: first[k] for k in counts}
    eager = records(runs, "eager_one", "compile")
    assert [(r["compiled"], r["mode"], r["graphs"], r["recompiles"]) for r in eager] == [
        (False, "eager", 0, 0)
    ] * 2
    assert "epoch 2:" in (runs / "compiled_two.stdout").read_text()


@pytest.mark.parametrize(
    "flags, words",
    [
        (
            ["--compile-mode", "max-autotune-no-cudagraphs"],
            ["--compile-mode max-autotune-no-cudagraphs needs --compile"],
        ),
        (["--compile", "--bucket-cap-mb", 0], ["--bucket-cap-mb must be greater than 0"]),
        (["--compile", "--bucket-cap-mb", 0.5], ["below DDPOptimizer's first bucket of 1 MiB"]),
        (["--compile", "--compile-mode", "fastest"], ["invalid choice: 'fastest'"]),
    ],
)
def test_bad_flags_are_one_sentence_and_a_nonzero_exit(monkeypatch, capsys, log_dir, flags, words):
    import _trainup_compile

    for k, v in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(k, v)
    proc = in_process(
        _trainup_compile.main,
        ["--quick", *map(str, flags), "--log-dir", log_dir, "--checkpoint-dir", log_dir],
        capsys,
    )
    assert proc.returncode == 2
    assert_clean_error(proc, *words)
    assert not log_dir.exists()  # nothing half-written, and no process group was joined


FSDP = "_trainup_fsdp.py"
# lesson 09's block stack, tiny: 4 steps an epoch, every batch whole (no second shape)
BLOCKS = [
    "--quick",
    "--train-size",
    128,
    "--test-size",
    64,
    "--batch-size",
    32,
    "--blocks",
    2,
    "--width",
    32,
    "--shard",
    "parameters",
    "--device",
    "cpu",
    *checks.PROOF,
    "--no-progress",
]


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory):
    """The eager block stack on one process, and its blocks compiled and sharded by FSDP2 on 2
    (TORCH_LOGS=graph_code: each rank prints the graphs Dynamo captured): (log folder, the
    compiled job's stderr)."""
    log_dir = tmp_path_factory.mktemp("compile_fsdp") / "logs"
    eager = start_run(FSDP, 1, BLOCKS, log_dir, "fsdp_eager_one")
    two = start_run(
        FSDP,
        2,
        [*BLOCKS, "--compile"],
        log_dir,
        "fsdp_compiled_two",
        env={"TORCH_LOGS": "graph_code"},
    )
    done = {name: finish(proc) for name, proc in (("eager", eager), ("compiled", two))}
    for name, proc in done.items():
        assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stderr[-4000:]}"
    return log_dir, done["compiled"].stderr


def test_two_ranks_of_compiled_fsdp2_blocks_end_with_the_parameters_of_one_eager_process(fsdp_runs):
    log_dir, _ = fsdp_runs
    one, two = params(log_dir, "fsdp_eager_one"), params(log_dir, "fsdp_compiled_two")
    assert two.keys() == one.keys()  # Module.compile in place: the eager names, no _orig_mod.
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=0, atol=checks.FLOAT64_ATOL, msg=k)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # as the script builds it under --precision 64
    try:
        torch.manual_seed(1)  # the script's --seed
        init = models.BlockStack((1, 28, 28), 10, 2, 32).state_dict()
    finally:
        torch.set_default_dtype(default)
    assert max((one[k] - init[k]).abs().max().item() for k in one) > 1e-3  # far beyond atol
    run = report.read_run(log_dir / "fsdp_compiled_two.jsonl")
    assert run["problems"] == [] and run["summary"]["status"] == "finished"
    for e, f in zip(
        run["epochs"], report.read_run(log_dir / "fsdp_eager_one.jsonl")["epochs"], strict=True
    ):
        assert e["samples"] == f["samples"] == 128
        assert e["loss"] == pytest.approx(f["loss"], abs=checks.FLOAT64_ATOL)


def test_each_rank_compiled_one_graph_of_the_blocks_and_fsdp2s_collectives_stayed_out(fsdp_runs):
    _, stderr = fsdp_runs
    for rank in (0, 1):
        lines = [line for line in stderr.splitlines() if line.startswith(f"[rank{rank}]:")]
        graphs = "\n".join(lines).split("TRACED GRAPH")[1:]
        assert len(graphs) == 1, f"rank {rank}: {len(graphs)} graphs"  # both blocks share it
        graph = graphs[0]
        for op in ("layer_norm", "linear", "relu"):  # the block's forward (models.Block)
            assert op in graph, f"rank {rank}: no {op} in the graph"
        # fully_shard's gathers and reduce-scatters run in its hooks, outside the graph
        assert "all_gather" not in graph and "reduce_scatter" not in graph


def test_compile_on_a_stage_without_fully_shard_is_one_sentence(monkeypatch, capsys, log_dir):
    import _trainup_fsdp

    for k, v in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(k, v)
    proc = in_process(
        _trainup_fsdp.main,
        [
            "--quick",
            "--compile",
            "--shard",
            "none",
            "--log-dir",
            log_dir,
            "--checkpoint-dir",
            log_dir,
        ],
        capsys,
    )
    assert proc.returncode == 2
    assert_clean_error(
        proc,
        "--compile compiles each block before fully_shard shards it",
        "--shard parameters or gradients_fsdp only, got --shard none",
    )
    assert not log_dir.exists()
