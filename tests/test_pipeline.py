"""_trainup_pipeline.py run for real: 2 stages (ranks as srun starts them, gloo) with every schedule (one job runs them
in turn), 2 pipelines x 2 stages, the manual send/recv picture, and bad input. Every pipeline must end with
the parameters of one process that trains the whole model on the whole batch."""

import os
import sys

import pytest
import torch

from conftest import (
    SCRIPTS,
    Ranks,
    assert_clean_error,
    finish_job,
    in_process,
    start_job,
    start_wanted,
)
from lessons import checks, launch, report
from lessons.bylesson import recompute, schedules as lesson, zero_bubble
from trainup.parallel import pipeline

SCRIPT = str(SCRIPTS / "_trainup_pipeline.py")
MANUAL = str(SCRIPTS / "_trainup_pipeline_manual.py")
# a tiny model and data set: each job is mostly start-up; 4 micro-batches of 8
TINY = [
    "--quick",
    "--train-size",
    "128",
    "--test-size",
    "64",
    "--epochs",
    "1",
    "--batch-size",
    "32",
    "--blocks",
    "4",
    "--width",
    "32",
    "--microbatches",
    "4",
    "--no-progress",
    *checks.PROOF,
]
SCHEDULES = tuple(pipeline.SCHEDULES)
ATOL = checks.FLOAT64_ATOL  # float64 (checks.PROOF): sums in another order move ~1e-16


def start(cmd, env=None):
    return start_job(cmd, launch.environment(env))


finish = finish_job


def ok(proc):
    assert proc.returncode == 0, (
        f"exit {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )
    return proc


def job(log_dir, name, *args, nproc=2, script=SCRIPT, tiny=TINY):
    """nproc ranks started as srun starts them (no launcher, each a fresh interpreter); nproc 0:
    plain python."""
    cmd = [
        sys.executable,
        script,
        *tiny,
        *map(str, args),
        "--run-name",
        name,
        "--log-dir",
        str(log_dir),
        "--checkpoint-dir",
        str(log_dir / "checkpoints"),
    ]
    return Ranks(cmd, launch.environment(), ntasks=nproc) if nproc else start(cmd)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, request):
    """Started together: the one-process baseline, ONE 2-stage job that runs every schedule in turn (runs
    s_<schedule>: one start-up instead of eight), one of 2 pipelines x 2 stages, and the manual halves;
    those the selected tests read (their jobs marks) only."""
    log_dir = tmp_path_factory.mktemp("pipeline") / "logs"
    done = start_wanted(
        request,
        dict(
            one=lambda: job(log_dir, "one", "--stages", 1, nproc=0),
            s=lambda: job(log_dir, "s", "--schedule", ",".join(SCHEDULES)),
            # 2 pipelines x 2 stages, each block's activations recomputed in its backward
            pp2xdp2=lambda: job(
                log_dir,
                "pp2xdp2",
                "--schedule",
                "1f1b",
                "--data-parallel",
                2,
                "--recompute",
                nproc=4,
            ),
            # the tracer's cut (pipeline() and SplitPoint), under a schedule of 2 stages a rank
            traced=lambda: job(log_dir, "traced", "--schedule", "zbv", "--split", "traced"),
            manual=lambda: job(
                log_dir,
                "manual",
                "--steps",
                4,
                script=MANUAL,
                tiny=[
                    "--quick",
                    "--batch-size",
                    "32",
                    "--blocks",
                    "4",
                    "--width",
                    "32",
                    "--no-progress",
                    *checks.PROOF,
                ],
            ),
        ),
    )
    for proc in done.values():
        if proc is not None:
            ok(proc)
    return log_dir


def name(schedule):
    """The run the multi-schedule job wrote for one schedule (the 2 x 2 job ran one, under its own name)."""
    return schedule if schedule == "pp2xdp2" else f"s_{schedule}"


def params(log_dir, name):
    return torch.load(log_dir / "checkpoints" / f"{name}.pt", weights_only=True)["model"]


