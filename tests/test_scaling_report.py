"""The scaling report (lessons/bylesson/scaling_report.py, lesson 10) and its proof
(lessons/bylesson/equivalence.py, lesson 10a): empty logs/, references only, a synthetic full set,
logs of older schema states, every equivalence row failing on a run that differs, float32 runs
skipped, the noise floor, and one real float64 pair end to end.

Only the command's test trains (a one-process run and a 2-rank DDP job, side by side), or
reads copies of notebook 10's pair where the session ran it; the others write small logs and
checkpoints in temporary folders, shaped as the scripts write them (logs/README.md).
"""

import dataclasses
import json
import math
import re
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import DAY, ROOT, SCRIPTS, finish_job, notebook_passed, start_job
from lessons import checks, launch
from lessons.bylesson import equivalence as eq
from lessons.bylesson import scaling_report as sr

ARGS = dict(
    dataset="digits",
    model="cnn",
    batch_size=64,
    epochs=2,
    lr=1.0,
    gamma=0.7,
    dropout=0.0,
    seed=1,
    train_size=512,
    test_size=256,
    image_shape=[1, 28, 28],
    num_classes=10,
    threads=1,
    precision="64",
)  # the proofs' runs are float64 (checks.PROOF)
STATE = {
    "conv.weight": torch.arange(12.0, dtype=torch.float64).reshape(3, 4),
    "fc.bias": torch.ones(5, dtype=torch.float64),
}
FLOAT32 = {k: v.float() for k, v in STATE.items()}
EQUIVALENCE_ROWS = [s for s in sr.STRATEGIES if s.baseline is not None]
# Notebook 10 makes a float64 pair and a noise pair (sr.ensure_pair): in a session that runs the
# notebook, the command's test reads copies of them (conftest runs this file after the others).
READS_NOTEBOOK = "notebooks/10_scaling_report.ipynb"


