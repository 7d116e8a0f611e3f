"""_trainup_tp_sp.py run for real: a transformer cut over 2 processes as Megatron-LM cuts it, the
same with sequence parallelism, and sequence parallelism on a 2-D mesh (2 replicas under FSDP x 2
tensor-parallel processes). Each must end with the parameters of one process (float64); one step
must run exactly the collectives the papers count; each rank holds 1/tp of the cut layers. Bad
input: one sentence, exit status 2, checked in this process (no job started)."""

import importlib.util
import os

import pytest
import torch

from conftest import (
    ROOT,
    assert_clean_error,
    finish_job,
    in_process,
    notebook_or_own,
    start_run,
)
from lessons import checks, report
from lessons.bylesson import tp_attention as tpa, tp_runs
from trainup import transformer

SCRIPT = "_trainup_tp_sp.py"  # under scripts/ (conftest.SCRIPTS)
LAYERS, WIDTH, HIDDEN, HEADS = 2, 16, 32, 4
# notebook 09ca's quick runs, the same flags: in a session that runs it, the tests read its runs
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
]
READS_NOTEBOOK = "notebooks/09ca_tp_attention.ipynb"
NOTEBOOK_RUNS = {"tpa_2": (2, []), "tpa_sp2": (2, ["--sequence-parallel"])}
OWN_ONLY = {"tpa_dp2xsp2": (4, ["--tp", 2, "--sequence-parallel"])}  # no notebook makes it
ATOL = checks.FLOAT64_ATOL


def make(log_dir, jobs, baseline):
    """The jobs side by side, and the one-process baseline in this process meanwhile."""
    procs = {
        name: start_run(SCRIPT, nproc, SIZE + flags, log_dir, name, srun=True)
        for name, (nproc, flags) in jobs.items()
    }
    environ = dict(os.environ)
    try:
        if baseline:
            import _trainup_tp_sp

            _trainup_tp_sp.main(
                [
                    *map(str, SIZE),
                    "--threads",
                    "1",
                    "--run-name",
                    "tpa_one",
                    "--log-dir",
                    str(log_dir),
                    "--checkpoint-dir",
                    str(log_dir / "checkpoints"),
                ]
            )
    finally:
        os.environ.clear()
        os.environ.update(environ)  # the run set MASTER_ADDR/MASTER_PORT for its own group
        done = {name: finish_job(p) for name, p in procs.items()}
    for name, proc in done.items():
        assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stderr[-4000:]}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, request):
    """{run name: its log folder}: the notebook's runs where this session ran notebook 09ca, else
    this module's own; the 2-D mesh always this module's own."""
    own = tmp_path_factory.mktemp("tp_sp") / "logs"

    def load():
        logs = ROOT / "logs"
        found = all((logs / f"{n}.jsonl").exists() for n in ("tpa_one", *NOTEBOOK_RUNS))
        return found and {n: logs for n in ("tpa_one", *NOTEBOOK_RUNS)}

    def make_all():
        make(own, NOTEBOOK_RUNS, baseline=True)
        return {n: own for n in ("tpa_one", *NOTEBOOK_RUNS)}

    found = notebook_or_own(request, READS_NOTEBOOK, load, make_all)
    make(own, OWN_ONLY, baseline=False)  # the 2-D mesh, against the baseline found or made
    return {**found, **{n: own for n in OWN_ONLY}}


def params(folder, name):
    """The whole model a run saved: beside its log here, in the course's checkpoints/ for the
    notebook's."""
    ckpt = ROOT / "checkpoints" if folder == ROOT / "logs" else folder / "checkpoints"
    return torch.load(ckpt / f"{name}.pt", weights_only=True)["model"]


@pytest.mark.parametrize("name", [*NOTEBOOK_RUNS, *OWN_ONLY])
def test_every_layout_ends_with_the_parameters_of_one_process(runs, name):
    baseline = runs["tpa_one"]  # the same flags for every layout
    one, cut = params(baseline, "tpa_one"), params(runs[name], name)
    assert cut.keys() == one.keys()  # gathered from the slices, under the model's own names
    for k in one:
        assert cut[k].shape == one[k].shape, k
        torch.testing.assert_close(cut[k], one[k], rtol=0, atol=ATOL, msg=k)
    first = report.read_run(baseline / "tpa_one.jsonl")["epochs"]
    run = report.read_run(runs[name] / f"{name}.jsonl")
    assert run["problems"] == [] and run["summary"]["status"] == "finished"
    for e, f in zip(run["epochs"], first, strict=True):
        assert e["loss"] == pytest.approx(f["loss"], abs=ATOL)
        assert e["test_loss"] == pytest.approx(f["test_loss"], abs=ATOL)  # gathered scores
        assert e["samples"] == f["samples"] == 512  # each sample once, not once per tp rank


def test_the_baseline_trained_far_beyond_the_tolerance(runs):
    torch.manual_seed(1)  # the scripts' default --seed
    init = transformer.Classifier((1, 28, 28), 10, LAYERS, WIDTH, HEADS, HIDDEN).state_dict()
    one = params(runs["tpa_one"], "tpa_one")
    assert min((one[k] - init[k]).abs().max().item() for k in one if "attn" in k) > 100 * ATOL