@pytest.mark.parametrize("schedule", SCHEDULES + ("pp2xdp2",))
def test_every_schedule_ends_with_the_parameters_of_one_process(runs, schedule):
    one, piped = params(runs, "one"), params(runs, name(schedule))
    assert piped.keys() == one.keys()  # the stages' pieces together are the whole model
    for k in one:
        torch.testing.assert_close(piped[k], one[k], rtol=0, atol=ATOL, msg=k)
    first = report.read_run(runs / "one.jsonl")["epochs"][0]
    run = report.read_run(runs / f"{name(schedule)}.jsonl")
    assert run["config"]["args"]["schedule"] == ("1f1b" if schedule == "pp2xdp2" else schedule)
    assert run["problems"] == [] and run["summary"]["status"] == "finished"
    assert run["epochs"][0]["loss"] == pytest.approx(first["loss"], abs=ATOL)
    assert run["epochs"][0]["samples"] == first["samples"] == 128


@pytest.mark.jobs("one", "traced")
def test_the_tracer_cuts_the_stages_that_the_hand_cut_does_and_ends_like_one_process(runs):
    from trainup import models

    torch.manual_seed(1)
    model = models.BlockStack((1, 28, 28), 10, 4, 32)
    by_hand = pipeline.cut(model, 4)
    by_tracer = pipeline.traced(model, 4, torch.zeros(8, 1, 28, 28))
    for hand, tracer in zip(by_hand, by_tracer, strict=True):
        assert [n for n, _ in hand.named_parameters()] == [n for n, _ in tracer.named_parameters()]
    one, piped = params(runs, "one"), params(runs, "traced")
    assert piped.keys() == one.keys()
    for k in one:
        torch.testing.assert_close(piped[k], one[k], rtol=0, atol=ATOL, msg=k)
    assert lesson.layout("traced", log_dir=runs)["split"] == "traced"
    steps = lesson.steps("traced", log_dir=runs, first=True)
    assert all(b > 0 for peaks in steps["peak_activation_bytes"] for b in peaks)  # metered too


def test_the_baseline_trained_far_beyond_the_tolerance(runs):
    from trainup import models

    torch.manual_seed(1)
    init = models.BlockStack((1, 28, 28), 10, 4, 32).state_dict()
    one = params(runs, "one")
    assert max((one[k] - init[k]).abs().max().item() for k in one) > 100 * ATOL


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_stage_notes_each_micro_batch_once_forward_and_backward(runs, schedule):
    steps = lesson.steps(name(schedule), log_dir=runs, first=True)
    m = 1 if schedule == "naive" else 4
    assert set(steps["rank"]) == {0, 1} and len(steps) == 2 * 4  # 4 steps of 32 samples, 2 ranks
    per_rank = 2 if pipeline.SCHEDULES[schedule][1] == 2 else 1
    for _, row in steps.iterrows():
        assert len(row["stages"]) == per_rank
        kinds = {}
        for stage, kind, mb, start, end in row["events"]:
            assert stage in row["stages"] and 0 <= start <= end <= row["step_s"] + 1e-3
            kinds.setdefault((stage, mb), []).append(kind)
        assert sorted(kinds) == sorted((s, mb) for s in row["stages"] for mb in range(m))
        for work in kinds.values():  # a full backward, or its two halves (zero bubble)
            assert sorted(work) in (["B", "F"], ["F", "I", "W"]), work


def test_1f1b_keeps_fewer_micro_batches_of_activations_alive_than_gpipe(runs):
    gpipe, one_f_one_b = (lesson.peak_activations(name(s), log_dir=runs) for s in ("gpipe", "1f1b"))
    # 4 micro-batches: GPipe holds all 4 before its first backward; 1F1B at most 2 on stage 0, 1 on stage 1
    assert (one_f_one_b / gpipe).tolist() == pytest.approx([2 / 4, 1 / 4], rel=0.02)


def test_recomputing_keeps_each_blocks_input_only_as_counted_by_hand(runs):
    """Each stage's peak is a whole number of micro-batches as counted by hand from the model's code
    (lessons/bylesson/recompute.py), without --recompute (s_1f1b) and with it (the 2 x 2 job, half
    the micro-batch): the meter sees what checkpoint keeps, and 1F1B keeps 2 and 1 in flight."""
    t = recompute.table(name("1f1b"), "pp2xdp2", log_dir=runs)
    assert lesson.layout("pp2xdp2", log_dir=runs)["recompute"] is True
    assert t["plain"]["in_flight"].tolist() == t["recompute"]["in_flight"].tolist() == [2, 1]
    assert (t["recompute"]["one_microbatch"] < t["plain"]["one_microbatch"] / 2).all()