def write_run(
    log_dir,
    name,
    script,
    world_size=1,
    samples_per_s=100.0,
    peak_mem_mb=500.0,
    device="cpu",
    accuracies=(0.6, 0.8),
    state=None,
    checkpoint_dir=None,
    extra_args=None,
    extra_records=(),
    schema_version=1,
    time=1000.0,
    threads=1,
):
    """A finished run's log as the scripts write it; its checkpoint too when `state` is given."""
    log_dir.mkdir(parents=True, exist_ok=True)
    ckpt = None
    if state is not None:
        ckpt = (checkpoint_dir or log_dir / "checkpoints") / f"{name}.pt"
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"model": state, "epoch": 2}, ckpt)
    common = dict(run=name, time=time)
    records = [
        dict(
            type="config",
            schema_version=schema_version,
            script=script,
            lesson="x",
            args={**ARGS, **(extra_args or {})},
            **common,
        ),
        dict(
            type="env",
            torch="2.13.0",
            python="3.11",
            host="h",
            platform="p",
            cpu_count=2,
            threads=threads,
            device=device,
            gpus=["NVIDIA H100"] if device.startswith("cuda") else [],
            cuda=None,
            world_size=world_size,
            backend="gloo" if world_size > 1 else "none",
            **common,
        ),
        *extra_records,
    ]
    for epoch, acc in enumerate(accuracies, 1):
        records.append(
            dict(
                type="epoch",
                epoch=epoch,
                loss=2.0 / epoch,
                accuracy=acc,
                test_loss=1.0 / epoch,
                test_accuracy=acc,
                wall_s=512 / samples_per_s,
                samples=512,
                samples_per_s=samples_per_s,
                peak_mem_mb=peak_mem_mb,
                **common,
            )
        )
    last = accuracies[-1] if accuracies else None  # a sweep trains no epoch: its summary has nulls
    records.append(
        dict(
            type="summary",
            status="finished",
            epochs=len(accuracies),
            loss=2.0 / len(accuracies) if accuracies else None,
            accuracy=last,
            test_accuracy=last,
            wall_s=10.0,
            samples_per_s=samples_per_s if accuracies else None,
            peak_mem_mb=peak_mem_mb,
            checkpoint=str(ckpt) if ckpt else None,
            **common,
        )
    )
    (log_dir / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return name


def shifted(by, state=STATE):
    return {k: v + by for k, v in state.items()}


def report_main(capsys, *argv, command=sr):
    """The command (python -m lessons.bylesson.scaling_report; command=eq:
    lessons.bylesson.equivalence) in this
    process: its exit status, stdout and stderr."""
    code = command.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_registry_has_every_strategy_of_the_course():
    names = {s.name for s in EQUIVALENCE_ROWS}
    for must in (
        "DataParallel",
        "DDP, 1 rank",
        "DDP, 2 ranks",
        "DDP, 4 ranks",
        "DDP, no_sync accumulation",
        "Horovod",
        "Lightning DDP",
        "tensor parallel",
        *[f"pipeline {s}" for s in sr.PIPELINES],
        "elastic DDP (its world size changed)",
        "Ray Train (a worker killed, restarted)",
        "context parallel (ring attention)",
        "context parallel (ulysses attention)",
        "expert parallel",
        "torch.compile, one process",
        "DDP (compile script, eager)",
        "DDP + torch.compile",
        "4-D (pipeline x data x context x tensor parallel)",
    ):
        assert must in names
    assert sum(s.name.startswith("ZeRO-") for s in EQUIVALENCE_ROWS) == 4
    # one tolerance for all, float64's: no strategy carries a tolerance fitted to its float32 noise
    assert "atol" not in {f.name for f in dataclasses.fields(sr.Strategy)}
    assert eq.TOLERANCE == checks.FLOAT64_ATOL


def test_empty_logs(tmp_path, capsys):
    code, out, err = report_main(
        capsys, "--log-dir", tmp_path, "--checkpoint-dir", tmp_path / "c", "--no-figures"
    )
    assert code == 0 and not err
    first = out.splitlines()[0]
    assert (
        "no finished training run" in first
        and "bash run_course.sh" in first
        and "lessons.bylesson.scaling_report" in first
    )
    runs, left = sr.load(tmp_path)
    equal = eq.equivalence(runs, tmp_path)
    assert (
        runs == [] and len(equal) == len(EQUIVALENCE_ROWS) and set(equal["result"]) == {"skipped"}
    )
    assert all(equal["reason"].str.len() > 10)  # every skip says why
    assert (equal["tolerance"] == checks.FLOAT64_ATOL).all() and equal["noise_floor"].isna().all()
    assert "no noise floor was measured here" in eq.about_equivalence(equal)
    code, out, err = report_main(
        capsys, "--log-dir", tmp_path, "--checkpoint-dir", tmp_path / "c", command=eq
    )
    assert code == 0 and not err
    first = out.splitlines()[0]
    assert "no finished training run" in first and "lessons.bylesson.equivalence" in first
    header = next(line for line in out.splitlines() if line.split()[:1] == ["strategy"])
    assert header.split() == eq.EQUIVALENCE_COLUMNS


def test_references_only(tmp_path, capsys):
    ref = tmp_path / "reference" / f"h100_{DAY}"
    write_run(ref, "gpu_one", "_trainup_gpu.py", device="cuda:0", samples_per_s=5000)
    write_run(ref, "ddp_n2", "_trainup_ddp.py", world_size=2, device="cuda:0", samples_per_s=9000)
    runs, left = sr.load(tmp_path)
    missing = sr.what_is_missing(runs, left)
    assert f"only reference runs (h100_{DAY})" in missing and "run_course.sh" in missing
    table = sr.performance(runs)
    row = table.set_index("run").loc["ddp_n2"]
    assert (
        row.measured_on == f"h100_{DAY}"
        and row.hardware == "NVIDIA H100"
        and row.speedup == pytest.approx(1.8)
    )
    equal = eq.equivalence(runs, tmp_path / "checkpoints").set_index("strategy")
    assert (
        equal.loc["DDP, 2 ranks", "result"] == "skipped"
        and "no checkpoint" in equal.loc["DDP, 2 ranks", "reason"]
    )
    code, out, _ = report_main(
        capsys, "--log-dir", tmp_path, "--checkpoint-dir", tmp_path / "c", "--no-figures"
    )
    assert code == 0 and out.startswith("logs/ holds only reference runs") and "NVIDIA H100" in out


@pytest.fixture
def full_set(tmp_path):
    """One device and DDP with 1, 2 and 4 ranks here, float64 checkpoints a hair apart; one more on a GPU
    server."""
    for name, script, n, rate, mem, by in (
        ("one", "_trainup_gpu.py", 1, 100, 800, 0.0),
        ("d1", "_trainup_ddp.py", 1, 100, 800, 0.0),
        ("d2", "_trainup_ddp.py", 2, 180, 700, 1e-12),
        ("d4", "_trainup_ddp.py", 4, 320, 650, 2e-12),
    ):
        write_run(
            tmp_path, name, script, n, rate, mem, state=shifted(by), accuracies=(0.5, 0.7 + n / 100)
        )
    write_run(
        tmp_path / "reference" / f"a100_{DAY}",
        "r1",
        "_trainup_gpu.py",
        device="cuda:0",
        samples_per_s=4000,
    )
    return tmp_path


def test_synthetic_full_set(full_set):
    runs, left = sr.load(full_set)
    assert left == [] and sr.what_is_missing(runs) is None
    table = sr.performance(runs).set_index("run")
    checks.columns(table.reset_index(), *sr.COLUMNS, rows=5)
    assert table[sr.ACHIEVED].isna().all().all()  # these logs counted no FLOPs: empty, not zero
    assert (
        table.loc["d4", "strategy"] == "DDP, 4 ranks" and table.loc["d4", "per_device_batch"] == 16
    )
    assert table.loc["d4", "speedup"] == pytest.approx(3.2) and table.loc[
        "d4", "efficiency"
    ] == pytest.approx(0.8)
    assert (
        table.loc["d2", "baseline"] == "d1"
    )  # the same script's one-process run, when there is one
    equal = eq.equivalence(runs, full_set / "checkpoints").set_index("strategy")
    for n in (1, 2, 4):
        assert equal.loc[f"DDP, {n} rank{'s' * (n > 1)}", "result"] == "holds"
    assert equal.loc["DDP, 4 ranks", "largest_difference"] == pytest.approx(
        2e-12, rel=0.01
    )  # float64
    said = " ".join(sr.recommend(sr.performance(runs), equal.reset_index(), cores=8))
    # one run a strategy: which is fastest, or scales best, is said to be undecided
    assert "which strategy gives the most samples/s cannot be told from noise" in said
    assert "had the highest, 90% efficiency (strong scaling, 1.80x one device)" in said
    assert "from single runs, whether it is faster than one device cannot be told" in said
    # on a CPU resident memory is mostly torch itself: not a strategy's memory, not compared
    assert "needed the least" not in said and "mostly the torch library" in said
    assert (
        "Proven to train the one-process model here: DDP, 1 rank, DDP, 2 ranks, DDP, 4 ranks."
        in said
    )
    t, target, group = sr.time_to_accuracy(runs, target=0.7)
    assert (
        target == 0.7 and (t["epochs_needed"] == 2).all() and t["seconds"].is_monotonic_increasing
    )
    assert group.startswith("model cnn on digits (512 samples)")
    # 80 % by default: only the reference run reached it, and runs of two machines never mix
    one, target, group = sr.time_to_accuracy(runs)
    assert target == sr.TARGET == 0.8 and list(one["run"]) == ["r1"] and f"a100_{DAY}" in group
    assert sr.about_time(one, target, group).startswith(
        f"Of model cnn on digits (512 samples), measured on a100_{DAY}, only r1"
    )
    none, target, group = sr.time_to_accuracy([r for r in runs if r["name"] != "r1"])
    assert not len(none) and "No run of model cnn" in sr.about_time(none, target, group)
    fig = sr.scaling_plot(sr.performance(runs), "test_scaling_report")
    checks.figure(fig, "test_scaling_report")
    checks.figure(
        sr.resident_plot(
            sr.performance(runs), sr.model_sizes(runs, full_set), "test_scaling_memory"
        ),
        "test_scaling_memory",
    )
    checks.figure(sr.time_plot(t, target, "test_scaling_time"), "test_scaling_time")


def test_the_time_plot_shows_each_strategys_fastest_run_and_at_most_twenty(monkeypatch, tmp_path):
    import pandas as pd

    from lessons import report

    monkeypatch.setattr(sr, "save", lambda fig, name: None)
    rows = [dict(run=f"r{i}", strategy=f"s{i % 30}", seconds=float(i)) for i in range(190)]
    fig = sr.time_plot(pd.DataFrame(rows), 0.8)
    bars = fig.axes[0].patches
    assert len(bars) == sr.TIME_BARS == 20
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == [f"s{i}" for i in range(20)]  # the fastest of each, no run names
    assert fig.get_size_inches()[1] * report.DPI < 1500


def test_panels_side_by_side_keep_one_legend_each_line_named_once(monkeypatch, tmp_path):
    import matplotlib.pyplot as plt

    from lessons import report

    monkeypatch.setattr(report, "IMAGE_DIR", tmp_path)
    fig, (left, right) = plt.subplots(1, 2)
    for ax in (left, right):
        ax.plot([1, 2], [1, 2], label="DDP")
        ax.legend()
    other, (a, b) = plt.subplots(1, 2)
    a.plot([1, 2], [1, 2], label="only here")
    b.plot([1, 2], [1, 2], label="DDP")
    a.legend(), b.legend()
    report.save(fig, "two_panels"), report.save(other, "two_others")
    assert left.get_legend() is None and right.get_legend() is not None
    assert a.get_legend() is not None and b.get_legend() is not None  # under a, beside b


def test_logs_of_older_schema_states(tmp_path):
    # As the first commit (39a402e) wrote them: the four core records, nothing else; the CPU script's flags.
    write_run(tmp_path, "v1_first", "_trainup_cpu.py", extra_args={"num_processes": 1})
    # A resumed run: a second config and env, then epoch 2 again (the last one counts).
    write_run(tmp_path, "resumed", "_trainup_ddp.py", world_size=2, accuracies=(0.5, 0.6))
    lines = (tmp_path / "resumed.jsonl").read_text().splitlines()
    later = [json.loads(x) for x in lines[:2]] + [dict(json.loads(lines[3]), test_accuracy=0.75)]
    (tmp_path / "resumed.jsonl").write_text(
        "\n".join(lines[:-1] + [json.dumps(r) for r in later] + lines[-1:]) + "\n"
    )
    # Written by a newer lesson: a record type and a schema version this reader does not know.
    write_run(
        tmp_path,
        "newer",
        "_trainup_ddp.py",
        world_size=2,
        schema_version=2,
        extra_records=[dict(type="zero_shards", run="newer", time=1.0, shards=[1, 2])],
    )
    # A sweep (no epochs; summary loss null), a broken run (NaN loss) and a log that is not JSON: left out.
    write_run(tmp_path, "sweep", "_trainup_gpu.py", accuracies=())
    write_run(tmp_path, "nan", "_trainup_gpu.py")
    (tmp_path / "nan.jsonl").write_text(
        (tmp_path / "nan.jsonl").read_text().replace('"loss": 2.0,', '"loss": NaN,', 1)
    )
    (tmp_path / "garbage.jsonl").write_text("not json\n")
    runs, left = sr.load(tmp_path)
    got = {r["name"]: r for r in runs}
    assert set(got) == {"v1_first", "resumed", "newer"}
    assert got["v1_first"]["strategy"].name == "one process (CPU script)"
    assert [e["epoch"] for e in got["resumed"]["epochs"]] == [1, 2] and got["resumed"]["epochs"][1][
        "test_accuracy"
    ] == 0.75
    assert (
        got["newer"]["strategy"].name == "DDP, 2 ranks"
        and got["newer"]["extra"][0]["type"] == "zero_shards"
    )
    assert (
        "1 log(s) come from a schema newer than this reader's version 1 (newer)"
        in sr.about_schema(runs)
    )
    why = dict(left)
    assert (
        "no epoch" in why["sweep"]
        and "not a finite number" in why["nan"]
        and "not JSON" in why["garbage"]
    )
    table = sr.performance(runs).set_index("run")
    assert (
        table.loc["newer", "per_device_batch"] == 32
    )  # no 'ddp' record needed: global batch / world size


def _value(want):
    """A value that satisfies one `where` condition of the registry."""
    if callable(want):
        return next(v for v in (2, 4, 1) if want(v))
    return want[0] if isinstance(want, tuple) else want


def _as_run(where, world=2):
    """(script, world size, flags) of a run that the registry puts under this `where`."""
    flags = {k: _value(v) for k, v in where.items() if k not in ("script", "world_size", "devices")}
    world = _value(where.get("world_size", where.get("devices", world)))
    script = _value(where["script"])  # a tuple: one of the scripts
    if script in ("_trainup_dp.py", "_trainup_hogwild.py"):
        flags["num_processes" if script == "_trainup_hogwild.py" else "gpus"] = world
        world = 1
    return script, world, flags


@pytest.mark.parametrize("strategy", EQUIVALENCE_ROWS, ids=lambda s: s.name)
def test_every_equivalence_row_fails_on_a_run_that_differs(strategy, tmp_path, monkeypatch):
    """Each row holds for a float64 run equal to its baseline, and FAILS once one parameter moves 10 times
    the tolerance (float64's, the same for every row)."""
    monkeypatch.setattr(
        eq, "missing_need", lambda *a: None
    )  # its script and engine here or not (tested below)
    script, world, flags = _as_run(strategy.where)
    base_script, base_world, base_flags = _as_run(strategy.baseline, world=1)
    # an elastic job is one whose starts' 'ddp' records differ in world size (lesson 04c)
    starts = [dict(type="ddp", world_size=n) for n in (2, 1, 2)] if flags.pop("elastic", 0) else []
    base_flags.pop("elastic", None)
    logs, ckpt = tmp_path / "logs", tmp_path / "ckpt"
    write_run(
        logs,
        "base",
        base_script,
        base_world,
        state=STATE,
        checkpoint_dir=ckpt,
        extra_args=base_flags,
    )
    write_run(
        logs,
        "same",
        script,
        world,
        state=shifted(eq.TOLERANCE / 10),
        checkpoint_dir=ckpt,
        extra_args=flags,
        extra_records=starts,
    )
    runs, _ = sr.load(logs)
    assert {r["name"]: r["strategy"] for r in runs}["same"] is strategy

    def row():
        return eq.equivalence_row(strategy, sr.load(logs)[0], ckpt)

    assert row()["result"] == "holds", row()
    assert row()["tolerance"] == checks.FLOAT64_ATOL
    moved = dict(
        STATE,
        **{
            "fc.bias": STATE["fc.bias"]
            + torch.tensor([0, 0, 10 * eq.TOLERANCE, 0, 0], dtype=torch.float64)
        },
    )
    torch.save({"model": moved}, ckpt / "same.pt")
    failed = row()
    assert failed["result"] == "FAILS" and failed["largest_difference"] == pytest.approx(
        10 * eq.TOLERANCE, rel=1e-3
    )
    torch.save(
        {"model": {"other.weight": torch.zeros(2)}}, ckpt / "same.pt"
    )  # another model altogether
    assert row()["result"] == "FAILS" and math.isinf(row()["largest_difference"])


def test_what_cannot_be_compared_is_skipped_with_its_reason(tmp_path):
    ddp2 = next(s for s in sr.STRATEGIES if s.name == "DDP, 2 ranks")
    write_run(tmp_path, "base", "_trainup_gpu.py", state=STATE, extra_args={"dropout": 0.25})
    write_run(tmp_path, "drop", "_trainup_ddp.py", 2, state=STATE, extra_args={"dropout": 0.25})
    row = eq.equivalence_row(ddp2, sr.load(tmp_path)[0], tmp_path / "checkpoints")
    assert row["result"] == "skipped" and "dropout" in row["reason"]
    write_run(
        tmp_path, "drop", "_trainup_ddp.py", 2, state=STATE, extra_args={"seed": 2}
    )  # no same-seed baseline
    row = eq.equivalence_row(ddp2, sr.load(tmp_path)[0], tmp_path / "checkpoints")
    assert row["result"] == "skipped" and "no float64 one-process baseline" in row["reason"]
    lightning = next(s for s in sr.STRATEGIES if s.name == "Lightning DDP")
    assert "scripts/_trainup_lightning.py is not in the course yet" in eq.missing_need(
        lightning, tmp_path
    )


def test_float32_runs_are_skipped_with_their_difference(tmp_path):
    """A strategy whose runs are all float32 is not judged, even 1e-3 apart (more than float32's noise on
    some processors, less than a defect's): skipped with the reason, its float32 difference shown."""
    ddp2 = next(s for s in sr.STRATEGIES if s.name == "DDP, 2 ranks")
    f32 = {"precision": "32"}
    write_run(tmp_path, "base", "_trainup_gpu.py", state=FLOAT32, extra_args=f32)
    write_run(tmp_path, "two", "_trainup_ddp.py", 2, state=shifted(1e-3, FLOAT32), extra_args=f32)
    row = eq.equivalence_row(ddp2, sr.load(tmp_path)[0], tmp_path / "checkpoints")
    assert row["result"] == "skipped" and row["precision"] == "32"
    assert (
        "are float32" in row["reason"]
        and "summation noise" in row["reason"]
        and "--precision 64" in row["reason"]
    )
    assert row["largest_difference"] == pytest.approx(1e-3, rel=1e-3) and "two~base" in row["pairs"]
    # the same runs in float64 are judged, and fail: the skip came from the precision, nothing else
    write_run(tmp_path, "base", "_trainup_gpu.py", state=STATE)
    write_run(tmp_path, "two", "_trainup_ddp.py", 2, state=shifted(1e-3))
    assert (
        eq.equivalence_row(ddp2, sr.load(tmp_path)[0], tmp_path / "checkpoints")["result"]
        == "FAILS"
    )


def test_noise_floor_from_a_noise_pair(tmp_path):
    """The noise floor is the difference of two one-process runs that differ only in their CPU threads,
    shown in every row and the sentence; NaN with the reason while there is no such pair."""
    ckpt = tmp_path / "checkpoints"
    write_run(tmp_path, "one", "_trainup_gpu.py", state=STATE)
    write_run(tmp_path, "two", "_trainup_ddp.py", 2, state=shifted(1e-12))
    # the same run with 2 threads but another seed: not a noise pair (its training differs)
    write_run(
        tmp_path,
        "one_seed2",
        "_trainup_gpu.py",
        state=shifted(3e-13),
        threads=2,
        extra_args={"seed": 2},
    )
    # a float32 pair: not the floor of the float64 proof
    write_run(tmp_path, "f32_t1", "_trainup_gpu.py", state=FLOAT32, extra_args={"precision": "32"})
    write_run(
        tmp_path,
        "f32_t2",
        "_trainup_gpu.py",
        state=shifted(1e-5, FLOAT32),
        threads=2,
        extra_args={"precision": "32"},
    )
    runs = sr.load(tmp_path)[0]
    floor, why = eq.noise_floor(runs, checkpoint_dir=ckpt)
    assert (
        math.isnan(floor)
        and "no two one-process float64 runs here differ only in their CPU threads" in why
    )
    equal = eq.equivalence(runs, ckpt).set_index("strategy")
    ddp2 = equal.loc["DDP, 2 ranks"]
    assert (
        ddp2["result"] == "holds"
        and math.isnan(ddp2["noise_floor"])
        and "no noise floor" in ddp2["reason"]
    )
    assert "no noise floor was measured here" in eq.about_equivalence(equal.reset_index())
    assert eq.noise_floor(runs, "32", ckpt)[0] == pytest.approx(
        1e-5, rel=0.05
    )  # float32's own pair
    write_run(
        tmp_path, "one_t2", "_trainup_gpu.py", state=shifted(3e-13), threads=2
    )  # the noise pair
    runs = sr.load(tmp_path)[0]
    assert [(a["name"], b["name"]) for a, b in eq.noise_pairs(runs, checkpoint_dir=ckpt)] == [
        ("one", "one_t2")
    ]
    floor, why = eq.noise_floor(runs, checkpoint_dir=ckpt)
    assert floor == pytest.approx(3e-13, rel=0.01) and "one~one_t2" in why
    equal = eq.equivalence(runs, ckpt)
    assert (
        equal["noise_floor"] == floor
    ).all() and "noise floor measured here is 3e-13" in eq.about_equivalence(equal)
    ddp2 = equal.set_index("strategy").loc["DDP, 2 ranks"]
    assert (
        ddp2["result"] == "holds" and "noise" not in ddp2["reason"] and "two~one " in ddp2["pairs"]
    )
    # the same run with its batch cut in two micro-batches (--accumulate 2) is a noise pair too; a run
    # that differs in both threads and micro-batches is not (it could not tell which moved it)
    write_run(tmp_path, "d1", "_trainup_ddp_tuned.py", state=STATE)
    write_run(
        tmp_path,
        "d1_other",
        "_trainup_ddp_tuned.py",
        state=shifted(1e-6),
        threads=2,
        extra_args={"accumulate": 2},
    )
    assert len(eq.noise_pairs(sr.load(tmp_path)[0], checkpoint_dir=ckpt)) == 1
    write_run(
        tmp_path,
        "d1_other",
        "_trainup_ddp_tuned.py",
        state=shifted(5e-13),
        extra_args={"accumulate": 2},
    )
    runs = sr.load(tmp_path)[0]
    pairs = {(a["name"], b["name"]) for a, b in eq.noise_pairs(runs, checkpoint_dir=ckpt)}
    assert pairs == {("one", "one_t2"), ("d1", "d1_other")}
    assert eq.noise_floor(runs, checkpoint_dir=ckpt)[0] == pytest.approx(
        5e-13, rel=0.01
    )  # the largest


def test_only_like_with_like_is_compared(tmp_path):
    """A one-device row has speedup 1; a job whose one-device run did other work (instruments on, other
    threads, precision or model size) gets no baseline; an efficiency above 120 % is never claimed."""
    write_run(tmp_path, "one", "_trainup_gpu.py", samples_per_s=100, time=1)
    write_run(tmp_path, "one_older", "_trainup_gpu.py", samples_per_s=150, time=0)
    write_run(tmp_path, "fair", "_trainup_ddp.py", world_size=2, samples_per_s=180)
    mismatched = {
        "monitored": dict(extra_args={"monitor": True}),
        "profiled": dict(extra_args={"profile": 2}),
        "threads2": dict(threads=2),
        "float32": dict(extra_args={"precision": "32"}),
        "wider": dict(extra_args={"model": "blocks", "blocks": 4, "width": 64}),
    }
    for name, how in mismatched.items():
        write_run(tmp_path, name, "_trainup_ddp.py", world_size=2, samples_per_s=180, **how)
    write_run(
        tmp_path, "too_good", "_trainup_ddp.py", world_size=2, samples_per_s=260
    )  # 130 % efficiency
    write_run(
        tmp_path,
        "tp",
        "_trainup_tp.py",
        world_size=2,
        extra_args={"blocks": 2, "width": 32, "hidden": 64},
    )
    runs, _ = sr.load(tmp_path)
    table = sr.performance(runs).set_index("run")
    assert table.loc["one", "speedup"] == 1 and table.loc["one_older", "speedup"] == 1
    assert table.loc["fair", "baseline"] == "one" and table.loc[
        "fair", "efficiency"
    ] == pytest.approx(0.9)
    for name in [*mismatched, "too_good"]:
        assert not isinstance(table.loc[name, "baseline"], str) and math.isnan(
            table.loc[name, "speedup"]
        ), name
    assert (
        table.loc["tp", "model"] == "feed-forward 2x32, hidden 64"
    )  # not the unused --model default
    said = " ".join(sr.recommend(table.reset_index(), cores=8))
    assert "on 2: 90% efficiency" in said and "130%" not in said
    assert "job(s) on several devices had no one-device run doing the same work" in said


def test_a_baseline_matches_every_flag_that_changes_the_work(tmp_path):
    """A job's one-device run is its own script's (or the one its strategy declares, DDP's: the
    one-device script) with the same strategy flags, data size, device, precision and batch; a job
    with none gets no speedup, said in words, and no sentence ranks it."""
    fsdp = "_trainup_fsdp.py"
    # ZeRO-2 by hand on one process: fast here, and never DDP's baseline
    write_run(tmp_path, "zero2_one", fsdp, samples_per_s=90, extra_args={"shard": "gradients"})
    write_run(
        tmp_path, "ddp_two", fsdp, world_size=2, samples_per_s=188, extra_args={"shard": "none"}
    )
    write_run(
        tmp_path,
        "zero2_two",
        fsdp,
        world_size=2,
        samples_per_s=100,
        extra_args={"shard": "gradients"},
    )
    # lesson 04's scripts: a one-device run with other data, device, accumulation or batch
    write_run(
        tmp_path, "one_small", "_trainup_gpu.py", samples_per_s=100, extra_args={"train_size": 256}
    )
    write_run(tmp_path, "one_gpu", "_trainup_gpu.py", samples_per_s=100, device="cuda:0")
    write_run(
        tmp_path,
        "one_acc",
        "_trainup_ddp_tuned.py",
        samples_per_s=100,
        extra_args={"accumulate": 2},
    )
    write_run(
        tmp_path, "one_b48", "_trainup_gpu.py", samples_per_s=100, extra_args={"batch_size": 48}
    )
    write_run(tmp_path, "ddp", "_trainup_ddp.py", world_size=2, samples_per_s=180)
    write_run(
        tmp_path,
        "tuned_acc",
        "_trainup_ddp_tuned.py",
        world_size=2,
        samples_per_s=150,
        extra_args={"accumulate": 2},
    )
    runs, _ = sr.load(tmp_path)
    table = sr.performance(runs).set_index("run")
    # plain DDP of the sharding script: only a shard-none one-process run would do; there is none
    assert not isinstance(table.loc["ddp_two", "baseline"], str)
    assert math.isnan(table.loc["ddp_two", "speedup"])
    assert table.loc["ddp_two", "no_speedup"] == sr.UNMATCHED
    # ZeRO-2 on 2 against ZeRO-2 on 1: the same work, compared
    assert table.loc["zero2_two", "baseline"] == "zero2_one"
    assert table.loc["zero2_two", "speedup"] == pytest.approx(100 / 90)
    # DDP on the CPU, 512 samples, batch 64: none of the one-device runs did that work
    assert not isinstance(table.loc["ddp", "baseline"], str) and math.isnan(
        table.loc["ddp", "speedup"]
    )
    # accumulation against accumulation: the tuned script's own one-process run
    assert table.loc["tuned_acc", "baseline"] == "one_acc"
    said = " ".join(sr.recommend(table.reset_index(), cores=8))
    assert (
        "ddp_two" not in said and "188" not in said and "2 job(s) on several devices had no" in said
    )
    # the same run again, now with its true baseline: compared
    write_run(tmp_path, "ddp_one", fsdp, samples_per_s=100, extra_args={"shard": "none"})
    write_run(tmp_path, "one", "_trainup_gpu.py", samples_per_s=120)
    again = sr.performance(sr.load(tmp_path)[0]).set_index("run")
    assert again.loc["ddp_two", "baseline"] == "ddp_one"
    assert again.loc["ddp_two", "efficiency"] == pytest.approx(0.94)
    assert again.loc["ddp", "baseline"] == "one"  # DDP's declared baseline, the one-device script


def test_throughput_is_steady_state(tmp_path):
    """The report's samples/s leaves the first epoch out (report.steady_rate), as every lesson does."""
    write_run(tmp_path, "one", "_trainup_gpu.py", samples_per_s=100, accuracies=(0.5, 0.6, 0.7))
    path = tmp_path / "one.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    lines[2]["wall_s"] = 51.2  # the first epoch: start-up, 10 samples/s
    lines[-1]["samples_per_s"] = 3 * 512 / (51.2 + 2 * 5.12)  # a whole-run number, not used
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    table = sr.performance(sr.load(tmp_path)[0]).set_index("run")
    assert table.loc["one", "samples_per_s"] == pytest.approx(100)


def test_strong_and_weak_scaling_each_against_its_own_one_device_run(tmp_path):
    """Strong scaling: the one-device run did the same global batch; weak scaling: it did the per-device
    batch (each device the work one did); a job with neither has no speedup."""
    write_run(tmp_path, "one64", "_trainup_gpu.py", samples_per_s=100)
    write_run(
        tmp_path, "strong", "_trainup_ddp.py", world_size=2, samples_per_s=180
    )  # 64 shared by 2
    write_run(
        tmp_path,
        "weak",
        "_trainup_ddp.py",
        world_size=2,
        samples_per_s=190,
        extra_args={"batch_size": 128},
    )  # 64 on each of 2
    write_run(
        tmp_path,
        "neither",
        "_trainup_ddp.py",
        world_size=2,
        samples_per_s=190,
        extra_args={"batch_size": 96},
    )
    runs, _ = sr.load(tmp_path)
    table = sr.performance(runs).set_index("run")
    assert table.loc["one64", "scaling"] == "strong" and table.loc["one64", "speedup"] == 1
    assert (table.loc["strong", "baseline"], table.loc["strong", "scaling"]) == ("one64", "strong")
    assert (table.loc["weak", "baseline"], table.loc["weak", "scaling"]) == ("one64", "weak")
    assert table.loc["weak", "efficiency"] == pytest.approx(0.95)
    assert not isinstance(table.loc["neither", "scaling"], str) and math.isnan(
        table.loc["neither", "speedup"]
    )
    # a one-device run made on a busy machine (load average above its cores) is no baseline
    write_run(tmp_path, "busy64", "_trainup_ddp.py", samples_per_s=50, time=2000.0)
    busy = tmp_path / "busy64.jsonl"
    busy.write_text(
        busy.read_text().replace(
            '"world_size": 1,', '"world_size": 1, "cores": 2, "load_start": 3.5,'
        )
    )
    again = sr.performance(sr.load(tmp_path)[0]).set_index("run")
    assert again.loc["weak", "baseline"] == "one64" and again.loc["busy64", "speedup"] == 1
    said = sr.about_scaling(table.reset_index())
    assert (
        said.startswith("1 job(s) on several devices measured as strong scaling")
        and "and 1 as weak" in said
    )
    assert "weak scaling, efficiency 95%" in sr.about_weak(table.reset_index(), "weak")
    assert table.loc["neither", "no_speedup"] == sr.UNMATCHED and not isinstance(
        table.loc["weak", "no_speedup"], str
    )
    with pytest.raises(AssertionError, match="not measured as weak scaling"):
        sr.about_weak(table.reset_index(), "neither")
    assert sr.comparable(table.reset_index(), "strong", "strong")
    with pytest.raises(AssertionError, match="not measured as strong scaling: it is weak"):
        sr.comparable(table.reset_index(), "weak", "strong")
    # the machine's doing is said, not failed: the only one-device run busy, or one slower than its work
    one64 = tmp_path / "one64.jsonl"
    one64.write_text(
        one64.read_text().replace(
            '"world_size": 1,', '"world_size": 1, "cores": 2, "load_start": 3.5,'
        )
    )
    (tmp_path / "busy64.jsonl").unlink()
    disturbed = sr.performance(sr.load(tmp_path)[0])
    assert disturbed.set_index("run").loc["weak", "no_speedup"] == sr.BUSY
    assert not sr.comparable(disturbed, "strong", "strong")  # said, not failed
    assert "no efficiency this time: its one-device run was made on a busy" in sr.about_weak(
        disturbed, "weak"
    )
    write_run(tmp_path, "slow64", "_trainup_gpu.py", samples_per_s=60)  # 190 / 60 / 2: 158 %
    slowed = sr.performance(sr.load(tmp_path)[0]).set_index("run")
    assert slowed.loc["weak", "no_speedup"] == sr.IMPLAUSIBLE and math.isnan(
        slowed.loc["weak", "speedup"]
    )
    checks.figure(sr.scaling_plot(table.reset_index(), "test_scaling_weak"), "test_scaling_weak")


def _shard_memory(n, mb):
    b = int(mb * 2**20)
    return dict(
        type="shard_memory",
        run="x",
        time=1.0,
        shard="none",
        world_size=n,
        parameters=1,
        param_bytes=[b] * n,
        grad_bytes=[b] * n,
        optim_bytes=[2 * b] * n,
        expected_bytes=[b, b, 2 * b],
    )


def test_memory_comes_from_the_lessons_own_records(tmp_path):
    """Bytes of parameters, gradients and optimizer state (lesson 09's records) and activations (lesson
    06's): the recommendation compares those, never the process's resident memory on a CPU."""
    blocks = {"model": "blocks", "blocks": 2, "width": 32}
    write_run(
        tmp_path,
        "s1",
        "_trainup_fsdp.py",
        extra_args={**blocks, "shard": "none"},
        extra_records=[_shard_memory(1, 1.0)],
        peak_mem_mb=700,
    )
    write_run(
        tmp_path,
        "s2",
        "_trainup_fsdp.py",
        world_size=2,
        extra_args={**blocks, "shard": "parameters"},
        extra_records=[_shard_memory(2, 0.5)],
        peak_mem_mb=650,
    )
    step = dict(
        type="pipe_step",
        run="x",
        time=1.0,
        epoch=1,
        step=1,
        microbatches=2,
        rank=0,
        stages=[0],
        step_s=0.1,
        events=[],
        peak_activation_bytes=[3 * 2**20],
    )
    write_run(
        tmp_path,
        "pp",
        "_trainup_pipeline.py",
        world_size=2,
        extra_args={**blocks, "stages": 2},
        extra_records=[step, {**step, "rank": 1, "peak_activation_bytes": [2**20]}],
    )
    runs, _ = sr.load(tmp_path)
    mem = sr.memory_records(runs)
    by = mem.set_index(["run", "part"])["mb"]
    assert by[("s1", "optimizer state")] == 2 and by[("s2", "parameters")] == 0.5
    assert by[("pp", "activations")] == 3 and ("pp", "parameters") not in by
    said = " ".join(sr.recommend(sr.performance(runs), cores=8, mem=mem))
    assert (
        "ZeRO-3 / FSDP (shard parameters) (not proven to train the same model) on 2 held the least per "
        "device (2 MB against 4 MB on one device)" in said
    ), said
    assert "resident memory is not compared on a CPU" in said
    checks.figure(sr.memory_plot(mem, "test_scaling_memory_parts"), "test_scaling_memory_parts")


# ------------------------------------------------------------------- one real pair, the command end to end

TINY = [
    "--quick",
    "--device",
    "cpu",
    "--batch-size",
    64,
    "--dropout",
    0,
    "--no-progress",
    *checks.PROOF,
]


@pytest.fixture(scope="module")
def real_pair(tmp_path_factory, request):
    """One process with the whole batch and 2 DDP ranks with half each, in float64, and a noise
    pair: copies of notebook 10's where this session ran it (the test alters a checkpoint), else
    its own. The folder, and the 2-rank run's name."""
    logs = tmp_path_factory.mktemp("report") / "logs"
    if notebook_passed(request, READS_NOTEBOOK):
        (logs / "ckpt").mkdir(parents=True)
        for name, *_ in (*sr.PAIR, *sr.NOISE_PAIR):
            moved = shutil.copy(ROOT / "checkpoints" / f"{name}.pt", logs / "ckpt")
            lines = [json.loads(line) for line in (ROOT / "logs" / f"{name}.jsonl").open()]
            for r in lines:  # the log names its checkpoint: the copy's, which the test alters
                if r["type"] == "summary":
                    r["checkpoint"] = str(moved)
            (logs / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        return logs, sr.PAIR[1][0]
    return own_pair(logs), "two"


def own_pair(logs):
    """The pair, side by side; the noise pair's second run: the one process with 2 CPU threads."""
    out = ["--log-dir", logs, "--checkpoint-dir", logs / "ckpt"]
    one = [sys.executable, str(SCRIPTS / "_trainup_gpu.py"), *TINY, *out, "--run-name"]
    cmds = [
        one + ["one", "--threads", 1],
        one + ["one_t2", "--threads", 2],
        launch.TORCHRUN
        + launch.torchrun_flags(nproc=2)
        + [str(SCRIPTS / "_trainup_ddp.py"), *TINY, "--threads", 1, "--run-name", "two", *out],
    ]
    jobs = [start_job([str(c) for c in cmd], launch.environment()) for cmd in cmds]
    for job in jobs:
        done = finish_job(job)
        assert done.returncode == 0, done.stderr[-3000:]
    return logs


def test_the_command_on_a_real_pair(real_pair, capsys):
    """Lesson 10a's command, as docs/lessons.md gives it, finds the float64 pair and the row holds,
    within the tolerance, with a noise floor from the threads pair far below it; once the 2-rank job's
    checkpoint moves by 10 times the tolerance, the same command (in this process, to save an
    interpreter) says FAILS and exits 1 with one sentence. Lesson 10's command reads the same runs."""
    real_pair, two = real_pair
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lessons.bylesson.equivalence",
            "--log-dir",
            str(real_pair),
            "--checkpoint-dir",
            str(real_pair / "ckpt"),
        ],
        cwd=ROOT / "scripts",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    row = next(
        line
        for line in proc.stdout.splitlines()
        if line.strip().startswith("DDP, 2 ranks") and "holds" in line
    )
    largest, floor, tolerance = map(float, row.split()[3:6])  # after the strategy's 3 words
    assert tolerance == checks.FLOAT64_ATOL and largest <= tolerance
    assert (
        floor <= tolerance / 1000
    )  # float64 summation noise (about 1e-16), far below the tolerance
    assert f"noise floor measured here is {floor:.0e}" in proc.stdout
    code, out, err = report_main(
        capsys, "--log-dir", real_pair, "--checkpoint-dir", real_pair / "ckpt", "--no-figures"
    )
    assert code == 0 and not err and any(line.split()[:1] == [two] for line in out.splitlines())
    state = torch.load(real_pair / "ckpt" / f"{two}.pt", weights_only=True)
    first = next(iter(state["model"]))
    assert state["model"][first].dtype == torch.float64  # --precision 64 reached the checkpoint
    state["model"][first] = (
        state["model"][first] + 10 * checks.FLOAT64_ATOL
    )  # the 2-rank job now ends elsewhere
    torch.save(state, real_pair / "ckpt" / f"{two}.pt")
    code, out, err = report_main(
        capsys, "--log-dir", real_pair, "--checkpoint-dir", real_pair / "ckpt", command=eq
    )
    failed = next(
        line
        for line in out.splitlines()
        if line.strip().startswith("DDP, 2 ranks") and "FAILS" in line
    )
    assert code == 1 and float(failed.split()[3]) == pytest.approx(
        10 * checks.FLOAT64_ATOL, rel=1e-3
    )
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_the_lessons_pair_is_made_again_unless_float64(tmp_path):
    """Notebook 10 keeps its pair and noise pair from an earlier run only when they were made as asked now:
    float64, the same accumulation; a float32 pair of an older course is made again."""
    ckpt = tmp_path / "checkpoints"
    (name, _, _, flags), (acc_name, _, _, acc_flags) = sr.PAIR[0], sr.NOISE_PAIR[1]
    assert list(sr.PAIR_FLAGS[-2:]) == list(checks.PROOF) and list(acc_flags) == ["--accumulate", 2]
    write_run(tmp_path, name, "_trainup_gpu.py", state=STATE, checkpoint_dir=ckpt)
    write_run(
        tmp_path,
        acc_name,
        "_trainup_ddp_tuned.py",
        state=STATE,
        checkpoint_dir=ckpt,
        extra_args={"accumulate": 2},
    )
    assert sr._made(name, flags, tmp_path, ckpt) and sr._made(acc_name, acc_flags, tmp_path, ckpt)
    assert not sr._made(acc_name, flags, tmp_path, ckpt)  # the whole batch was asked for
    assert sr._made(acc_name, acc_flags, tmp_path, ckpt, "_trainup_ddp_tuned.py")
    assert not sr._made(
        acc_name, acc_flags, tmp_path, ckpt, "_trainup_ddp.py"
    )  # made by another script
    write_run(
        tmp_path,
        name,
        "_trainup_gpu.py",
        state=FLOAT32,
        checkpoint_dir=ckpt,
        extra_args={"precision": "32"},
    )
    assert not sr._made(name, flags, tmp_path, ckpt)


def _solution(name="10_scaling_report"):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        f"solution_{name}", ROOT / "notebooks" / "solutions" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_exercises_10(full_set):
    s = _solution()
    assert s.serial_fraction(2.0, 2) == 0 and s.serial_fraction(1.0, 4) == pytest.approx(1.0)
    assert s.predicted_speedup(s.serial_fraction(1.6, 2), 2) == pytest.approx(1.6)
    assert s.predicted_speedup(0.25, 8) == pytest.approx(1 / (0.25 + 0.75 / 8))
    s = _solution("10a_same_model")  # lesson 10a's exercises: the proof's registry and its noise
    row = s.with_ddp8(full_set, full_set / "checkpoints")
    assert row["result"] == "skipped" and "no run of it" in row["reason"]
    write_run(
        full_set, "d8", "_trainup_ddp.py", 8, state=STATE
    )  # now there is one, equal to the baseline
    assert s.with_ddp8(full_set, full_set / "checkpoints")["result"] == "holds"
    assert 0 < s.reorder_gap(draws=50) < 1e-6  # float32: far above float64's tolerance
    assert s.reorder_gap(draws=50, dtype=torch.float64) < checks.FLOAT64_ATOL / 1000


def test_the_course_command_ends_with_the_report():
    """run_course.sh executes notebooks/[0-9]*.ipynb in order: the report (10, then its proof and
    recommendation, 10a) comes after every training run; only lessons 11 to 11b follow it, and they
    train nothing (11's one job is lesson 04a1's all-reduce sweep; 11a1 and 11a2 are arithmetic and
    one checkpoint written; 11b simulates its world in the notebook's own process)."""
    assert "notebooks/[0-9]*.ipynb" in (ROOT / "run_course.sh").read_text()
    names = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9]*.ipynb"))
    after = {
        "11_predict_the_cluster.ipynb": ["collectives"],
        "11a1_published_runs.ipynb": [],
        "11a2_planner.ipynb": [],
        "11b_simulated_world.ipynb": [],
    }
    report = ["10_scaling_report.ipynb", "10a_same_model.ipynb"]
    assert names[-len(after) - len(report) :] == [*report, *after]
    for name, jobs in after.items():
        code = "".join(
            "".join(c["source"])
            for c in json.loads((ROOT / "notebooks" / name).read_text())["cells"]
            if c["cell_type"] == "code"
        )
        runners = re.findall(r"\b(\w+)\.run\(", code)  # the Colab cell's subprocess.run aside
        assert [r for r in runners if r != "subprocess"] == jobs and "_trainup_" not in code, name
    for name in report:
        text = "".join(
            "".join(c["source"])
            for c in json.loads((ROOT / "notebooks" / name).read_text())["cells"]
            if c["cell_type"] == "markdown"
        )
        solved = (ROOT / "notebooks" / "solutions" / name).with_suffix(".py")
        assert "## Exercises" in text and solved.exists(), name