@pytest.mark.parametrize("name", [*NOTEBOOK_RUNS, *OWN_ONLY])
def test_one_step_runs_the_collectives_the_papers_count(runs, name):
    t = tpa.comm_check([name], log_dir=runs[name])
    assert t["as_counted"].all(), t.to_string()
    sp = "sp" in name
    assert set(t["op"]) == (
        {"all_reduce", "all_gather", "reduce_scatter"} if sp else {"all_reduce"}
    )
    everyone = tp_runs.records(name, "tp_comm", runs[name])[-1]["collectives"]
    assert all(rows == everyone[0] for rows in everyone)  # every rank, the same collectives
    rows = tp_runs.comm_table(name, log_dir=runs[name])
    assert rows[rows["phase"] == "step"].empty  # the step is local: no partial gradient left
    assert set(rows["dimension"]) == ({"tp", "dp"} if name in OWN_ONLY else {"tp"})


def test_sequence_parallelism_sends_what_tensor_parallelism_sends_per_layer(runs):
    """Per layer the two send the same on a ring; the model's two ends differ (with sequence
    parallelism the embedding's and the head's reduce-scatter and all-gather, 4 half messages at
    tp 2, instead of the head's one all-reduce), and so do the small sums (the loss's 3 of batch
    values; with it, 2 of width values per LayerNorm). The exercise's solution counts them."""
    t = tpa.comm_check(list(NOTEBOOK_RUNS), log_dir=runs["tpa_2"])
    ring = tpa.ring_bytes(t, log_dir=runs["tpa_2"])
    batch = tp_runs.records("tpa_2", "tp_comm", runs["tpa_2"])[-1]["per_replica_batch"]
    message, loss, norms = batch * 28 * WIDTH * 8, 3 * batch * 8, 2 * (2 * LAYERS + 1) * WIDTH * 8
    # an all-reduce sends 2(tp-1)/tp of its bytes: at tp 2, all of them
    assert ring["tpa_sp2"] - norms - (ring["tpa_2"]) == pytest.approx(message)
    s = solution()
    assert s.ring_bytes_per_step(batch, 28, WIDTH, LAYERS, 2, False, 8) == pytest.approx(
        ring["tpa_2"] - loss
    )
    assert s.ring_bytes_per_step(batch, 28, WIDTH, LAYERS, 2, True, 8) == pytest.approx(
        ring["tpa_sp2"] - loss - norms
    )
    assert "1.11× as many" in tpa.about_ring(ring, "tpa_2", "tpa_sp2")


def solution():
    path = ROOT / "notebooks" / "solutions" / "09ca_tp_attention.py"
    spec = importlib.util.spec_from_file_location("solution_09ca", path)
    s = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(s)
    return s


def test_the_activation_exercise_follows_korthikanti():
    s = solution()
    assert s.activation_saving(2048, 12288, 96, 1) == pytest.approx(1)  # nothing cut: the same
    assert s.activation_saving(2048, 12288, 96, 8) == pytest.approx(23 / 14.25)
    assert s.ring_bytes_per_step(8, 28, 16, 2, 1, True) == 0.0


def test_each_rank_holds_one_tp_th_of_the_cut_layers(runs):
    # q, k, v and fc1 with their biases, proj and fc2 without (added once, after the sum)
    per_layer = 4 * (WIDTH * WIDTH) + 3 * WIDTH + 2 * WIDTH * HIDDEN + HIDDEN
    head = WIDTH * 10 + 10  # cut by class
    for name in NOTEBOOK_RUNS:
        cfg = tp_runs.layout(name, log_dir=runs[name])
        embed = 28 * WIDTH if cfg["sequence_parallel"] else 0  # cut by input features
        assert cfg["full_sharded_bytes"] == (LAYERS * per_layer + head + embed) * 8
        assert all(s * 2 == cfg["full_sharded_bytes"] for s in cfg["sharded_bytes"])
        assert (cfg["tokens"], cfg["heads"]) == (28, HEADS)


@pytest.mark.parametrize(
    "world, flags, words",
    [
        (2, ["--heads", 3, "--width", 18], ["--heads 3 cannot be shared by --tp 2"]),
        (1, ["--heads", 5, "--width", 16], ["--width 16 cannot be split into --heads 5"]),
        (
            3,
            ["--heads", 3, "--width", 18, "--hidden", 36, "--sequence-parallel"],
            ["--sequence-parallel cuts the 28 tokens", "over --tp 3"],
        ),
        (4, ["--heads", 4, "--width", 16], ["10 classes cannot be cut evenly over --tp 4"]),
    ],
)
def test_bad_input_is_one_sentence_and_a_nonzero_exit(
    monkeypatch, capsys, log_dir, world, flags, words
):
    import _trainup_tp_sp

    for k, v in (("RANK", "0"), ("WORLD_SIZE", str(world)), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(k, v)
    proc = in_process(
        _trainup_tp_sp.main,
        ["--quick", *map(str, flags), "--log-dir", log_dir, "--checkpoint-dir", log_dir],
        capsys,
    )
    assert proc.returncode == 2
    assert_clean_error(proc, *words)
    assert not log_dir.exists()  # nothing half-written, and no process group was joined
