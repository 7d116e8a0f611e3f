"""_trainup_cp.py run for real: the transformer's sequence cut over 2 processes under torchrun,
attention by ring (with and without the causal zig-zag split) and by all-to-all (Ulysses). Each
must end with the parameters of one process (float64), every rank sending for attention the bytes
the formula counts. The mechanism alone: ring and all-to-all attention against whole attention,
forward and backward, on 3 processes (a ring whose next and previous ranks differ). Bad layouts:
one sentence, exit status 2, checked in this process (no job started)."""

import importlib.util
import json

import pytest
import torch

from conftest import (
    ROOT,
    SCRIPTS,
    assert_clean_error,
    finish_job,
    finish_ok,
    in_process,
    start_job,
    start_run,
)
from lessons import checks, launch, report
from lessons.bylesson import equivalence
from trainup.parallel import context_parallel as cp
from trainup import transformer

SCRIPT = "_trainup_cp.py"  # under scripts/ (conftest.SCRIPTS)
LAYERS, WIDTH, HIDDEN, HEADS = 2, 16, 32, 4
SIZE = [
    "--quick",
    "--blocks",
    LAYERS,
    "--width",
    WIDTH,
    "--hidden",
    HIDDEN,
    "--heads",
    HEADS,
    *checks.PROOF,
    "--no-progress",
    "--threads",
    1,
]
JOBS = {
    "cp_ring": [],
    "cp_ring_causal": ["--causal"],
    "cp_ulysses_causal": ["--cp-attention", "ulysses", "--causal"],
}
BASELINES = {"cp_one": [], "cp_one_causal": ["--causal"]}
TOLERANCE = equivalence.TOLERANCE


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The folder of every run: the jobs under torchrun, the baselines as `python script`, each a
    fresh interpreter, side by side."""
    log_dir = tmp_path_factory.mktemp("cp") / "logs"
    procs = {
        name: start_run(SCRIPT, nproc, SIZE + flags, log_dir, name)
        for nproc, jobs in ((2, JOBS), (1, BASELINES))
        for name, flags in jobs.items()
    }
    for name, proc in procs.items():
        finish_ok(proc, name)
    return log_dir


def params(log_dir, name):
    return torch.load(log_dir / "checkpoints" / f"{name}.pt", weights_only=True)["model"]


def records(log_dir, name, kind):
    return [r for r in report.read_run(log_dir / f"{name}.jsonl")["extra"] if r["type"] == kind]


def baseline_of(name):
    return "cp_one_causal" if "causal" in name else "cp_one"


@pytest.mark.parametrize("name", list(JOBS))
def test_two_processes_end_with_the_parameters_of_one(runs, name):
    one, cut = params(runs, baseline_of(name)), params(runs, name)
    assert cut.keys() == one.keys()
    for k in one:
        torch.testing.assert_close(cut[k], one[k], rtol=0, atol=TOLERANCE, msg=k)
    first = report.read_run(runs / f"{baseline_of(name)}.jsonl")["epochs"]
    run = report.read_run(runs / f"{name}.jsonl")
    assert run["problems"] == [] and run["summary"]["status"] == "finished"
    assert run["env"]["world_size"] == 2 and run["env"]["backend"] == "gloo"
    for e, f in zip(run["epochs"], first, strict=True):
        assert e["loss"] == pytest.approx(f["loss"], abs=TOLERANCE)
        assert e["test_loss"] == pytest.approx(f["test_loss"], abs=TOLERANCE)
        assert e["samples"] == f["samples"] == 512  # each sample once, not once per rank


def test_the_baselines_trained_far_beyond_the_tolerance_and_causal_is_another_model(runs):
    torch.manual_seed(1)  # the scripts' default --seed
    init = transformer.Classifier((1, 28, 28), 10, LAYERS, WIDTH, HEADS, HIDDEN).state_dict()
    one, causal = params(runs, "cp_one"), params(runs, "cp_one_causal")
    assert min((one[k] - init[k]).abs().max().item() for k in one if "attn" in k) > 100 * TOLERANCE
    assert max((one[k] - causal[k]).abs().max().item() for k in one) > 100 * TOLERANCE


@pytest.mark.parametrize("name", list(JOBS))
def test_every_rank_sends_for_attention_what_the_formula_counts(runs, name):
    (layout,) = records(runs, name, "cp")
    (traffic,) = records(runs, name, "cp_comm")
    attention = "ulysses" if "ulysses" in name else "ring"
    block = traffic["per_rank_batch"] * 14 * WIDTH * 8  # one rank's k: its 14 rows, float64
    if attention == "ring":  # k and v on once; in backward again, and their gradients home twice
        expected = {"forward": LAYERS * 2 * block, "backward": LAYERS * (2 + 4) * block}
    else:  # q, k, v over and the output back, each sending half of it; backward the reverse
        expected = {"forward": LAYERS * 4 * block // 2, "backward": LAYERS * 4 * block // 2}
    assert traffic["expected_bytes"] == expected
    assert traffic["sent_bytes"] == [expected, expected]
    assert (layout["cp"], layout["attention"], layout["tokens"]) == (2, attention, 28)
    every = sorted(sum(layout["positions"], []))
    assert every == list(range(28))  # each row held once
    assert len(set(layout["visible_scores"])) == 1  # as much work on each rank


def test_the_zigzag_split_balances_causal_work_and_the_contiguous_does_not():
    assert cp.positions(0, 2, 8, zigzag=True).tolist() == [0, 1, 6, 7]
    assert cp.positions(1, 2, 8, zigzag=True).tolist() == [2, 3, 4, 5]
    assert cp.visible_scores(2, 28, causal=True) == [203, 203]  # 28 x 29 / 2, halved
    assert cp.visible_scores(2, 28, causal=True, zigzag=False) == [105, 301]
    assert cp.visible_scores(4, 28, causal=False) == [196] * 4


def test_ring_and_all_to_all_attention_equal_whole_attention_forward_and_backward():
    """3 processes (next and previous rank differ), each checking its tokens' output and
    gradients against attend() over the whole sequence, float64."""
    proc = finish_job(
        start_job(
            launch.TORCHRUN
            + launch.torchrun_flags(nproc=3)
            + ["-m", "trainup.parallel.context_parallel"],
            launch.environment({"PYTHONPATH": str(SCRIPTS)}),
        )
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert sorted(f["rank"] for f in found) == [0, 1, 2]
    for f in found:
        assert set(f["differences"]) == {"ring", "ring causal", "ulysses", "ulysses causal"}
        for name, differences in f["differences"].items():
            assert len(differences) == 4  # the output, the q, k and v gradients
            assert max(differences) < TOLERANCE, (f["rank"], name, differences)


@pytest.mark.parametrize(
    "world, flags, words",
    [
        (
            3,
            [],
            [
                "28 rows (the sequence) cannot be cut evenly over 3 processes",
                "a number of processes that divides 28",
            ],
        ),
        (
            4,
            ["--causal"],
            ["cannot be cut evenly into 2 x 4 zig-zag chunks", "whose double divides 28"],
        ),
        (
            2,
            ["--cp-attention", "ulysses", "--heads", 3, "--width", 18],
            ["--heads 3 does not divide over them"],
        ),
        (1, ["--heads", 5, "--width", 16], ["--width 16 cannot be split into --heads 5"]),
    ],
)
def test_bad_layouts_are_one_sentence_and_a_nonzero_exit(
    monkeypatch, capsys, log_dir, world, flags, words
):
    import _trainup_cp

    for k, v in (("RANK", "0"), ("WORLD_SIZE", str(world)), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(k, v)
    proc = in_process(
        _trainup_cp.main,
        ["--quick", *map(str, flags), "--log-dir", log_dir, "--checkpoint-dir", log_dir],
        capsys,
    )
    assert proc.returncode == 2
    assert_clean_error(proc, *words)
    assert not log_dir.exists()  # nothing half-written, and no process group was joined


def test_the_exercises_solutions_follow_the_formula():
    path = ROOT / "notebooks" / "solutions" / "09d_context_parallel.py"
    spec = importlib.util.spec_from_file_location("solution_13", path)
    s = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(s)
    block = 64 * 14 * 16 * 8  # the runs' block at cp 2: batch x 14 rows x width, float64
    assert s.bytes_per_step("ring", 2) == 2 * (6 * 2 - 4) * block
    assert s.bytes_per_step("ulysses", 2) == 2 * 8 * block // 2
    assert s.smallest_cp_where_ulysses_sends_under_a_third() == 4
    assert s.imbalance(2) == pytest.approx(301 / 105)
    assert s.imbalance(7, zigzag=True) == 1