def test_layout_from_lesson_records(tmp_path):
    """The tensor-parallel script works out --tp/--dp in the job; its 'tp' record, not the flags, says the layout."""
    tp = dict(type="tp", run="x", time=1.0, tp=2, dp=2, mesh=[2, 2])
    write_run(tmp_path, "two_d", "_trainup_tp.py", 4, extra_records=[dict(tp, run="two_d")])
    write_run(
        tmp_path,
        "tp_only",
        "_trainup_tp.py",
        2,
        extra_records=[dict(tp, run="tp_only", tp=2, dp=1)],
    )
    got = {r["name"]: r["strategy"].name for r in sr.load(tmp_path)[0]}
    assert got == {"two_d": "data x tensor parallel (2-D)", "tp_only": "tensor parallel"}


LAYERS = dict(blocks=2, width=16, hidden=32, heads=4)
MOE = dict(LAYERS, experts=4, top_k=2, capacity_factor=2.0, aux_loss_weight=0.01)
FOUR_D = dict(LAYERS, blocks=4, pp=2, cp=2, tp=None, dp=None, microbatches=2)
# Lessons 09d-09g, each as its notebook makes it: (row, script, processes, flags, its one-process
# run's script and flags, and a one-process run that did other work, which is no baseline of it)
FRONTIER = {
    "cp": (
        "context parallel (ulysses attention)",
        "_trainup_cp.py",
        2,
        dict(LAYERS, cp_attention="ulysses", causal=True),
        ("_trainup_cp.py", dict(LAYERS, cp_attention="ring", causal=True)),
        dict(LAYERS, cp_attention="ring", causal=False),  # not causal: another model
    ),
    "experts": (
        "expert parallel",
        "_trainup_experts.py",
        2,
        MOE,
        ("_trainup_experts.py", MOE),
        dict(MOE, top_k=1),  # one expert a token: another model
    ),
    "compile": (
        "DDP + torch.compile",
        "_trainup_compile.py",
        2,
        dict(compile=True, compile_mode="default", bucket_cap_mb=1.0),
        ("_trainup_gpu.py", {}),  # the one-device script: eager, the same model
        dict(compile=True, compile_mode="max-autotune-no-cudagraphs", bucket_cap_mb=1.0),
    ),
    "4d": (
        "4-D (pipeline x data x context x tensor parallel)",
        "_trainup_4d.py",
        4,
        FOUR_D,
        ("_trainup_4d.py", dict(FOUR_D, pp=1, cp=1)),
        dict(FOUR_D, pp=1, cp=1, heads=2),  # other heads: another model
    ),
}