def test_pipelines_side_by_side_split_the_batch_and_place_ranks(runs):
    rec = lesson.layout("pp2xdp2", log_dir=runs)
    assert rec["data_parallel"] == 2 and rec["pipeline_ranks"] == 2 and rec["microbatch_size"] == 4
    assert [(p["pipeline"], p["position"]) for p in rec["placement"]] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]


@pytest.mark.jobs("s")
def test_the_cut_picture_draws_the_stages_and_micro_batches_the_run_logged(runs):
    rec = lesson.layout("s_interleaved1f1b", log_dir=runs)
    fig = lesson.plot_cut("s_interleaved1f1b", "test_pp_cut", log_dir=runs)
    texts = [t.get_text() for t in fig.axes[0].texts]
    held = {s: p["rank"] for p in rec["placement"] for s in p["stages"]}
    assert [t for t in texts if t.startswith("stage ")] == [
        f"stage {s} on rank {held[s]}" for s in range(rec["stages"])
    ]
    assert rec["stages"] == 4 and held == {0: 0, 1: 1, 2: 0, 3: 1}  # looped: 2 stages a rank
    assert [str(k) for k in range(rec["microbatches"])] == [t for t in texts if t.isdigit()]
    assert f"of {rec['microbatch_size']} samples" in " ".join(texts)
    blocks = [t for t in texts if t.startswith("block ")]
    assert len(blocks) == rec["blocks"] and "stem" in texts and "head, loss" in texts


@pytest.mark.jobs("manual")
def test_the_manual_halves_wait_for_each_other(runs):
    log_dir = runs
    steps = lesson.steps("manual", log_dir=log_dir, first=True)
    for _, pair in steps.groupby("step"):
        by_rank = {rank: {e[1]: e for e in events} for rank, events in lesson.aligned(pair).items()}
        # rank 1's forward starts after rank 0's forward ended, rank 0's backward after rank 1's backward
        assert by_rank[1]["F"][3] >= by_rank[0]["F"][4]
        assert by_rank[0]["B"][3] >= by_rank[1]["B"][4]
    summary = report.read_run(log_dir / "manual.jsonl")["summary"]
    # that the halves learn is proven step by step against the whole model (the next test); 4 steps' losses
    # on 4 different batches need not fall
    assert summary["status"] == "finished"


@pytest.mark.jobs("manual")
def test_the_manual_halves_learn_step_by_step_what_the_whole_model_learns_in_one_process(runs):
    """Rank 1's loss at every step equals the loss of the same step of the whole model trained in this
    process (same seed, batches and Adadelta), in float64: within FLOAT64_ATOL, where a first half that
    got no gradient back moves the losses from step 2 on by about 1e-4 (its head alone learns)."""
    import argparse
    from trainup import data, models

    run = report.read_run(runs / "manual.jsonl")
    args = argparse.Namespace(**run["config"]["args"])
    logged = [
        r.loss
        for r in lesson.steps("manual", log_dir=runs, first=True).sort_values("step").itertuples()
        if r.rank == 1
    ]
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # as --precision 64 does in the script
    try:
        train_set, _ = data.load(args)
        torch.manual_seed(args.seed)
        model = models.BlockStack(train_set.shape, train_set.num_classes, args.blocks, args.width)
        optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
        order = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(args.seed))
        whole = []
        for n in range(args.steps):
            x, y = train_set[order[n * args.batch_size : (n + 1) * args.batch_size]]
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            whole.append(loss.item())
    finally:
        torch.set_default_dtype(dtype)
    assert len(logged) == args.steps == 4
    assert logged == pytest.approx(whole, rel=0, abs=ATOL)
    assert (
        abs(whole[-1] - whole[0]) > 1e3 * ATOL
    )  # the steps did move the model, far beyond the tolerance


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (4, 8), (3, 5)])
def test_the_ideal_schedule_has_the_theorys_bubble(schedule, p, m):
    """Equal stages (forward 1, backward 2) and free sends, laid out in the schedule's order: the bubble
    is (p-1)/(m+p-1), each micro-batch runs forward and backward once per rank, and no rank ever holds
    more micro-batches' activations than the schedule allows (GPipe m, 1F1B p - rank)."""
    if schedule == "1f1b" and m < p:
        return
    ranks = lesson.simulate(lesson.order(schedule, p, m), [1.0] * p, [2.0] * p)
    busy = sum(b - a for _, events in ranks.values() for *_, a, b in events)
    assert 1 - busy / (p * lesson.span(ranks)) == pytest.approx(lesson.theory(p, m), abs=1e-12)
    for r, (_, events) in ranks.items():
        assert sorted((k, mb) for _, k, mb, _, _ in events) == sorted(
            (k, i) for k in "BF" for i in range(m)
        )
        alive = held = 0
        for _, kind, *_ in events:
            alive += 1 if kind == "F" else -1
            held = max(held, alive)
        assert held == (m if schedule == "gpipe" else min(m, p - r))
    assert lesson.theory(2, 4, v=2) == pytest.approx(1 / 9)  # interleaved: (p-1)/(v*m+p-1)


