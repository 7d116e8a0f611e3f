"""The notebooks' checks (lessons.checks) fail on broken results, so nbval fails on them too.

Two real quick runs (module-scoped, about 10 s together): one that learns the digits, and one on random
images with random labels, which cannot do better than chance. Every other broken case is a copy of the
good log, edited by hand in a temporary folder.
"""

import json
import shutil

import pytest

from conftest import run_script


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("checks") / "logs"
    run_script(
        "_trainup_cpu.py", "--quick", "--threads", "1", "--run-name", "good", log_dir=log_dir
    )
    run_script(
        "_trainup_cpu.py",
        "--quick",
        "--threads",
        "1",
        "--dataset",
        "synthetic",
        "--run-name",
        "chance",
        log_dir=log_dir,
    )
    return log_dir


def records(log_dir, name):
    return [json.loads(line) for line in (log_dir / f"{name}.jsonl").read_text().splitlines()]


def write(log_dir, name, recs):
    (log_dir / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return name


def edited(runs, tmp_path, change):
    """A copy of the good run's log with change(records) applied, in a folder of its own."""
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    recs = records(runs, "good")
    change(recs)
    return write(log_dir, "broken", recs), log_dir


def test_a_good_run_passes(runs):
    from lessons import checks, report

    assert checks.finished("good", log_dir=runs)["summary"]["status"] == "finished"
    assert "test accuracy" in checks.learned("good", log_dir=runs)
    assert "the log follows the schema" in report.check("good", log_dir=runs)


def test_a_run_at_chance_fails_learned(runs):
    from lessons import checks

    checks.finished("chance", log_dir=runs)  # it ran to the end...
    with pytest.raises(AssertionError, match="not above"):
        checks.learned("chance", log_dir=runs)  # ...but learned nothing


def test_flat_loss_fails_learned(runs, tmp_path):
    from lessons import checks

    def flat(recs):
        for r in recs:
            if r["type"] == "epoch":
                r["loss"] = 2.30

    name, log_dir = edited(runs, tmp_path, flat)
    with pytest.raises(AssertionError, match="did not fall"):
        checks.learned(name, log_dir=log_dir)
    assert "test accuracy above" in checks.learned(name, log_dir=log_dir, loss_falls=False)


@pytest.mark.parametrize(
    "kind, field", [("epoch", "loss"), ("summary", "status"), ("env", "device"), ("config", "args")]
)
def test_a_missing_field_fails(runs, tmp_path, kind, field):
    from lessons import checks

    def drop(recs):
        next(r for r in recs if r["type"] == kind).pop(field)

    name, log_dir = edited(runs, tmp_path, drop)
    with pytest.raises(AssertionError, match=f"lacks '{field}'"):
        checks.finished(name, log_dir=log_dir)


@pytest.mark.parametrize(
    "kind, field, value",
    [
        ("epoch", "loss", "1.3"),
        ("epoch", "samples", 512.5),
        ("epoch", "test_accuracy", None),
        ("epoch", "loss", float("nan")),
        ("summary", "test_accuracy", "high"),
        ("env", "world_size", "1"),
        ("epoch", "epoch", True),
    ],
)
def test_a_wrong_type_fails(runs, tmp_path, kind, field, value):
    from lessons import checks

    def spoil(recs):
        next(r for r in recs if r["type"] == kind)[field] = value

    name, log_dir = edited(runs, tmp_path, spoil)
    with pytest.raises(AssertionError, match=f"'{field}' is"):
        checks.finished(name, log_dir=log_dir)


def test_an_unfinished_run_fails(runs, tmp_path):
    from lessons import checks

    name, log_dir = edited(runs, tmp_path, lambda recs: recs.pop())  # the summary was never written
    with pytest.raises(AssertionError, match="no 'summary' record"):
        checks.finished(name, log_dir=log_dir)
    with pytest.raises(AssertionError, match="no log"):
        checks.finished("never_ran", log_dir=log_dir)


def test_an_earlier_lessons_run_is_read_only_where_it_finished_in_this_mode(runs, tmp_path):
    """report.left_here: a lesson reads another lesson's run (04a2 reads 04a1's) only where it
    finished in the same mode and left its checkpoint; otherwise the lesson makes it again."""
    from lessons import report

    folders = dict(log_dir=runs, checkpoint_dir=tmp_path)
    assert report.left_here("good", checkpoint=False, quick=True, **folders)
    assert not report.left_here("good", checkpoint=False, quick=False, **folders)  # a full run
    assert not report.left_here("never_ran", checkpoint=False, quick=True, **folders)
    assert not report.left_here("good", quick=True, **folders)  # no checkpoint yet
    (tmp_path / "good.pt").write_bytes(b"")
    assert report.left_here("good", quick=True, **folders)
    name, log_dir = edited(runs, tmp_path, lambda recs: recs.pop())  # the summary never written
    assert not report.left_here(name, checkpoint=False, quick=True, log_dir=log_dir)


def test_a_line_that_is_not_json_fails(runs, tmp_path):
    from lessons import checks

    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    shutil.copy(runs / "good.jsonl", log_dir / "torn.jsonl")
    with open(log_dir / "torn.jsonl", "a") as f:
        f.write('{"type": "epoch", "lo')  # a run killed while writing
    with pytest.raises(AssertionError, match="not JSON"):
        checks.finished("torn", log_dir=log_dir)


def test_report_run_raises_when_the_log_is_broken(tmp_path, monkeypatch):
    """A script that exits 0 but leaves no finished log makes the notebook cell fail, not just print."""
    import lessons.report as report

    monkeypatch.setattr(report, "LOG_DIR", tmp_path)  # the script "ran" but wrote nothing there

    class Exited0:
        returncode = 0

    monkeypatch.setattr(report.jobs, "run", lambda *a, **k: Exited0())
    monkeypatch.setattr(report, "check", lambda name, log_dir: "(printed sentence)")
    with pytest.raises(AssertionError, match="no log"):
        report.run("_trainup_cpu.py", name="silent")


def test_sweep_checks(tmp_path):
    from lessons import checks

    base = [
        dict(
            type="config",
            run="s",
            time=1.0,
            schema_version=1,
            script="x.py",
            lesson="gpu",
            args=dict(sweep=[4, 16, 64]),
        ),
        dict(
            type="env",
            run="s",
            time=1.0,
            torch="2",
            python="3",
            host="h",
            platform="p",
            cpu_count=2,
            threads=1,
            device="cpu",
            gpus=[],
            cuda=None,
            world_size=1,
            backend="none",
        ),
    ]
    sweep = [
        dict(
            type="sweep",
            run="s",
            time=2.0,
            batch_size=b,
            steps=3,
            step_s=0.1,
            samples_per_s=b * 10.0,
            peak_mem_mb=1.0,
        )
        for b in (4, 16, 64)
    ]
    summary = [
        dict(
            type="summary",
            run="s",
            time=3.0,
            status="finished",
            epochs=0,
            loss=None,
            accuracy=None,
            test_accuracy=None,
            wall_s=1.0,
            samples_per_s=None,
            peak_mem_mb=1.0,
            checkpoint=None,
        )
    ]
    write(tmp_path, "s", base + sweep + summary)
    assert "3 batch sizes" in checks.swept("s", log_dir=tmp_path)
    write(tmp_path, "s", base + sweep[:1] + summary)  # stopped after the first batch size
    with pytest.raises(AssertionError, match="not the"):
        checks.swept("s", log_dir=tmp_path)
    sweep[1]["samples_per_s"] = 0.0
    write(tmp_path, "s", base + sweep + summary)
    with pytest.raises(AssertionError, match="no throughput"):
        checks.swept("s", log_dir=tmp_path)


def save_model(path, dtype="float64", **tensors):
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {"model": {k: torch.tensor(v, dtype=getattr(torch, dtype)) for k, v in tensors.items()}},
        path,
    )