@pytest.mark.parametrize("lesson", list(FRONTIER))
def test_the_frontier_lessons_runs_get_their_row_and_their_declared_baseline(lesson, tmp_path):
    """A job of lessons 09d-09g is its strategy's, measured against a one-process run of the same
    work and proven (float64) against the one-process run its row declares; a one-process run of
    another model or other kernels gives it no speedup and no proof."""
    name, script, world, flags, (base_script, base_flags), other = FRONTIER[lesson]
    ckpt = tmp_path / "checkpoints"
    job = dict(state=shifted(eq.TOLERANCE / 10), checkpoint_dir=ckpt, extra_args=flags)
    write_run(tmp_path, "other", script, state=STATE, checkpoint_dir=ckpt, extra_args=other)
    write_run(tmp_path, "job", script, world, samples_per_s=150, **job)
    runs = sr.load(tmp_path)[0]
    strategy = {r["name"]: r["strategy"] for r in runs}["job"]
    assert strategy.name == name and strategy.baseline is not None
    table = sr.performance(runs).set_index("run")
    assert table.loc["job", "no_speedup"] == sr.UNMATCHED and math.isnan(
        table.loc["job", "speedup"]
    )
    row = eq.equivalence_row(strategy, runs, ckpt)
    assert row["result"] == "skipped" and "no float64 one-process baseline" in row["reason"], row
    # its declared one-process run: the proof holds, and a speedup where it did the same work
    write_run(
        tmp_path, "base", base_script, state=STATE, checkpoint_dir=ckpt, extra_args=base_flags
    )
    runs = sr.load(tmp_path)[0]
    assert eq.fits_all(strategy.baseline, {r["name"]: r for r in runs}["base"]["facts"])
    row = eq.equivalence_row(strategy, runs, ckpt)
    assert row["result"] == "holds" and row["pairs"].startswith("job~base "), row
    table = sr.performance(runs).set_index("run")
    if lesson == "compile":  # eager kernels are no baseline of compiled ones' speed
        assert table.loc["job", "no_speedup"] == sr.UNMATCHED
        write_run(tmp_path, "compiled_one", script, samples_per_s=100, extra_args=flags)
        table = sr.performance(sr.load(tmp_path)[0]).set_index("run")
        base = "compiled_one"
    else:
        base = "base"
    assert table.loc["job", "baseline"] == base and table.loc["job", "scaling"] == "strong"
    assert table.loc["job", "speedup"] == pytest.approx(1.5)