def test_the_ideal_of_a_measured_step_is_no_longer_than_its_compute_allows(runs):
    """The ideal built from a real run's measured compute: every forward and backward of the step, and a
    span at least the busiest rank's compute."""
    for schedule in ("gpipe", "1f1b"):
        ideal, m = lesson.ideal_step(name(schedule), log_dir=runs)
        measured, _ = lesson.measured_step(name(schedule), log_dir=runs)
        assert m == 4 and sorted(ideal) == sorted(measured) == [0, 1]
        compute = max(sum(b - a for _, k, _, a, b in ev if k in "FB") for _, ev in ideal.values())
        assert compute <= lesson.span(ideal) + 1e-12 and len(ideal[0][1]) == 2 * m
    assert "ideal" in lesson.about_ideal([name("gpipe")], log_dir=runs)[0]


def test_bad_input_is_one_sentence_and_a_nonzero_exit(log_dir, monkeypatch, capsys):
    """Checked in this interpreter (main() stops before it starts a process group): seconds, not a new
    interpreter per case."""
    import _trainup_pipeline

    for k in [
        k
        for k in os.environ
        if k.startswith(("SLURM_", "TORCHELASTIC_", "OMPI_", "PMI_", "HOROVOD_"))
        or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    ]:
        monkeypatch.delenv(k)
    cases = [
        ([], ["--microbatches", "5"], ["--microbatches 5", "does not divide"]),
        ([], ["--blocks", "3", "--schedule", "zbv"], ["4 stages", "more than its --blocks 3"]),
        # a list is checked schedule by schedule before anyone waits: gpipe fits, zbv does not
        (
            ["RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0"],
            ["--blocks", "3", "--schedule", "gpipe,zbv"],
            ["--schedule zbv", "4 stages", "more than its --blocks 3"],
        ),
        ([], ["--schedule", "gpipe,fast"], ["--schedule", "unknown schedule 'fast'"]),
        ([], ["--schedule", "gpipe,1f1b", "--stages", "1"], ["several schedules", "--stages 1"]),
        ([], ["--recompute", "--split", "traced"], ["--recompute", "--split manual"]),
        ([], ["--recompute", "--stages", "1"], ["--recompute", "--stages 2 or more"]),
        ([], [], ["needs 2 processes", "has 1"]),
        (["RANK=0", "WORLD_SIZE=3", "LOCAL_RANK=0"], [], ["needs 2 processes", "has 3"]),
    ]
    for env, flags, words in cases:
        with monkeypatch.context() as m:
            for k, v in (e.split("=") for e in env):
                m.setenv(k, v)
            done = in_process(
                _trainup_pipeline.main, ["--quick", *flags, "--log-dir", log_dir], capsys
            )
        assert done.returncode == 2, flags
        assert_clean_error(done, *words)
    assert not log_dir.exists() or not list(log_dir.iterdir())  # nothing half-written


def test_a_v_schedule_over_gloo_on_a_torch_that_cannot_is_one_sentence(
    log_dir, monkeypatch, capsys
):
    """torch 2.11's pipelining sends to a V stage's neighbour on the same rank while warming up, and
    gloo refuses ("Pair is not connected", seen under torch 2.11): refused before anyone waits."""
    import _trainup_pipeline
    from trainup import devices

    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.setenv(k, {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}[k])
    monkeypatch.setattr(devices, "torch_release", lambda version=None: (2, 11))
    for schedule in ("zbv", "dualpipev", "1f1b,zbv"):
        done = in_process(
            _trainup_pipeline.main,
            ["--quick", "--schedule", schedule, "--log-dir", log_dir],
            capsys,
        )
        assert done.returncode == 2, schedule
        assert_clean_error(done, "needs torch 2.13 or newer over gloo", "Pair is not connected")
    assert not log_dir.exists() or not list(log_dir.iterdir())