def test_same_parameters(tmp_path):
    from lessons import checks

    save_model(tmp_path / "a.pt", w=[1.0, 2.0], b=[0.5])
    save_model(
        tmp_path / "b.pt", w=[1.0, 2.0 + 1e-12], b=[0.5]
    )  # float64 noise: within the proof's 1e-9
    save_model(
        tmp_path / "c.pt", w=[1.0, 2.0 + 1e-7], b=[0.5]
    )  # float32's noise is not: it fails in float64
    save_model(tmp_path / "d.pt", w=[1.0, 2.0], bias=[0.5])
    save_model(tmp_path / "e.pt", "float32", w=[1.0, 2.0], b=[0.5])
    assert checks.same_parameters("a", "b", checkpoint_dir=tmp_path) < checks.FLOAT64_ATOL
    with pytest.raises(AssertionError, match="different parameters"):
        checks.same_parameters("a", "c", checkpoint_dir=tmp_path)
    with pytest.raises(AssertionError, match="different models"):
        checks.same_parameters("a", "d", checkpoint_dir=tmp_path)
    with pytest.raises(AssertionError, match="no checkpoint"):
        checks.same_parameters("a", "missing", checkpoint_dir=tmp_path)
    with pytest.raises(AssertionError, match="float64 runs"):  # float32 cannot prove 1e-9
        checks.same_parameters("a", "e", checkpoint_dir=tmp_path)
    assert checks.same_parameters("a", "e", atol=1e-5, checkpoint_dir=tmp_path) == 0
    save_model(tmp_path / "f.pt", "float32", w=[1.0, 2.0], b=[0.5])
    save_model(tmp_path / "g.pt", "float32", w=[1.0, 2.0 + 2.0**-22], b=[0.5])  # one float32 ulp
    assert (
        checks.same_parameters("e", "f", atol=0, checkpoint_dir=tmp_path) == 0
    )  # bit for bit, any dtype
    with pytest.raises(AssertionError, match="different parameters"):
        checks.same_parameters("e", "g", atol=0, checkpoint_dir=tmp_path)
    assert checks.difference("a", "c", checkpoint_dir=tmp_path) == pytest.approx(1e-7)