def test_experts_that_drop_tokens_are_not_held_to_one_process(tmp_path):
    """Below experts / top-k an expert's capacity counts each rank's own tokens: which are dropped
    depends on the split, so the job is skipped with that reason, never held nor failed; a
    one-process run with another capacity is no baseline, for the proof or the speed."""
    drops = dict(MOE, top_k=1, capacity_factor=0.5)
    write_run(tmp_path, "moe_one", "_trainup_experts.py", state=STATE, extra_args=drops)
    write_run(tmp_path, "moe_drops", "_trainup_experts.py", 2, state=STATE, extra_args=drops)
    expert_parallel = next(s for s in sr.STRATEGIES if s.name == "expert parallel")
    row = eq.equivalence_row(expert_parallel, sr.load(tmp_path)[0], tmp_path / "checkpoints")
    assert row["result"] == "skipped", row
    assert "capacity factor is below experts / top-k" in row["reason"]
    # with room for every assignment the same pair is judged
    for name, n in (("moe_one", 1), ("moe_drops", 2)):
        write_run(tmp_path, name, "_trainup_experts.py", n, state=STATE, extra_args=MOE)
    row = eq.equivalence_row(expert_parallel, sr.load(tmp_path)[0], tmp_path / "checkpoints")
    assert row["result"] == "holds" and row["pairs"].startswith("moe_drops~moe_one "), row
    # another capacity, even one that drops nothing either, is another training and other work
    roomier = dict(MOE, capacity_factor=4.0)
    write_run(tmp_path, "moe_one", "_trainup_experts.py", state=STATE, extra_args=roomier)
    runs = sr.load(tmp_path)[0]
    row = eq.equivalence_row(expert_parallel, runs, tmp_path / "checkpoints")
    assert row["result"] == "skipped" and "no float64 one-process baseline" in row["reason"]
    assert sr.performance(runs).set_index("run").loc["moe_drops", "no_speedup"] == sr.UNMATCHED


