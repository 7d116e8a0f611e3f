"""_trainup_horovod.py run for real: 2 processes under horovodrun (gloo), against one process; faults; SLURM.

Horovod is built from source by tools/build_horovod.sh (part of the set-up). Where it is not installed these
tests skip and say why, except with TRAINUP_REQUIRE_HOROVOD=1 (CI), where a missing Horovod fails them.
"""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from conftest import (
    ROOT,
    SCRIPTS,
    assert_clean_error,
    finish_job,
    notebook_cells,
    notebook_or_own,
    require_horovod,
    start_baseline,
    start_job,
    start_script,
    start_wanted,
)
from lessons import checks, report
from lessons.bylesson import horovod, slurm
from trainup import models

SCRIPT = str(SCRIPTS / "_trainup_horovod.py")  # the copy under test (tests/test_breakages.py)
SBATCH = ROOT / "slurm" / "horovod" / "cpu.sbatch"
# its run hvd_n2: 2 Horovod ranks with TINY's flags and the proof's (and --threads 1, which the
# jobs' OMP_NUM_THREADS=1 already gives), the run hvd2 would make again
READS_NOTEBOOK = "notebooks/05_horovod.ipynb"
# Dropout off: each rank draws its own masks, so only without it can 2 ranks match 1 process exactly.
TINY = ["--quick", "--dropout", "0", "--no-progress", "--device", "cpu"]
# 84 samples a rank: steps of 32, 32 and 20, so with --accumulate 2 (micro-batches of 16) the last
# step's are 16 and 4: a mean of the micro-batches' means (loss / K) would weigh the 4 as the 16
SHORT_LAST = ["--train-size", 168]
# float16 autocast and its GradScaler, on the CPU (torch has both there; float16 matmuls are slow
# on a CPU, so 128 samples an epoch: 2 steps, enough for the scaler's state to change)
FP16 = ["--precision", "16", "--train-size", 128]


def start(cmd, env=None):
    return start_job(cmd, horovod.environment(env))


finish = finish_job


def horovodrun(log_dir, name, *args, env=None, timeline=None):
    flags, _ = horovod.command(name=name, np=2, quick=False, timeline=timeline)
    return start(
        horovod.HOROVODRUN
        + flags
        + [
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
        ],
        env,
    )