def test_a_lesson_leaves_the_v_schedules_out_on_a_torch_that_cannot_run_them(monkeypatch, capsys):
    """Lessons 06 and 06b run the schedules schedules.runnable keeps: on a torch older than
    pipeline.V_OVER_GLOO (Colab's 2.11) every schedule but zbv and dualpipev, and one sentence
    saying why; on a newer one all of them, and nothing printed (the stored outputs stay)."""
    from trainup import devices

    names = list(pipeline.SCHEDULES)
    for release in ((2, 13), (2, 14), (3, 0)):
        monkeypatch.setattr(devices, "torch_release", lambda version=None, r=release: r)
        assert lesson.runnable(names) == names, release
        assert capsys.readouterr().out == ""
    monkeypatch.setattr(devices, "torch_release", lambda version=None: (2, 11))
    assert lesson.runnable(names) == [s for s in names if s not in ("zbv", "dualpipev")]
    said = capsys.readouterr().out.strip()
    assert len(said.splitlines()) == 1 and "zbv and dualpipev need torch 2.13" in said, said
    assert lesson.runnable(["1f1b", "dualpipev"]) == ["1f1b"]
    assert "dualpipev needs torch 2.13" in capsys.readouterr().out
    assert lesson.runnable(["gpipe", "1f1b"]) == ["gpipe", "1f1b"]
    assert capsys.readouterr().out == ""  # nothing to leave out, nothing said
    assert pipeline.runs_over_gloo("zbv", (2, 12)) is False
    assert pipeline.runs_over_gloo("interleaved_zb", (2, 11)) is True


@pytest.mark.parametrize(
    "flags,words",
    [
        (["--epochs", "3"], ["--epochs does not apply", "counts --steps"]),
        (["--dataset", "synthetic"], ["--dataset synthetic", "held in memory"]),
    ],
)
def test_the_manual_halves_refuse_flags_they_would_ignore(flags, words, log_dir, capsys):
    import _trainup_pipeline_manual

    done = in_process(
        _trainup_pipeline_manual.main, ["--quick", *flags, "--log-dir", log_dir], capsys
    )
    assert done.returncode == 2
    assert_clean_error(done, *words)


def test_zero_bubble_splits_backward_and_defers_w_and_looped_bfs_goes_breadth_first(runs):
    split = {
        s: zero_bubble.backward_split(name(s), log_dir=runs)
        for s in ("1f1b", "interleaved_zb", "zbv", "dualpipev")
    }
    assert (split["1f1b"].split_I_W == 0).all() and (split["dualpipev"].split_I_W > 0).any()
    for s in ("interleaved_zb", "zbv"):  # every backward split, some W moved into a later gap
        assert (split[s].whole_B == 0).all() and split[s].W_deferred.sum() > 0, split[s]
    assert zero_bubble.breadth_first(name("looped_bfs"), log_dir=runs)
    assert not zero_bubble.breadth_first(name("interleaved1f1b"), log_dir=runs)
    # the same two stages a rank: W deferred keeps activations longer, breadth first keeps them all
    mem = zero_bubble.memory(
        [name(s) for s in ("interleaved1f1b", "interleaved_zb", "looped_bfs")], log_dir=runs
    )
    one, zero, bfs = mem.activation_mb
    assert one < zero < bfs, mem


def test_a_w_before_its_i_or_a_missing_backward_is_caught(monkeypatch):
    monkeypatch.setattr(zero_bubble, "layout", lambda name, log_dir=None: {"schedule": "x"})
    orders = {
        "fine": [("F", 0, 0), ("I", 0, 0), ("F", 0, 1), ("W", 0, 0), ("B", 0, 1)],
        "w_first": [("F", 0, 0), ("W", 0, 0), ("I", 0, 0)],
        "no_backward": [("F", 0, 0), ("F", 0, 1), ("B", 0, 1)],
    }
    monkeypatch.setattr(zero_bubble, "order", lambda name, log_dir=None: {0: orders[name]})
    row = zero_bubble.backward_split("fine").iloc[0]
    assert (row.whole_B, row.split_I_W, row.W_deferred) == (1, 1, 1)
    for broken in ("w_first", "no_backward"):
        with pytest.raises(AssertionError, match="micro-batch 0"):
            zero_bubble.backward_split(broken)