def test_no_stored_sentence_of_notebook_10_claims_more_than_perfect_efficiency():
    """What notebooks 10 and 10a show a learner, stored: every efficiency they state is one a
    baseline can give (10a holds the recommendation, whose sentences state them)."""
    for name in ("10_scaling_report.ipynb", "10a_same_model.ipynb"):
        stored = (ROOT / "notebooks" / name).read_text()
        claimed = [int(m) for m in re.findall(r"(\d+)% efficiency", stored)]
        assert all(e <= 100 * sr.COMPARABLE_EFFICIENCY for e in claimed), (name, claimed)


def test_one_log_reader_strict_for_the_lessons_tolerant_for_the_report(tmp_path):
    """lessons.log_reader.read_run checks every record; the report checks the core ones only (a newer
    course's lesson records are kept unchecked) and leaves a missing record to load()'s sentence."""
    from lessons import log_reader

    path = tmp_path / "r.jsonl"
    path.write_text('{"type": "a_newer_lesson_record", "run": "r", "time": 1.0}\n3\n')
    strict, tolerant = log_reader.read_run(path), sr.read_log(path)
    assert any("unknown record type" in p for p in strict["problems"])
    assert (
        "line 2 is not a JSON object" in strict["problems"]
        and "no 'summary' record" in strict["problems"]
    )
    assert tolerant["problems"] == [] and len(tolerant["extra"]) == 2
