"""_trainup_4d.py run for real under torchrun: the transformer on 16 CPU processes over gloo, a
mesh of pipeline 2 x data 2 (FSDP2) x context 2 x tensor 2, and on 4 (data 2 x context 2, no
pipeline). Each must end with the parameters of one process (float64), and every rank's counted
step must move, per mesh dimension and collective, the bytes the formulas give, and nothing
else; every rank must hold, of its layers, the bytes lesson 11a2's planner predicts for the
layout, within 10 % per term. Bad layouts: one sentence, exit status 2, checked in this process
(no job started)."""

import importlib.util

import pytest
import torch

from conftest import ROOT, assert_clean_error, finish_ok, in_process, start_run
from lessons import checks, report
from lessons.bylesson import planner
from trainup.parallel import sharding

SCRIPT = "_trainup_4d.py"  # under scripts/ (conftest.SCRIPTS)
TRAIN, TEST = 64, 32  # two steps of 32 (the second one counted), one test batch per replica
SIZE = [
    "--quick",
    "--train-size",
    TRAIN,
    "--test-size",
    TEST,
    "--batch-size",
    32,
    "--epochs",
    1,
    "--blocks",
    4,
    "--width",
    16,
    "--hidden",
    64,  # the MLP 4 x width: the planner's transformer (lessons/bylesson/planner.py)
    "--heads",
    4,
    "--microbatches",
    2,
    *checks.PROOF,
    "--no-progress",
    "--threads",
    1,
]
JOBS = {
    "fourd_pp2dp2cp2tp2": (16, ["--pp", 2, "--dp", 2, "--cp", 2, "--tp", 2]),
    "fourd_dp2cp2": (4, ["--dp", 2, "--cp", 2]),
}
ATOL = checks.FLOAT64_ATOL


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The folder of every run: the jobs under torchrun, the baseline as `python script`, each a
    fresh interpreter, side by side."""
    log_dir = tmp_path_factory.mktemp("four_d") / "logs"
    procs = {
        name: start_run(SCRIPT, nproc, SIZE + flags, log_dir, name)
        for name, (nproc, flags) in JOBS.items()
    }
    procs["fourd_one"] = start_run(SCRIPT, 1, SIZE, log_dir, "fourd_one")
    for name, proc in procs.items():
        finish_ok(proc, name)
    return log_dir


def params(log_dir, name):
    return torch.load(log_dir / "checkpoints" / f"{name}.pt", weights_only=True)["model"]


def record(log_dir, name, kind):
    extra = report.read_run(log_dir / f"{name}.jsonl")["extra"]
    (found,) = [r for r in extra if r["type"] == kind]
    return found


@pytest.mark.parametrize("name", list(JOBS))
def test_the_job_ends_with_the_parameters_of_one_process(runs, name):
    one, cut = params(runs, "fourd_one"), params(runs, name)
    assert cut.keys() == one.keys()
    for k in one:
        torch.testing.assert_close(cut[k], one[k], rtol=0, atol=ATOL, msg=k)
    first = report.read_run(runs / "fourd_one.jsonl")["epochs"]
    run = report.read_run(runs / f"{name}.jsonl")
    assert run["problems"] == [] and run["summary"]["status"] == "finished"
    assert run["env"]["world_size"] == JOBS[name][0] and run["env"]["backend"] == "gloo"
    for e, f in zip(run["epochs"], first, strict=True):
        assert e["loss"] == pytest.approx(f["loss"], abs=ATOL)
        assert e["test_loss"] == pytest.approx(f["test_loss"], abs=ATOL)
        assert e["samples"] == f["samples"] == TRAIN  # each sample once, not once per rank


def test_one_mesh_places_every_rank_tp_innermost(runs):
    layout = record(runs, "fourd_pp2dp2cp2tp2", "4d")
    assert layout["mesh"] == {"pp": 2, "dp": 2, "cp": 2, "tp": 2}
    for where in layout["placement"]:
        r = where["rank"]
        assert (where["pp"], where["dp"], where["cp"], where["tp"]) == (
            r // 8,
            r // 4 % 2,
            r // 2 % 2,
            r % 2,
        )


@pytest.mark.parametrize("name", list(JOBS))
def test_every_rank_moves_the_bytes_the_formulas_give_per_dimension(runs, name):
    comm = record(runs, name, "4d_comm")
    assert comm["step"] == 2 and len(comm["ranks"]) == JOBS[name][0]
    dimensions = set()
    for rank, rows in enumerate(comm["ranks"]):
        for dim, op, calls, size, formula in rows:
            assert formula is not None, (rank, dim, op, "a collective no formula names")
            assert calls > 0 and size == formula, (rank, dim, op, calls, size, formula)
            dimensions.add(dim)
    expected = {"pp", "dp_cp", "cp", "tp"} if "pp2" in name else {"dp_cp", "cp"}
    assert dimensions == expected


def planned(flags):
    """lessons/bylesson/planner's bytes per GPU (param, grad, optim) for a job's layout and the
    model of SIZE: FSDP2 is ZeRO-3 over dp x cp; every state in float64 (sharding.expected's rule
    for a --precision 64 run: FP32_ADAM's bytes doubled; Adadelta, like Adam, keeps two values a
    parameter)."""

    def option(flag):
        return SIZE[SIZE.index(flag) + 1]

    model = planner.Transformer(
        layers=option("--blocks"), hidden=option("--width"), heads=option("--heads"), seq=28
    )  # an image's 28 rows
    degree = {name: 1 for name in ("dp", "tp", "pp", "cp")} | dict(
        zip((f[2:] for f in flags[::2]), flags[1::2])
    )
    layout = planner.Layout(stage="parameters", **degree)
    per_param = tuple(2 * b for b in sharding.FP32_ADAM)
    return dict(zip(("param", "grad", "optim"), planner.states(model.params(), layout, per_param)))


def held_as_planned(held, flags, rtol=0.10):
    """The ranks (and terms) whose bytes in the layers are not within rtol of the planner's."""
    want = planned(flags)
    return {
        (rank, term): (parts[0], want[term])
        for rank, terms in enumerate(held)
        for term, parts in terms.items()
        if abs(parts[0] - want[term]) > rtol * want[term]
    }