def test_the_activation_meter_skips_the_weights_after_the_stage_moves():
    """A stage moved after it was cut (.to(device), here .to(float64): new storages either way) must
    not count the weights autograd saves as activations: one Block keeps its input, LayerNorm's
    output, its mean and 1/std, and ReLU's output, whatever the dtype."""
    import torch
    from trainup import models
    from trainup.parallel import pipeline as pl

    torch.manual_seed(0)
    model = models.BlockStack((1, 28, 28), 10, 2, 16)
    part = pl.cut(model, 1)[0]
    peaks = []
    for dtype in (torch.float32, torch.float64):
        part = part.to(dtype)
        part.meter.reset_peak()
        part(torch.zeros(4, 1, 28, 28, dtype=dtype)).sum()
        peaks.append(part.meter.step_peak / torch.tensor([], dtype=dtype).element_size())
    assert peaks[0] == peaks[1], peaks  # the same number of saved elements: no weights among them


def test_the_theory_of_too_few_micro_batches():
    """m < p cannot fill the loop: at m = 1 a rank idles (p-1)/p whatever v is (not (p-1)/(v+p-1));
    at m = p both expressions agree; m >= p is Megatron-LM's (p-1)/(v*m+p-1)."""
    assert lesson.theory(2, 1, v=2) == pytest.approx(0.5)
    assert lesson.theory(4, 1, v=2) == pytest.approx(0.75)
    for p, v in ((2, 2), (4, 2), (4, 3)):
        assert lesson.theory(p, p, v) == pytest.approx((p - 1) / (v * p + p - 1))
        assert lesson.theory(p, p - 1, v) > lesson.theory(p, p, v)
    assert lesson.theory(2, 1) == pytest.approx(0.5)
    assert lesson.theory(4, 8, v=2) == pytest.approx(3 / 19)


def test_the_bubble_sentences_give_a_side_only_where_every_step_lies_on_it():
    """Noisy steps: a side of the formula only when 3 steps or more all lie on it; never a cause."""
    import pandas as pd

    rows = [
        ("gpipe", 4, [0.25, 0.27, 0.29], 0.2),  # above
        ("gpipe", 8, [0.08, 0.13, 0.20], 0.111),  # spans
        ("gpipe", 16, [0.30, 0.31], 0.059),  # 2 steps only
        ("1f1b", 4, [0.10, 0.12, 0.15], 0.2),
    ]  # below
    t = pd.DataFrame(
        [
            dict(
                schedule=s,
                microbatches=m,
                bubbles=b,
                theory=th,
                measured=sorted(b)[len(b) // 2],
                lowest=min(b),
                highest=max(b),
                steps=len(b),
                imbalance=0.1,
                unexplained=0.05,
                samples_per_s=1.0,
            )
            for s, m, b, th in rows
        ]
    )
    said = lesson.about_bubble(t)
    assert "above it in every step" in said[0] and "do not put it above or below" in said[1]
    assert "do not put it above or below" in said[2] and "below it in every step" in said[3]
    assert not any("because" in s for s in said)
    sweep = lesson.about_sweep(t)
    assert "the formula within the steps' range at m = 8, 16" in sweep[0]
    assert "above the formula in every step at m = 4" in sweep[0]
    assert "too few steps" in sweep[0]  # m = 16 has 2 steps: a rise after m = 8 is not decided
    t.loc[2, "bubbles"] = [0.30, 0.31, 0.32]
    t.loc[2, "steps"] = 3
    assert "higher again at m = 16" in lesson.about_sweep(t)[0]
    both = lesson.compare_schedules(t, "gpipe", "1f1b")
    assert both == ["m = 4: gpipe's bubble 27% is above 1f1b's 12%"]


@pytest.mark.fast
def test_the_lesson_reads_the_runs_a_job_of_one_or_several_schedules_writes():
    """schedules.run reads back the runs the script names: <name>_<schedule> for a job of several
    schedules, <name> for a job of one (as runnable() may leave on an older torch)."""
    import argparse

    from trainup.parallel import pipeline_runs

    for schedules in (["gpipe"], ["gpipe", "1f1b", "zbv"]):
        job = argparse.Namespace(run_name="pp", schedules=schedules, microbatches=4)
        written = [a.run_name for a in pipeline_runs.runs(job)]
        assert lesson.run_names("pp", schedules) == written
    assert written == ["pp_gpipe", "pp_1f1b", "pp_zbv"]