def test_figure_checks(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from lessons import checks

    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    fig.savefig(tmp_path / "drawn.png")
    assert checks.figure(fig, "drawn", image_dir=tmp_path) is fig
    with pytest.raises(AssertionError, match="was not saved"):
        checks.figure(fig, "absent", image_dir=tmp_path)  # no PNG written
    (tmp_path / "zero.png").write_bytes(b"")
    with pytest.raises(AssertionError, match="was not saved"):
        checks.figure(fig, "zero", image_dir=tmp_path)  # an empty file
    (tmp_path / "text.png").write_text("not an image")
    with pytest.raises(AssertionError, match="not a PNG"):
        checks.figure(fig, "text", image_dir=tmp_path)
    empty, _ = plt.subplots()
    empty.savefig(tmp_path / "empty.png")
    with pytest.raises(AssertionError, match="hold no data"):
        checks.figure(empty, "empty", image_dir=tmp_path)  # axes drawn, nothing on them
    with pytest.raises(AssertionError, match="nothing was drawn"):
        checks.figure(None, "drawn", image_dir=tmp_path)
    plt.close("all")


def test_columns_and_holds():
    import pandas as pd
    from lessons import checks

    t = pd.DataFrame(dict(run=["a", "b"], samples_per_s=[1.0, None]))
    checks.columns(t, "run", rows=2)
    with pytest.raises(AssertionError, match="lacks column"):
        checks.columns(t, "speedup")
    with pytest.raises(AssertionError, match="missing values"):
        checks.columns(t, "samples_per_s")
    with pytest.raises(AssertionError, match="row"):
        checks.columns(t, "run", rows=3)
    assert checks.holds(True, "x") is None
    with pytest.raises(AssertionError, match="does not hold"):
        checks.holds(False, "the loss fell")


@pytest.mark.parametrize(
    "xs, ys, expected",
    [
        ([4, 16, 64], [[18, 19, 17], [62, 60, 63], [180, 176, 181]], "rises"),
        (
            [1, 2, 4, 8],
            [[100, 98, 101], [180, 170, 185], [240, 236, 250], [245, 230, 252]],
            "rises, then flattens",
        ),
        ([1, 2, 3], [[100, 90, 110], [103, 95, 108], [98, 92, 104]], "stays within the noise"),
        ([1, 2, 3], [2.3, 1.4, 0.9], "falls"),  # noise=0: exact values
        ([1, 2, 4], [[100, 99, 101], [154, 150, 156], [117, 114, 119]], "rises, then falls"),
        (
            [64, 4, 16],
            [[180] * 3, [18] * 3, [62] * 3],
            "rises",
        ),  # unsorted points sorted by x first
    ],
)
def test_trend_decides_a_direction_only_beyond_the_spread(xs, ys, expected):
    from lessons import claims

    noise = 0 if not isinstance(ys[0], list) else None
    assert claims.trend(xs, ys, noise=noise) == expected


def test_trend_refuses_a_direction_inside_the_noise():
    """A 1.54x gain that one run a point cannot separate from noise, and a fall of 24 % after a peak
    inside a 30 % noise floor, are not printed as directions."""
    from lessons import claims

    one_run = claims.trend([1, 2, 4], [100, 154, 150])
    assert one_run.startswith(claims.CANNOT_TELL) and not claims.decided(one_run)
    assert "1 run a point" in one_run
    two_runs = claims.trend([1, 2], [[100, 101], [154, 150]])
    assert not claims.decided(two_runs), "two runs a point are too few to measure a spread"
    # overlapping ranges: a 20 % gain of the medians inside the runs' spread
    assert claims.trend([1, 2], [[100, 70, 130], [120, 90, 150]]) == "stays within the noise"
    # a measured noise floor of 30 %: 1.54x rises, the 24 % fall after it does not count
    assert claims.trend([1, 2, 4], [100, 154, 117], noise=0.30) == "rises, then flattens"
    # without the floor the same numbers are undecided, never "stays flat"
    assert not claims.decided(claims.trend([1, 2, 4], [100, 154, 117]))


def test_curve_and_ratio():
    from lessons import claims

    assert claims.curve(
        [4, 64], [18, 180], "Throughput", "batch size", "samples/s", noise=0.1
    ).startswith(
        "Throughput rises with batch size: 18 samples/s at 4 and 180 samples/s at 64 (10.0× the first)"
    )
    said = claims.curve([4, 64], [18, 180], "Throughput", "batch size", "samples/s")
    assert said.startswith("Throughput with batch size: 18 samples/s at 4") and "noise" in said
    assert claims.ratio([183.7, 180, 185], [85.7, 86, 84]) == "2.1× faster"
    assert claims.ratio([85.7, 86, 84], [183.7, 180, 185]) == "2.1× slower"
    assert claims.ratio([100, 95, 108], [104, 98, 110]).startswith("about as fast")
    assert claims.ratio(183.7, 85.7, noise=0.1) == "2.1× faster"
    one_each = claims.ratio(183.7, 85.7)
    assert one_each.startswith("2.14× as fast") and not claims.decided(one_each)
    assert claims.compare([183.7] * 3, [85.7] * 3, "none") == "2.1× faster than none"
    assert claims.compare([100, 99, 101], [97, 96, 101], "none") == (
        "about as fast as none (1.03×, within the noise)"
    )
    assert claims.compare(100, 97, "none").startswith("1.03× as fast as none, but from 1 run each")
    with pytest.raises(ValueError):
        claims.ratio(0, 1)
    with pytest.raises(ValueError):
        claims.trend([1], [1])
    assert "one point only" in claims.curve([4], [18], "Throughput", "batch size")


def test_load_note():
    from lessons import claims

    assert claims.load(2, 5.0)[0] and "busy" in claims.load_note(2, 5.0)
    assert claims.load(2, 2.5)[0], "one threshold: a load average above the cores is busy"
    assert not claims.load(2, 2.0)[0] and "not overloaded" in claims.load_note(2, 2.0)
    assert "load average 1.0 on 4 cores" in claims.load_note(4, 1.0)


def test_the_load_note_counts_other_programs_not_the_notebooks_own_jobs():
    import subprocess
    import sys
    from lessons import claims

    if claims._busy_seconds() is None:
        pytest.skip("this OS has no /proc/stat: the note falls back to the load average")
    # each process spins 0.5 s of its own CPU time and prints it (so the check holds on a busy machine)
    spin = (
        "import time; t = time.process_time()\nwhile time.process_time() - t < 0.5: pass\n"
        "print(time.process_time())"
    )
    start = claims._busy_seconds()
    jobs = [
        subprocess.run([sys.executable, "-c", spin], capture_output=True, text=True)
        for _ in range(2)
    ]
    own = claims._busy_seconds()[1] - start[1]
    assert own >= sum(float(j.stdout) for j in jobs) - 0.02, (
        "a finished job's CPU time counts as ours"
    )
    start = claims._busy_seconds()
    other = subprocess.Popen(
        [sys.executable, "-c", spin + "; import time; time.sleep(2)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    cpu = float(other.stdout.readline())  # it has spun; not waited for: another program
    now = claims._busy_seconds()
    other.kill()
    other.wait()
    machine, own = now[0] - start[0], now[1] - start[1]
    assert machine - own >= cpu - 0.05, (
        f"a program busy on a core was not seen: {machine - own:.2f} s"
    )
    assert claims.others_busy(1, share=1.0) and not claims.others_busy(64, share=0.0)
    assert "other programs took 100 %" in claims.load_note(others=1.0)
    assert "quiet" in claims.load_note(64, others=0.0)


def test_every_run_records_the_load_and_the_note_reads_it(tmp_path):
    from lessons import claims
    from trainup import metrics

    env = metrics.environment("cpu")
    assert env["cores"] >= 1 and isinstance(env["load_start"], float)
    records = [
        dict(type="config", run="r", time=0, schema_version=1, script="x.py", lesson="01", args={}),
        dict(type="env", run="r", time=0, **{**env, "load_start": 0.5}),
        dict(
            type="summary",
            run="r",
            time=0,
            status="finished",
            epochs=0,
            loss=None,
            accuracy=None,
            test_accuracy=None,
            wall_s=1.0,
            samples_per_s=None,
            peak_mem_mb=1.0,
            checkpoint=None,
            load_end=3.5,
        ),
    ]
    records = json.loads(json.dumps(records))  # as the log holds them
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert all(not metrics.check_record(r) for r in records)
    assert (
        not metrics.check_record({**records[1], "load_start": "high"}) == []
    )  # checked where present
    busy, avg, n = claims.load(2, runs=["r"], log_dir=tmp_path)
    assert busy and avg == 3.5, "the highest load the run recorded, at its end"
    assert not claims.load(4, runs=["r"], log_dir=tmp_path)[0]


def test_published_figures_name_their_source():
    from lessons.bylesson import slurm

    assert "Strube" in slurm.published_source() and "2023" in slurm.published_source()
    table = slurm.published_scaling()
    assert set(table["gpus"]) == {1, 4, 16, 32, 64, 128}  # the six times the source published
    assert list(table["minutes"]) == [342.2, 89.3, 24.8, 13.2, 6.9, 4.8]  # from "342m11.864s" ...
    about = slurm.about_published(table)
    assert (
        "4 GPUs gave 3.8×" in about and "all-reducing" not in about
    )  # the source does not say why
    assert "256 per GPU from 1 to 4 GPUs; 128 per GPU from 16 to 128 GPUs" in about


def test_a_printed_diff_is_checked_for_the_lessons_lines():
    from lessons import launch

    diff = "--- a\n+++ b\n@@ -1 +1,2 @@\n-old line\n+    hvd.init()\n+    model = DDP(model)\n"
    launch.check_diff_adds(diff, "hvd.init()", "DDP(model")
    with pytest.raises(AssertionError, match="missing: old line"):
        launch.check_diff_adds(diff, "old line")  # removed, not added


def test_the_cores_note_says_what_the_cores_allow():
    import pandas as pd
    from lessons import claims, launch
    from lessons.bylesson import ddp

    note = ddp.cores_note(pd.DataFrame({"world_size": [1, 2, 2 * launch.cores()]}))
    assert (
        f"use {launch.cores()} CPU core(s), fewer than the {2 * launch.cores()} processes" in note
    )
    assert ("Other programs were running too" in note) == claims.others_busy()


def test_a_failed_job_raises_with_the_courses_sentence_first():
    """torchrun prints its ChildFailedError report after the worker's one sentence: the cell's error starts
    with the sentence (a real job: 2 processes cannot split a batch of 3)."""
    from lessons import launch, report

    out = (
        "error: --batch-size 3 is the global batch and cannot be split evenly over 2 processes\n"
        "E1124 torch.distributed.elastic... failed (exitcode: 2)\nTraceback (most recent call last):\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
    )
    assert str(report.failed("torchrun", out, 1)).splitlines()[0] == (
        "torchrun exited with status 1: --batch-size 3 is the global batch and cannot be split evenly over 2 processes"
    )
    with pytest.raises(RuntimeError) as failed:
        launch.run(
            "_trainup_ddp.py", "--device", "cpu", "--batch-size", 3, name="failed_probe", nproc=2
        )
    first = str(failed.value).splitlines()[0]
    assert (
        first.startswith("torchrun exited with status") and "cannot be split evenly over 2" in first
    ), first