@pytest.mark.parametrize("name", list(JOBS))
def test_every_rank_holds_the_bytes_the_planner_predicts(runs, name):
    """Of its layers (the planner's model: no embedding, norm or head), every rank holds within
    10 % of lesson 11a2's bytes for the layout, parameters, gradients and optimizer state apart:
    more by the biases and LayerNorms tensor parallelism replicates (the planner counts them cut)
    and by Adadelta's step count. The embedding, norm and head add the rest: whole on every tp
    rank of their stage, sharded over dp x cp."""
    world, flags = JOBS[name]
    memory = record(runs, name, "4d_memory")
    assert memory["step"] == 2 and len(memory["ranks"]) == world
    assert held_as_planned(memory["ranks"], flags) == {}
    tp = record(runs, name, "4d")["mesh"]["tp"]
    whole = record(runs, "fourd_one", "4d_memory")["ranks"][0]  # one process: the whole model
    for term in ("param", "grad"):  # each tp rank's replica of the rest, its shards summed
        rest = sum(held[term][1] for held in memory["ranks"])
        assert rest == tp * whole[term][1], (term, rest, whole[term][1])


@pytest.mark.parametrize(
    "world, flags, words",
    [
        (8, ["--pp", 2, "--tp", 2, "--dp", 3], ["needs 12 processes, and this job has 8"]),
        (8, ["--pp", 3, "--tp", 2], ["--pp 3 x --dp 1 x --cp 1 x --tp 2 needs 6 processes"]),
        (4, ["--pp", 4, "--blocks", 2], ["--blocks 2 cannot be cut into --pp 4 stages"]),
        (8, ["--tp", 8], ["--heads 4 cannot be shared by --tp 8 processes"]),
        (3, ["--cp", 3], ["28 rows (the sequence) cannot be cut evenly over --cp 3"]),
        (2, ["--pp", 2, "--microbatches", 5], ["--microbatches 5 does not divide the 64"]),
    ],
)
def test_bad_layouts_are_one_sentence_and_a_nonzero_exit(
    monkeypatch, capsys, log_dir, world, flags, words
):
    import _trainup_4d

    for k, v in (("RANK", "0"), ("WORLD_SIZE", str(world)), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(k, v)
    proc = in_process(
        _trainup_4d.main,
        ["--quick", *map(str, flags), "--log-dir", log_dir, "--checkpoint-dir", log_dir],
        capsys,
    )
    assert proc.returncode == 2
    assert_clean_error(proc, *words)
    assert not log_dir.exists()  # nothing half-written, and no process group was joined


def test_the_exercises_solutions_give_what_the_job_counted(runs):
    path = ROOT / "notebooks" / "solutions" / "09g_four_dimensions.py"
    spec = importlib.util.spec_from_file_location("solution_09g", path)
    s = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(s)
    counted = {
        (d, op): size
        for d, op, _, size, _ in record(runs, "fourd_pp2dp2cp2tp2", "4d_comm")["ranks"][0]
    }
    answer = s.first_stage_bytes()
    assert answer == {
        "tp all_reduce": counted["tp", "all_reduce"],
        "pp send": counted["pp", "send"],
    }
    refused = s.refused(s.LAYOUTS)
    assert len(refused) == 3
    assert "rows (the sequence) cannot be cut evenly over --cp 16" in refused[str(s.LAYOUTS[1])]
    assert "--blocks 4 cannot be cut into --pp 8 stages" in refused[str(s.LAYOUTS[2])]
    assert "--heads 4 cannot be shared by --tp 8" in refused[str(s.LAYOUTS[3])]