def ok(proc):
    assert proc.returncode == 0, (
        f"exit {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )
    return proc


def params(log_dir, name):
    return torch.load(log_dir / "checkpoints" / f"{name}.pt", weights_only=True)["model"]


def records(log_dir, name, kind):
    return [r for r in report.read_run(log_dir / f"{name}.jsonl")["extra"] if r["type"] == kind]


# Put on PYTHONPATH as sitecustomize.py: rank 1 moves every parameter it gives an optimizer by +0.01, so it
# starts apart from rank 0 (as ranks seeded differently, or loading other files, would); from outside the
# script, which holds no switch for it. It leaves a mark, so a test knows it ran.
APART = """import os
if os.environ.get("HOROVOD_RANK") == "1":
    import torch
    _init = torch.optim.Optimizer.__init__

    def _apart(self, params, *a, **k):
        params = list(params)
        with torch.no_grad():
            for g in params:
                for p in g["params"] if isinstance(g, dict) else [g]:
                    p.add_(0.01)
        open(os.environ["TRAINUP_APART_MARK"], "w").close()
        _init(self, params, *a, **k)
    torch.optim.Optimizer.__init__ = _apart
"""


@pytest.fixture(scope="module")
def jobs(tmp_path_factory, request, inject):
    """Started together (each is mostly start-up and waiting): one process with the whole batch
    (_trainup_gpu.py on the CPU), 2 Horovod ranks with half each (where this session does not run
    notebook 05, which makes them: runs), 2 ranks that start apart, and two Horovod jobs with a
    rank that fails; those the selected tests read (their jobs marks) only."""
    require_horovod()
    log_dir = tmp_path_factory.mktemp("horovod") / "logs"
    faults = log_dir.parent / "faults"
    site = log_dir.parent / "apart"
    site.mkdir()
    (site / "sitecustomize.py").write_text(APART)
    starters = dict(
        hvd2=lambda: hvd2(log_dir),
        # 2 micro-batches of 16 a rank a step; Horovod's timeline shows each gradient's all-reduces
        acc2=lambda: horovodrun(
            log_dir,
            "acc2",
            "--batch-size",
            64,
            *checks.PROOF,
            *SHORT_LAST,
            "--accumulate",
            2,
            timeline=log_dir.parent / "acc2_timeline.json",
        ),
        one_short=lambda: start_script(
            "_trainup_gpu.py",
            *TINY,
            "--batch-size",
            64,
            *checks.PROOF,
            *SHORT_LAST,
            "--run-name",
            "one_short",
            log_dir=log_dir,
        ),
        apart=lambda: horovodrun(
            log_dir,
            "apart",
            "--batch-size",
            64,
            *checks.PROOF,
            env={
                "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
                "TRAINUP_APART_MARK": str(site / "rank1_started_apart"),
            },
        ),
        one=lambda: start_baseline(tmp_path_factory, log_dir),  # once a session (BASELINE)
        # --precision 16: 2 epochs straight, and 1 (resumed to 2 by the test that reads them)
        fp16_straight=lambda: horovodrun(log_dir, "fp16_straight", *FP16, "--epochs", 2),
        fp16=lambda: horovodrun(log_dir, "fp16", *FP16, "--epochs", 1),
        died=lambda: horovodrun(faults, "died", env=inject("1:3:exit")),  # os._exit(1) at step 3
        raised=lambda: horovodrun(faults, "raised", env=inject("1:3")),  # raises at step 3
    )
    if notebook_cells(request, READS_NOTEBOOK):  # runs reads the notebook's, or makes its own
        del starters["hvd2"]
    done = {"hvd2": None, **start_wanted(request, starters)}
    return SimpleNamespace(
        log_dir=log_dir, faults=faults, mark=site / "rank1_started_apart", **done
    )


def hvd2(log_dir):
    return horovodrun(log_dir, "hvd2", "--batch-size", 64, *checks.PROOF)


@pytest.fixture(scope="module")
def runs(jobs, request):
    """The one process (one) and 2 Horovod ranks with half its batch each: notebook 05's hvd_n2
    where this session ran that notebook and every cell passed, else this module's own hvd2.
    logs and ckpts: where the 2 ranks' run is; one's log and checkpoint are in base."""
    ok(jobs.one)

    def load():
        logs = ROOT / "logs"
        if (logs / "hvd_n2.jsonl").exists():
            return SimpleNamespace(logs=logs, ckpts=ROOT / "checkpoints", two="hvd_n2")

    def own():
        ok(jobs.hvd2 or finish(hvd2(jobs.log_dir)))
        return SimpleNamespace(logs=jobs.log_dir, ckpts=jobs.log_dir / "checkpoints", two="hvd2")

    made = notebook_or_own(request, READS_NOTEBOOK, load, own)
    return SimpleNamespace(base=jobs.log_dir, **vars(made))


@pytest.mark.jobs("one", "hvd2")
def test_two_horovod_ranks_with_half_the_batch_end_like_one_process_with_all_of_it(runs):
    one = params(runs.base, "one")
    two = torch.load(runs.ckpts / f"{runs.two}.pt", weights_only=True)["model"]
    init = models.build(
        SimpleNamespace(model="cnn", seed=1, dropout=0.0),
        SimpleNamespace(shape=(1, 28, 28), num_classes=10),
    ).state_dict()
    for k in one:
        torch.testing.assert_close(
            two[k], one[k], rtol=0, atol=checks.FLOAT64_ATOL, msg=k
        )  # float64
    assert (
        max((one[k] - init[k]).abs().max().item() for k in one) > 1e-2
    )  # they did train, far beyond atol
    run1 = report.read_run(runs.base / "one.jsonl")
    run2 = report.read_run(runs.logs / f"{runs.two}.jsonl")
    assert run2["problems"] == [] and run2["summary"]["status"] == "finished"
    for e1, e2 in zip(
        run1["epochs"], run2["epochs"], strict=True
    ):  # metrics summed over both ranks
        assert e2["samples"] == e1["samples"] == 512
        assert e2["loss"] == pytest.approx(e1["loss"], abs=checks.FLOAT64_ATOL)


@pytest.mark.jobs("fp16_straight", "fp16")
def test_a_resumed_fp16_run_restores_its_grad_scaler_and_ends_like_a_straight_one(jobs):
    """The GradScaler's loss scale and growth count are in the checkpoint, and --resume puts them
    back: a scaler started afresh (scale 65536) overflows again in its first steps, skips them and
    ends with another scale, another count and other parameters than the straight run."""
    ok(jobs.fp16_straight), ok(jobs.fp16)
    log_dir = jobs.log_dir
    saved = torch.load(log_dir / "checkpoints" / "fp16.pt", weights_only=True)["scaler"]
    assert saved["scale"] > 0 and saved["_growth_tracker"] >= 0  # epoch 1's scaler, saved
    ok(finish(horovodrun(log_dir, "fp16", *FP16, "--epochs", 2, "--resume")))
    straight, resumed = (
        torch.load(log_dir / "checkpoints" / f"{n}.pt", weights_only=True)
        for n in ("fp16_straight", "fp16")
    )
    assert resumed["scaler"] == straight["scaler"]
    for k in straight["model"]:
        torch.testing.assert_close(resumed["model"][k], straight["model"][k], rtol=0, atol=0, msg=k)
    run = report.read_run(log_dir / "fp16.jsonl")
    assert run["problems"] == [] and run["config"]["args"]["precision"] == "16"


@pytest.mark.jobs("one_short", "acc2")
def test_accumulating_2_micro_batches_ends_like_one_process_with_one_allreduce_a_step(jobs):
    """--accumulate 2: DistributedOptimizer(backward_passes_per_step=2) all-reduces each gradient
    after every 2nd backward pass only; with the loss weighed by its samples and the sum divided by
    the step's, 2 ranks x 2 micro-batches of 16 end as one process with batches of 64 (float64),
    the short last step (micro-batches of 16 and 4 a rank) included."""
    ok(jobs.one_short), ok(jobs.acc2)
    one, acc = params(jobs.log_dir, "one_short"), params(jobs.log_dir, "acc2")
    for k in one:
        torch.testing.assert_close(acc[k], one[k], rtol=0, atol=checks.FLOAT64_ATOL, msg=k)
    run = report.read_run(jobs.log_dir / "acc2.jsonl")
    assert run["problems"] == [] and run["config"]["args"]["accumulate"] == 2
    base = report.read_run(jobs.log_dir / "one_short.jsonl")["epochs"]
    for e1, e2 in zip(base, run["epochs"], strict=True):
        assert e2["samples"] == 168
        assert e2["loss"] == pytest.approx(e1["loss"], abs=checks.FLOAT64_ATOL)
    # by hand: 2 epochs of 84 samples a rank, micro-batches of 16: 6 backward passes an epoch
    # (5 of 16, 1 of 4) and 3 optimizer steps (2 of 32, 1 of 20); Horovod's own timeline (rank 0's)
    # holds each gradient's all-reduces: one a step, half the backward passes
    got = horovod.accumulation("acc2", jobs.log_dir.parent / "acc2_timeline.json", jobs.log_dir)
    assert got["allreduces"] == {k: 6 for k in one}, got
    assert (got["micro_batch"], got["backward_passes"], got["steps"]) == (16, 12, 6)


@pytest.mark.jobs("one", "apart")
def test_ranks_that_start_apart_end_like_one_process_after_rank_0s_broadcast(jobs):
    """Rank 1 starts from other weights (APART): hvd.broadcast_parameters gives it rank 0's before the first
    step, so the job ends as one process does (float64). Without the broadcast the two ranks average
    gradients of different models and end about 1e-2 apart from it."""
    ok(jobs.one), ok(jobs.apart)
    assert jobs.mark.exists(), "rank 1 did not start apart: the test would prove nothing"
    one, apart = params(jobs.log_dir, "one"), params(jobs.log_dir, "apart")
    for k in one:
        torch.testing.assert_close(apart[k], one[k], rtol=0, atol=checks.FLOAT64_ATOL, msg=k)


@pytest.mark.jobs("one", "hvd2")
def test_horovodrun_gives_each_rank_its_place_its_shard_and_one_writer(runs):
    job = records(runs.logs, runs.two, "ddp")[0]
    assert (
        job["launcher"] == "horovodrun" and job["world_size"] == 2 and job["per_rank_batch"] == 32
    )
    assert [r["rank"] for r in job["ranks"]] == [0, 1] and [
        r["local_rank"] for r in job["ranks"]
    ] == [0, 1]
    assert len({r["pid"] for r in job["ranks"]}) == 2
    assert report.read_run(runs.logs / f"{runs.two}.jsonl")["env"]["backend"] == "horovod-gloo"
    per_epoch = records(runs.logs, runs.two, "ranks")
    assert [r["epoch"] for r in per_epoch] == [1, 2]
    for r in per_epoch:
        assert r["samples"] == [256, 256] and not set(r["first_indices"][0]) & set(
            r["first_indices"][1]
        )
    assert (runs.logs / f"{runs.two}.stdout").read_text().count("epoch 1:") == 1  # rank 0 alone
    # its checkpoint written whole, through a rename (a notebook's folder holds other runs' too)
    assert not list(runs.ckpts.glob(f".{runs.two}.pt.*.tmp"))


@pytest.mark.jobs("one", "hvd2")
def test_the_learning_rate_is_not_scaled_by_horovod(runs):
    """Horovod's DistributedOptimizer averages gradients and leaves the rate alone: after 2 epochs of StepLR
    (gamma 0.7) both jobs hold lr 1.0 * 0.7**2, not 2 x that."""
    for ckpts, name in ((runs.base / "checkpoints", "one"), (runs.ckpts, runs.two)):
        lr = torch.load(ckpts / f"{name}.pt", weights_only=True)["optimizer"]["param_groups"][0][
            "lr"
        ]
        assert lr == pytest.approx(1.0 * 0.7**2), name


@pytest.mark.jobs("died", "raised")
def test_a_rank_that_dies_ends_the_job_with_a_nonzero_exit(jobs):
    log_dir, died, raised = jobs.faults, jobs.died, jobs.raised
    assert died.returncode != 0, died.stdout[-2000:] + died.stderr[-2000:]
    assert raised.returncode != 0 and "injected fault" in raised.stdout + raised.stderr
    for name in ("died", "raised"):
        assert (
            report.read_run(log_dir / f"{name}.jsonl")["summary"] is None
        )  # it did not claim to finish


def test_accumulate_that_does_not_divide_the_batch_is_one_sentence(tmp_path):
    require_horovod()
    proc = subprocess.run(
        [
            sys.executable,
            SCRIPT,
            *TINY,
            "--batch-size",
            "64",
            "--accumulate",
            "3",
            "--log-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=120,
        env=horovod.environment(),
    )
    assert_clean_error(proc, "--accumulate 3 must divide each process's batch (64 samples)")


def test_uneven_shards_joined_end_without_a_hang():
    """hvd.join(): rank 0 has 3 batches, rank 1 has 5. Joined, rank 0 answers rank 1's last 2
    all-reduces with zeros (Average still divides by 2: rank 1's gradient halves), the job ends,
    and a broadcast from the last rank to join gives rank 0 the weights of all 5 steps."""
    require_horovod()
    r0, r1 = horovod.join_run(np=2, timeout=120)
    assert (r0["steps"], r1["steps"]) == (3, 5) and r0["last_joined"] == r1["last_joined"] == 1
    assert r1["ratios"][3:] == [0.5, 0.5]  # by hand: (g + 0) / 2
    assert r0["before"] != r1["before"]  # rank 0 missed 2 steps...
    assert r0["after"] == r1["after"] == r1["before"]  # ...until the broadcast from rank 1


def test_the_timeline_summary_counts_each_nesting_level_once(tmp_path):
    """A hand-made timeline of two fused gradients: ALLREDUCE holds its inner phases, so a sum over
    every span would count the same microseconds twice. Counted by hand below."""

    def span(pid, name, start, end):  # ms in the table, us in the file
        return [
            dict(ph="B", name=name, ts=start * 1000, pid=pid),
            dict(ph="E", ts=end * 1000, pid=pid),
        ]

    events = [
        dict(name="process_name", ph="M", pid=1, args=dict(name="allreduce.fc.weight")),
        dict(name="process_name", ph="M", pid=2, args=dict(name="allreduce.fc.bias")),
        dict(ph="B", name="NEGOTIATE_ALLREDUCE", ts=0, pid=1),
        dict(ph="X", name="0", ts=1000, pid=1, dur=0),
        dict(ph="X", name="1", ts=9000, pid=1, dur=0),
        dict(ph="E", ts=10000, pid=1),
        *span(2, "NEGOTIATE_ALLREDUCE", 5, 10),
        dict(ph="i", name="CYCLE_START", ts=11000, s="g"),
    ]
    for pid, waits in ((1, True), (2, False)):
        events += [
            dict(ph="B", name="ALLREDUCE", ts=10000, pid=pid),
            *(span(pid, "WAIT_FOR_DATA", 10, 12) if waits else []),
            *span(pid, "MEMCPY_IN_FUSION_BUFFER", 12, 20),
            *span(pid, "GLOO_ALLREDUCE", 20, 45),
            *span(pid, "MEMCPY_OUT_FUSION_BUFFER", 45, 50),
            dict(ph="E", ts=50000, pid=pid),
        ]
    path = tmp_path / "timeline.json"
    # left open, as Horovod leaves it while it runs
    path.write_text("[\n" + ",\n".join(json.dumps(e) for e in events) + ",\n")
    t = horovod.timeline_events(path)
    got = {
        r.phase: (r.kind, r.count, r.tensor_ms, r.wall_ms)
        for r in horovod.timeline_summary(t).itertuples()
    }
    assert got == {
        "NEGOTIATE_ALLREDUCE": ("waiting", 2, 15, 10),
        "WAIT_FOR_DATA": ("waiting", 1, 2, 2),
        "MEMCPY_IN_FUSION_BUFFER": ("work", 2, 16, 8),
        "GLOO_ALLREDUCE": ("work", 2, 50, 25),
        "MEMCPY_OUT_FUSION_BUFFER": ("work", 2, 10, 5),
    }
    top = {
        r.phase: (r.count, r.tensor_ms, r.wall_ms)
        for r in horovod.timeline_summary(t, "top").itertuples()
    }
    assert top == {"NEGOTIATE_ALLREDUCE": (2, 15, 10), "ALLREDUCE": (2, 80, 40)}
    # the leaves of a row add up to no more than its top-level spans: nothing counted twice
    leaves, tops = t[t.leaf & ~t.phase.str.isdigit()], t[(t.depth == 0) & ~t.phase.str.isdigit()]
    for tensor in ("allreduce.fc.weight", "allreduce.fc.bias"):
        ms = [(d.end_ms - d.start_ms)[d.tensor == tensor].sum() for d in (leaves, tops)]
        assert ms[0] <= ms[1] + 1e-9
    with pytest.raises(ValueError, match="leaf"):
        horovod.timeline_summary(t, "all")


def test_without_horovod_one_sentence_says_how_to_install_it(tmp_path, log_dir):
    # a Python where `import horovod.torch` fails, as in an environment where the build was skipped
    (tmp_path / "horovod").mkdir()
    (tmp_path / "horovod" / "__init__.py").write_text(
        "raise ImportError(\"No module named 'horovod'\")\n"
    )
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--log-dir", str(log_dir)],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert_clean_error(proc, "Horovod is not installed", "tools/build_horovod.sh")
    assert not log_dir.exists()  # nothing half-written


def test_cuda_under_a_horovod_built_without_nccl_is_one_sentence(monkeypatch, capsys):
    pytest.importorskip("horovod.torch")
    from trainup import UserError
    from trainup.engines import hvd_group

    monkeypatch.setattr(hvd_group.hvd, "nccl_built", lambda: 0)
    monkeypatch.setattr(
        torch.cuda, "is_available", lambda: True
    )  # a GPU machine, as Horovod would meet it
    with pytest.raises(
        UserError,
        match="--device cuda needs a Horovod built with NCCL.*HOROVOD_GPU_OPERATIONS=NCCL",
    ):
        hvd_group.gpu_ops("cuda")
    assert hvd_group.gpu_ops("auto") == "cpu" and "built without NCCL" in capsys.readouterr().err
    assert hvd_group.gpu_ops("cpu") == "cpu"
    monkeypatch.setattr(hvd_group.hvd, "nccl_built", lambda: 1)
    assert hvd_group.gpu_ops("cuda") == "cuda"
    # auto: the node's ranks take GPUs only where each gets one (trainup/devices.py's decision)
    monkeypatch.setattr(hvd_group.hvd, "local_size", lambda: 2)
    monkeypatch.setattr(hvd_group.hvd, "local_rank", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert hvd_group.gpu_ops("auto") == "cpu" and "would need 2 GPUs" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert hvd_group.gpu_ops("auto") == "cuda"


def test_the_build_can_be_skipped_and_names_what_it_needs():
    skipped = subprocess.run(
        ["bash", "tools/build_horovod.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TRAINUP_SKIP_HOROVOD": "1"},
    )
    assert skipped.returncode == 0 and "skipped" in skipped.stdout
    patch = (ROOT / "tools" / "horovod" / "cxx17.patch").read_text()
    # the two C++ standard lines of horovod 0.28.1's CMake files, 14 -> 17, and nothing else
    changed = [l for l in patch.splitlines() if l[:1] in "+-" and l[:3] not in ("+++", "---")]
    assert [l[1:].strip() for l in changed] == [
        "set(CMAKE_CXX_STANDARD 14)",
        "set(CMAKE_CXX_STANDARD 17)",
    ] * 2


# --- SLURM: srun horovodrun in a one-task job, on a real local SLURM ------------------------------


def test_the_slurm_template_is_well_formed():
    assert subprocess.run(["bash", "-n", str(SBATCH)]).returncode == 0
    sentence, problems = slurm.check_counts(SBATCH)
    assert problems == [], f"{sentence}: {problems}"


def test_the_slurm_template_trains_with_horovodrun_through_sbatch(local_slurm, tmp_path):
    require_horovod()
    job = slurm.submit(
        SBATCH,
        "--quick",
        "--run-name",
        "hvd_slurm",
        "--log-dir",
        tmp_path,
        "--checkpoint-dir",
        tmp_path / "checkpoints",
        sbatch_args=[f"--output={tmp_path}/job.out"],
    )
    state = slurm.wait([job], timeout=600)[job]
    out = (
        (tmp_path / "job.out").read_text()
        if (tmp_path / "job.out").exists()
        else "(no output file)"
    )
    assert state == "COMPLETED", out
    run = report.read_run(tmp_path / "hvd_slurm.jsonl")
    assert run["problems"] == [] and run["summary"]["status"] == "finished", out
    assert run["env"]["world_size"] == 2 and run["env"]["backend"] == "horovod-gloo"
    losses = [e["loss"] for e in run["epochs"]]
    assert len(losses) == 2 and losses[-1] < losses[0]
    assert next(r for r in run["extra"] if r["type"] == "ddp")["launcher"] == "horovodrun"


def test_accumulation_weighs_before_the_allreduce_so_fp16_carries_a_mean():
    """No Horovod needed: K = 2 micro-batches of 16, then an epoch's short step of 4. What backward
    sees (and --fp16-allreduce casts to float16) is a mean-sized gradient, not one multiplied by the
    samples; after average() every step holds the mean gradient over its own samples."""
    from trainup.engines import hvd_group

    w = torch.nn.Parameter(torch.zeros(()))
    opt = SimpleNamespace(backward_passes_per_step=2, param_groups=[{"params": [w]}])
    step = hvd_group.Accumulation(opt, [16, 16, 4])  # two full micro-batches, then a short one
    for n, value in ((16, 1.0), (16, 3.0), (4, 5.0)):
        loss = step.weigh(w * 0 + value, n)  # a micro-batch whose mean gradient is `value`
        assert abs(loss.item()) <= 5.0  # never samples x the mean: float16 holds at most 65504
        w.grad = (w.grad if w.grad is not None else 0) + loss.detach()
        if step.last():
            step.average()
            expected = 2.0 if n == 16 else 5.0  # (16*1 + 16*3) / 32, then the short step's own mean
            assert w.grad.item() == pytest.approx(expected)
            w.grad = None


def test_the_speed_sentences_give_a_direction_only_where_the_runs_decide_it():
    import pandas as pd

    t = pd.DataFrame(
        [
            dict(fusion_mb=f, cycle_ms=c, step_ms=v)
            for (f, c), vs in {
                (64, 1): [58, 57, 59],
                (0, 1): [57, 58, 56],
                (64, 20): [67, 66, 68],
                (0, 20): [66],
            }.items()
            for v in vs
        ]
    )
    said = horovod.fusion_sentence(t).splitlines()
    assert "within the runs' spread" in said[0] and "cannot tell" in said[1]  # 1 run of (0, 20)
    assert "cannot tell" in said[2] and "longer in every run" in said[3] and "9.5 ms" in said[3]
    # a quick run leaves (0, 20) out: each knob's one pair from (64, 1) is said, no other
    quick = horovod.fusion_sentence(t[(t.fusion_mb != 0) | (t.cycle_ms != 20)]).splitlines()
    assert quick == [said[0], said[3]]

    def runs(horovod_runs, ddp_runs):
        pairs = (("horovod", horovod_runs), ("ddp", ddp_runs))
        return pd.DataFrame(
            [dict(engine=e, batch_size=64, samples_per_s=v) for e, vs in pairs for v in vs]
        )

    b = runs([100, 101, 99], [120, 121, 122])
    assert "1.2× slower than ddp" in horovod.versus(b)
    assert "cannot tell" in horovod.versus(b.iloc[[0, 3]])  # one run each
    overlapping = runs([100, 130, 99], [120, 121, 122])
    assert "about as fast as ddp" in horovod.versus(overlapping)  # 3 runs each, ranges overlap
