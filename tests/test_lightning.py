"""_trainup_lightning.py run for real: Lightning DDP with 2 CPU processes (Lightning's own launcher, and torchrun),
against the course's one-process baseline; TensorBoard's files, the checkpoints, the 1.x flags, and SLURM."""

import sys
from types import SimpleNamespace

import pytest
import torch

from conftest import (
    ROOT,
    SCRIPTS,
    STOP_AT,
    STOP_TINY,
    assert_clean_error,
    assert_same_params,
    finish_job,
    in_process,
    kill_tree,
    notebook_or_own,
    run_script,
    start_baseline,
    start_job,
    stop_at,
    stop_site,
    stopped_params,
)
from lessons import checks, launch, report
from lessons.bylesson import lightning, slurm
from trainup import preempt

SCRIPT = str(SCRIPTS / "_trainup_lightning.py")
FSDP_SCRIPT = str(SCRIPTS / "_trainup_lightning_fsdp.py")  # ModelParallelStrategy, fully_shard
# Dropout off: each rank draws its own masks, so only without it can 2 ranks match 1 process exactly.
# float64 (checks.PROOF): the proofs hold on any processor (see checks.FLOAT64_ATOL).
TINY = ["--quick", "--dropout", "0", "--no-progress", "--batch-size", "64", *checks.PROOF]
# SLURM is installed here (lesson 04b): Lightning warns that srun exists but was not used, in every run outside a job
pytestmark = pytest.mark.filterwarnings("ignore:The `srun` command is available")
# the notebooks whose runs a test reads where this session ran them: the one process, the DDP run
# and the torchrun run (the same flags as TINY's), the SLURM job, the FSDP2 run
READS_NOTEBOOK = "notebooks/07_lightning.ipynb"
READS_SLURM = "notebooks/07b_lightning_launch_and_log.ipynb"
READS_SHARDED = "notebooks/07c_lightning_options.ipynb"
TOLERANCE = (
    checks.FLOAT64_ATOL
)  # float64 sums in another order: about 1e-16; a wrong sampler is above 1e-2


def _out(log_dir):
    return ["--log-dir", str(log_dir), "--checkpoint-dir", str(log_dir / "checkpoints")]


def ok(proc):
    assert proc.returncode == 0, (
        f"exit {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )
    return proc


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """The baseline (_trainup_gpu.py, one process, whole batch); Lightning DDP on 2 processes that
    Lightning starts itself; and Lightning under torchrun without sync_dist, each step's batch in 2
    accumulated halves (accumulate_grad_batches): notebook 07's l_one, l_ddp and l_torchrun (the
    same flags) where this session ran it, else this module's own, side by side. names: "one",
    "ddp", "torchrun" -> the run's; procs: each job's output, where this module made them."""

    def own():
        log_dir = tmp_path_factory.mktemp("lightning") / "logs"
        one = start_baseline(tmp_path_factory, log_dir)  # made once a session (conftest.BASELINE)
        two = ["--accelerator", "cpu", "--devices", "2", "--strategy", "ddp"]
        ddp = start_job(
            [sys.executable, SCRIPT, *TINY, *two, "--run-name", "pl_ddp", *_out(log_dir)],
            launch.environment(),
        )
        # each step's batch in 2 accumulated halves: DDP's all-reduce on the second only, the
        # same model
        halves = ["--no-sync-dist", "--accumulate-grad-batches", "2"]
        tr = start_job(
            launch.TORCHRUN
            + launch.torchrun_flags(nproc=2)
            + [SCRIPT, *TINY, "--accelerator", "cpu", *halves, "--run-name", "pl_torchrun"]
            + _out(log_dir),
            launch.environment(),
        )
        jobs = (("one", one), ("pl_ddp", ddp), ("pl_torchrun", tr))
        procs = {name: ok(finish_job(p)) for name, p in jobs}
        names = dict(one="one", ddp="pl_ddp", torchrun="pl_torchrun")
        return SimpleNamespace(log_dir=log_dir, ckpts=log_dir / "checkpoints", procs=procs, **names)

    def load():  # None where a run is missing: notebook_or_own says so
        names = dict(one="l_one", ddp="l_ddp", torchrun="l_torchrun")
        if not all((ROOT / "logs" / f"{n}.jsonl").exists() for n in names.values()):
            return None
        return SimpleNamespace(
            log_dir=ROOT / "logs", ckpts=ROOT / "checkpoints", procs=None, **names
        )

    return notebook_or_own(request, READS_NOTEBOOK, load, own)


def records(log_dir, name, kind):
    return [r for r in report.read_run(log_dir / f"{name}.jsonl")["extra"] if r["type"] == kind]


def test_lightning_ddp_on_two_processes_ends_like_one_process(runs):
    log_dir = runs.log_dir
    # with sync_dist or without: logging does not change training
    for name in (runs.ddp, runs.torchrun):
        checks.learned(name, log_dir=log_dir)
        worst = checks.same_parameters(name, runs.one, atol=TOLERANCE, checkpoint_dir=runs.ckpts)
        assert worst <= TOLERANCE
    one = torch.load(runs.ckpts / f"{runs.one}.pt", weights_only=True)
    assert one["epoch"] == 2 and one["scheduler"]["last_epoch"] == 2  # both decayed the rate twice
    run1, run2 = (report.read_run(log_dir / f"{n}.jsonl") for n in (runs.one, runs.ddp))
    for e1, e2 in zip(run1["epochs"], run2["epochs"], strict=True):
        assert e2["samples"] == e1["samples"] == 512
        assert e2["loss"] == pytest.approx(e1["loss"], abs=TOLERANCE)
        assert e2["test_accuracy"] == pytest.approx(e1["test_accuracy"], abs=1e-9)


def test_lightning_put_in_the_distributed_sampler_and_each_rank_took_half(runs):
    log_dir = runs.log_dir
    for name, launcher in (
        (runs.ddp, "LightningEnvironment"),
        (runs.torchrun, "TorchElasticEnvironment"),
    ):
        setup = records(log_dir, name, "lightning")[0]
        assert (setup["strategy"], setup["world_size"], setup["devices"], setup["num_nodes"]) == (
            "DDPStrategy",
            2,
            2,
            1,
        )
        assert (
            setup["launcher"] == launcher
            and report.read_run(log_dir / f"{name}.jsonl")["env"]["backend"] == "gloo"
        )
        for r in records(log_dir, name, "lightning_sync"):
            assert r["sampler"] == "DistributedSampler" and r["rank_samples"] == [256, 256]


def test_with_sync_dist_the_log_is_the_jobs_and_without_it_rank_0s_own(runs):
    log_dir = runs.log_dir
    synced, unsynced = (
        records(log_dir, runs.ddp, "lightning_sync"),
        records(log_dir, runs.torchrun, "lightning_sync"),
    )
    assert [r["sync_dist"] for r in synced + unsynced] == [True, True, False, False]
    for r in synced:
        assert r["logged_loss"] == pytest.approx(r["job_loss"], abs=TOLERANCE)
    for r in unsynced:
        assert r["logged_loss"] == pytest.approx(
            r["rank_loss"][0], abs=TOLERANCE
        )  # rank 0's shard alone
        assert abs(r["logged_loss"] - r["job_loss"]) > 1e-4  # the shards' losses differ by far more
    # the test accuracy is a torchmetrics Metric: its counts summed over the ranks, sync_dist or not
    for name in (runs.ddp, runs.torchrun):
        logged = [v for _, v in lightning.tensorboard_scalars(name, log_dir)["test_accuracy"]]
        job = report.load_epochs(name, log_dir)["test_accuracy"].tolist()
        assert logged == pytest.approx(job, abs=1e-6)  # TensorBoard keeps float32


def test_only_rank_0_writes_and_once(runs):
    log_dir, ddp, tr = runs.log_dir, runs.ddp, runs.torchrun
    for name in (ddp, tr):
        assert (log_dir / f"{name}.stdout").read_text().count("epoch 1:") == 1
        if runs.procs:  # the terminal: what this module's jobs printed (a notebook keeps no copy)
            assert runs.procs[name].stdout.count("epoch 1:") == 1
    names = sorted(p.name for p in runs.ckpts.iterdir())
    if not runs.procs:  # the notebook's folder holds other runs' too: these two runs' files only
        names = [n for n in names if n.lstrip(".").startswith((ddp, tr))]
    mine = [f"{ddp}-lightning.ckpt", f"{ddp}.pt", f"{tr}-lightning.ckpt", f"{tr}.pt"]
    assert names == (sorted([f"{runs.one}.pt", *mine]) if runs.procs else mine)
    course = torch.load(runs.ckpts / f"{ddp}.pt", weights_only=True)["model"]
    lightning = torch.load(runs.ckpts / f"{ddp}-lightning.ckpt", weights_only=False)["state_dict"]
    assert sorted(lightning) == sorted(
        f"model.{k}" for k in course
    )  # the same weights, Lightning's names
    for k, v in course.items():
        torch.testing.assert_close(lightning[f"model.{k}"], v, rtol=0, atol=0)


def test_tensorboard_event_files_hold_the_loss_of_every_step_and_epoch(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder = runs.log_dir / "tensorboard" / runs.ddp
    assert list(folder.glob("events.out.tfevents.*")), f"no event file in {folder}"
    events = EventAccumulator(str(folder)).Reload()
    tags = events.Tags()["scalars"]
    for tag in ("train_loss_step", "train_loss_epoch", "test_loss", "test_accuracy"):
        assert tag in tags, tags
    logged = [s.value for s in events.Scalars("train_loss_epoch")]
    job = [e["loss"] for e in report.read_run(runs.log_dir / f"{runs.ddp}.jsonl")["epochs"]]
    # TensorBoard and the course's log tell the same story; TensorBoard keeps float32 (an ulp near 2 is 2.4e-7)
    assert logged == pytest.approx(job, abs=1e-6)
    assert len(events.Scalars("train_loss_step")) == 2 * 512 // 64


# --- Flags answered in one sentence, in this process (no training starts) -------------------------------


@pytest.fixture(scope="module")
def main():
    import _trainup_lightning

    return _trainup_lightning.main


@pytest.mark.parametrize(
    "flags,words",
    [
        (["--gpus", "2"], ["Lightning 2 removed Trainer(gpus=N)", "--accelerator gpu --devices 2"]),
        (["--strategy", "dp"], ["removed strategy 'dp'", "--strategy ddp"]),
        (["--strategy", "horovod"], ["removed strategy 'horovod'", "lesson 05"]),
        (["--num-processes", "2"], ["--accelerator cpu --devices 2"]),
        (["--strategy", "nosuch"], ["no strategy 'nosuch'", "ddp_spawn", "fsdp"]),
        # FSDPStrategy: refused before Lightning's own GPU check, on any machine (on a GPU rank 0's
        # save would hold its shards alone); the sharded script is named
        (
            ["--strategy", "fsdp", "--accelerator", "cpu"],
            ["FSDPStrategy needs GPUs", "_trainup_lightning_fsdp.py"],
        ),
        (["--strategy", "fsdp_cpu_offload"], ["FSDPStrategy", "_trainup_lightning_fsdp.py"]),
        (
            ["--accelerator", "cpu", "--devices", "3", "--strategy", "ddp"],
            ["cannot be split evenly over 3 processes"],
        ),
        (["--early-stop", "-1"], ["--early-stop", "0 or more"]),
        (["--keep-best", "0"], ["--keep-best", "greater than 0"]),
        (
            ["--accumulate-grad-batches", "3"],
            ["--accumulate-grad-batches 3 must divide --batch-size 64"],
        ),
        (["--gradient-clip-val", "0"], ["--gradient-clip-val 0.0", "positive"]),
        (["--sync-batchnorm"], ["--sync-batchnorm changes nothing", "--model cnn_bn"]),
        (
            ["--sync-batchnorm", "--model", "cnn_bn", "--accelerator", "cpu"],
            ["--sync-batchnorm needs GPUs", "SyncBatchNorm refuses tensors on the cpu"],
        ),
    ],
)
def test_old_and_bad_flags_are_one_sentence_and_a_nonzero_exit(main, flags, words, capsys, log_dir):
    proc = in_process(main, [*TINY, *flags, "--run-name", "bad", *_out(log_dir)], capsys)
    assert_clean_error(proc, *words)
    assert not (log_dir / "bad.jsonl").exists()  # nothing half-written


def test_inside_a_notebook_ddp_is_refused_in_one_sentence_that_names_ddp_notebook(
    main, capsys, log_dir, monkeypatch
):
    """A kernel has no script to run again for rank 1: Lightning refuses 'ddp' in an interactive
    session (as it finds a Jupyter kernel: sys.ps1). Notebook 07b runs ddp_notebook there."""
    from pytorch_lightning.trainer.connectors import accelerator_connector

    monkeypatch.setattr(accelerator_connector, "_IS_INTERACTIVE", True)
    proc = in_process(
        main,
        [
            *TINY,
            "--accelerator",
            "cpu",
            "--devices",
            "2",
            "--strategy",
            "ddp",
            "--run-name",
            "kernel",
            *_out(log_dir),
        ],
        capsys,
    )
    assert_clean_error(proc, "not compatible with an interactive environment", "ddp_notebook")
    assert not (log_dir / "kernel.lock").exists()  # the run's lock let go: the kernel lives on


@pytest.mark.parametrize("damage", ["bytes", "empty", "another file", "shards without metadata"])
def test_a_damaged_lightning_checkpoint_is_one_sentence(main, damage, capsys, log_dir):
    ckpt = log_dir / "checkpoints" / "dmg-lightning.ckpt"
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    if damage == "shards without metadata":  # ModelParallelStrategy's folder, cut short
        ckpt.mkdir()
        (ckpt / "__0_0.distcp").write_bytes(b"half")
    elif damage == "another file":
        torch.save({"model": {}}, ckpt)  # a course checkpoint, not Lightning's
    else:
        ckpt.write_bytes(b"PK\x03\x04 not a checkpoint" if damage == "bytes" else b"")
    proc = in_process(
        main,
        [*TINY, "--accelerator", "cpu", "--resume", "--run-name", "dmg", *_out(log_dir)],
        capsys,
    )
    assert_clean_error(proc, "cannot be read", "damaged or not Lightning's", "without --resume")


def test_the_sharded_script_takes_no_other_strategy_and_a_count_of_devices(capsys, log_dir):
    import _trainup_lightning_fsdp

    for flags, words in (
        (["--strategy", "ddp"], ["ModelParallelStrategy", "_trainup_lightning.py"]),
        (["--devices", "auto"], ["--devices auto", "number of processes"]),
    ):
        proc = in_process(
            _trainup_lightning_fsdp.main,
            [*TINY, "--accelerator", "cpu", *flags, "--run-name", "bad", *_out(log_dir)],
            capsys,
        )
        assert_clean_error(proc, *words)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the sentence for a machine without a GPU"
)
def test_a_gpu_asked_for_on_a_machine_without_one_is_one_sentence(main, capsys, log_dir):
    assert_clean_error(
        in_process(main, [*TINY, "--accelerator", "gpu", *_out(log_dir)], capsys),
        "needs an NVIDIA GPU",
        "--accelerator cpu",
    )


# --- FSDP2 under the Trainer: ModelParallelStrategy -----------------------------------------------------


@pytest.fixture(scope="module")
def sharded(request, tmp_path_factory):
    """_trainup_lightning_fsdp.py on 2 processes under torchrun: notebook 07c's run (the same
    flags) where this session ran it, else this module's own beside its baseline."""

    def own():
        log_dir = tmp_path_factory.mktemp("lightning_fsdp") / "logs"
        one = start_baseline(tmp_path_factory, log_dir)  # made once a session (conftest.BASELINE)
        fsdp = start_job(
            launch.TORCHRUN
            + launch.torchrun_flags(nproc=2)
            + [FSDP_SCRIPT, *TINY, "--accelerator", "cpu", "--run-name", "pl_fsdp"]
            + _out(log_dir),
            launch.environment(),
        )
        for proc in (one, fsdp):
            ok(finish_job(proc))
        return log_dir, "pl_fsdp", log_dir / "checkpoints", "one"

    def load():
        found = (ROOT / "logs" / "l_fsdp.jsonl").exists()
        return found and (ROOT / "logs", "l_fsdp", ROOT / "checkpoints", "l_one")

    return notebook_or_own(request, READS_SHARDED, load, own)


def test_fsdp2_under_the_trainer_ends_like_one_process_and_saves_shards_and_a_whole_model(sharded):
    folder, name, ckpts, one = sharded
    checks.learned(name, log_dir=folder)
    assert lightning.setup(name, folder)["strategy"] == "ModelParallelStrategy"
    worst = checks.same_parameters(name, one, atol=checks.FLOAT64_ATOL, checkpoint_dir=ckpts)
    assert worst <= checks.FLOAT64_ATOL
    files = lightning.shard_files(name, ckpts)  # Lightning's: a file of shards a rank
    assert [f for f in files if f.endswith(".distcp")] == ["__0_0.distcp", "__1_0.distcp"]
    assert {".metadata", "meta.pt"} <= set(files)
    # the course's, by rank 0: whole tensors gathered from both ranks' shards, not rank 0's DTensors
    whole = torch.load(ckpts / f"{name}.pt", map_location="cpu", weights_only=False)["model"]
    assert all(type(t) is torch.Tensor for t in whole.values()), {type(t) for t in whole.values()}


# --- SLURM: srun, one task per process, nodes from SLURM's variables ------------------------------------


def test_the_slurm_template_trains_on_two_nodes_and_ends_like_one_process(request, tmp_path):
    """Notebook 07b's job where this session ran the notebook (the same template, flags and proof),
    else this test's own on the local SLURM."""

    def load():
        found = (ROOT / "logs" / "l_slurm.jsonl").exists()
        return found and (ROOT / "logs", "l_slurm", ROOT / "checkpoints", "l_one")

    folder, name, ckpts, one = notebook_or_own(
        request, READS_SLURM, load, lambda: _slurm_job(request, tmp_path)
    )
    assert slurm.check_counts(ROOT / "slurm" / "lightning" / "cpu.sbatch")[1] == []
    setup = records(folder, name, "lightning")[0]
    assert (setup["launcher"], setup["num_nodes"], setup["devices"], setup["world_size"]) == (
        "SLURMEnvironment",
        2,
        1,
        2,
    )
    checks.learned(name, log_dir=folder)
    assert checks.same_parameters(name, one, atol=TOLERANCE, checkpoint_dir=ckpts) <= TOLERANCE


def _slurm_job(request, tmp_path):
    request.getfixturevalue("local_slurm")
    runs = request.getfixturevalue("runs")  # its baseline
    # one task on each of 2 nodes: Lightning's num_nodes comes from SLURM_NNODES, its devices from SLURM's tasks
    job = slurm.submit(
        ROOT / "slurm" / "lightning" / "cpu.sbatch",
        *TINY,
        "--run-name",
        "pl_slurm",
        *_out(tmp_path),
        sbatch_args=[f"--output={tmp_path}/job.out", "--nodes=2", "--ntasks-per-node=1"],
    )
    state = slurm.wait([job], timeout=600)[job]
    out = (
        (tmp_path / "job.out").read_text()
        if (tmp_path / "job.out").exists()
        else "(no output file)"
    )
    assert state == "COMPLETED", out
    (tmp_path / "checkpoints" / "one.pt").write_bytes((runs.ckpts / f"{runs.one}.pt").read_bytes())
    return tmp_path, "pl_slurm", tmp_path / "checkpoints", "one"


# --- Lesson 07b's exercise (no training: checked against the fixture's log) ---------------------------
# (the solutions of lessons 07 and 07c need no run: tests/test_exercises.py checks them)


def test_the_sync_dist_exercise_solution_gives_what_lightning_logged(runs):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "solution_07b", ROOT / "notebooks" / "solutions" / "07b_lightning_launch_and_log.py"
    )
    s = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(s)
    means, counts = [2.0, 1.0], [256, 64]
    assert s.mean_of_means(means) == 1.5 and s.job_mean(means, counts) == pytest.approx(1.8)
    assert s.lightning_synced(means, counts) == pytest.approx(1.8)
    synced = records(runs.log_dir, runs.ddp, "lightning_sync")
    assert s.lightning_sync_check(synced) < TOLERANCE  # float64 runs


def test_the_gpu_readings_callback_logs_what_nvitop_reads_and_leaves_out_what_it_cannot():
    """On a GPU, --monitor logs nvitop's readings into TensorBoard (nvitop 1.7 has no Lightning callback of its own,
    trainup/engines/lightning_gpustats.py stands in); here with readings as nvitop gives them, one value missing (NA)."""
    from types import SimpleNamespace
    from trainup.engines.lightning_gpustats import NvitopGpuStats

    logged = []
    logger = SimpleNamespace(log_metrics=lambda m, step: logged.append((m, step)))
    readings = [
        dict(gpu=0, utilization_pct=87.0, memory_used_mb=512.0, memory_total_mb=81559.0),
        dict(gpu=1, utilization_pct=None, memory_used_mb=3.0, memory_total_mb=81559.0),
    ]
    callback = NvitopGpuStats(every=2, source=lambda: readings)
    for step, zero in (
        (3, True),
        (4, True),
        (4, False),
    ):  # step 3: not every 2nd; rank 1: never writes
        callback.on_train_batch_end(
            SimpleNamespace(is_global_zero=zero, global_step=step, logger=logger),
            None,
            None,
            None,
            0,
        )
    assert logged == [
        (
            {
                "gpu0/utilization_pct": 87.0,
                "gpu0/memory_used_mb": 512.0,
                "gpu1/memory_used_mb": 3.0,
            },
            4,
        )
    ]


def test_the_course_callback_keeps_its_log_when_lightning_sets_callback_log(tmp_path):
    """Lightning sets `callback.log = module.log` on every callback: the course's run log lives elsewhere,
    so on_exception still closes the run as failed (and the one-sentence refusal is not hidden)."""
    from types import SimpleNamespace
    from trainup.engines import lightning_log

    callback = lightning_log.CourseLog.__new__(lightning_log.CourseLog)
    written = []
    callback.run_log = SimpleNamespace(
        enabled=True, _file=SimpleNamespace(closed=False), summary=lambda **kw: written.append(kw)
    )
    callback.log = lambda *a, **kw: None  # what Lightning does
    callback.on_exception(None, None, RuntimeError("x"))
    assert written == [dict(checkpoint=None, status="failed")]


def test_a_run_refused_for_a_live_writer_leaves_the_live_runs_tensorboard_alone(tmp_path):
    """Another process writes run 'live' (it holds the run's lock): a second run of that name is refused in
    one sentence, and the live run's TensorBoard folder is still there."""
    import subprocess
    import sys
    from conftest import hold_lock

    log_dir = tmp_path / "logs"
    board = log_dir / "tensorboard" / "live"
    board.mkdir(parents=True)
    (board / "events.out").write_text("the live run's")
    holder = hold_lock(log_dir / "live.lock")
    try:
        proc = subprocess.run(
            [
                sys.executable,
                str(ROOT / "scripts" / "_trainup_lightning.py"),
                "--quick",
                "--accelerator",
                "cpu",
                "--run-name",
                "live",
                "--log-dir",
                str(log_dir),
                "--checkpoint-dir",
                str(tmp_path / "ckpt"),
                "--no-progress",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        holder.kill()
        holder.wait()
    assert_clean_error(proc, "is being written by another run")
    assert (board / "events.out").read_text() == "the live run's"


# --- Stopped by a signal inside an epoch, then --resume ------------------------------------------

# STOP_TINY's 8 steps an epoch (with dropout: only with the random states restored do the masks,
# and so the parameters, match): case -> (script, its flags, the run it must end equal to (None:
# none is claimed), who is signalled after which step, the sentence rank 0 prints)
LIGHTNING_TWO = ["--accelerator", "cpu", "--devices", "2", "--strategy", "ddp"]
STOPS = {
    # a scheduler's way: SIGTERM to the job's whole group, both ranks (Lightning's own handler
    # would hang them); its own launcher, rank 1 Lightning's child in rank 0's group
    "group": (SCRIPT, LIGHTNING_TWO, "two", stop_at(0, STOP_AT, "TERM", "group"), "SIGTERM"),
    # rank 1 alone (Lightning's own handler would miss it): rank 0 stops through the step rank 1
    # posted; in epoch 2, where Lightning's DistributedSampler shuffles by an epoch of its own
    "rank 1": (SCRIPT, LIGHTNING_TWO, "two", stop_at(1, 11), "a signal on another rank"),
    # one process (no agreement between ranks), the course's default --stop-signal, in epoch 2
    "alone": (SCRIPT, ["--accelerator", "cpu"], "one", stop_at(0, 11, "USR1"), "SIGUSR1"),
    # ModelParallelStrategy: Lightning's checkpoint is a folder of shards, put in place whole
    "sharded": (FSDP_SCRIPT, ["--accelerator", "cpu"], None, stop_at(0, STOP_AT), "SIGTERM"),
}


# the jobs in waves of at most 4 processes, each wave's started together: a stop's --resume in a
# wave after it, and the waves filled so that 2 Lightning ranks start beside 2 others
WAVES = [
    ["straight_two", "group"],
    ["rank 1", "resumed_group"],
    ["resumed_rank 1", "straight_one", "alone"],
    ["resumed_alone", "sharded"],
    ["resumed_sharded"],
]


@pytest.fixture(scope="module")
def stops(tmp_path_factory):
    """Every case of STOPS stopped, then resumed, beside the runs never stopped (one of 2 ranks,
    one of one process), in WAVES: {name: its finished job}, and the log folder."""
    tmp = tmp_path_factory.mktemp("lightning_stops")
    log_dir, site = tmp / "logs", tmp / "site"
    ckpts = log_dir / "checkpoints"

    def start(name):
        case = name.removeprefix("resumed_")
        script, flags, _, stop, _ = STOPS.get(case, (SCRIPT, None, None, {}, None))
        if name.startswith("straight_"):
            flags, stop = (
                (LIGHTNING_TWO if name == "straight_two" else ["--accelerator", "cpu"]),
                {},
            )
        run = name if name.startswith("straight_") else _name(case)
        cmd = [sys.executable, script, *STOP_TINY, *flags, "--run-name", run, *_out(log_dir)]
        if name.startswith("resumed_"):
            cmd, stop = [*cmd, "--resume"], {}
        return start_job(cmd, launch.environment(stop_site(site, **stop)))

    done = {}
    for wave in WAVES:
        jobs = {name: start(name) for name in wave}
        try:
            for name, job in jobs.items():
                done[name] = finish_job(job)
                if name in STOPS:  # what the stop left, before --resume
                    done[name].left = {
                        "log": report.read_run(log_dir / f"{_name(name)}.jsonl"),
                        "temporary": sorted(p.name for p in ckpts.glob(f".{_name(name)}-*")),
                        "saved": (ckpts / f"{_name(name)}-lightning.ckpt").exists(),
                    }
        finally:  # a failed wave leaves none of its jobs running
            for job in jobs.values():
                if job.poll() is None:
                    kill_tree(job.pid)
    return SimpleNamespace(
        log_dir=log_dir, ckpts=ckpts, **{k.replace(" ", "_"): v for k, v in done.items()}
    )


def _name(case):
    return "s_" + case.replace(" ", "_")


@pytest.mark.parametrize("case", list(STOPS))
def test_a_signal_inside_an_epoch_saves_exits_75_and_the_run_resumes_to_a_run_never_stopped(
    stops, case
):
    """Every rank stops before the same step; the course saves Lightning's checkpoint whole (a
    rename) and exits 75 (Lightning alone exits 0, unsaved), its log ending "stopped"; --resume
    goes on inside the epoch from the step it stopped after, with the random states of the stop,
    and ends with the parameters and the epochs' log lines of the run never stopped."""
    script, _, straight, _, said = STOPS[case]
    stopped = getattr(stops, case.replace(" ", "_"))
    resumed = getattr(stops, f"resumed_{case.replace(' ', '_')}")
    err = stopped.stderr
    assert stopped.returncode == preempt.STOPPED_EXIT, f"exit {stopped.returncode}\n{err[-3000:]}"
    epoch = 1 if STOPS[case][3]["TRAINUP_TEST_STOP_AT"].split(":")[1] == str(STOP_AT) else 2
    assert f"stopped by {said} at epoch {epoch}, step" in err, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    left = stopped.left
    assert left["saved"] and left["temporary"] == [], left  # no .tmp, no .old folder of shards
    assert left["log"]["summary"]["status"] == "stopped"  # as every course script logs a stop
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    logged = _epochs(stops.log_dir, _name(case))
    assert (
        report.read_run(stops.log_dir / f"{_name(case)}.jsonl")["summary"]["status"] == "finished"
    )
    assert [e[0] for e in logged] == [1, 2]  # the stopped epoch logged once, whole
    if straight is None:  # not claimed bit-identical (docs/how_it_works.md)
        return
    never = getattr(stops, f"straight_{straight}")
    assert never.returncode == 0, never.stderr[-3000:]
    assert never.stdout.count("epoch 1:") == 1  # one line an epoch: rank 0 alone prints
    mine, theirs = _name(case), f"straight_{straight}"
    assert_same_params(
        stopped_params(stops.ckpts / f"{mine}.pt"), stopped_params(stops.ckpts / f"{theirs}.pt")
    )
    # the resumed epoch's sums include the steps taken before the stop
    assert logged == _epochs(stops.log_dir, theirs)


def _epochs(log_dir, name):
    import json

    records = map(json.loads, (log_dir / f"{name}.jsonl").read_text().splitlines())
    return [
        (r["epoch"], r["loss"], r["accuracy"], r["samples"])
        for r in records
        if r["type"] == "epoch"
    ]


def test_early_stopping_top_k_checkpoints_the_learning_rate_and_device_statistics(tmp_path):
    """--early-stop 1 with a min_delta no loss can fall by: the test loss "stops improving" at the
    second epoch whatever the processor sums, so 2 of the 4 epochs run; --keep-best 2 keeps those
    two, named by their test loss; LearningRateMonitor writes Adadelta's rate, decayed each
    epoch; --monitor's DeviceStatsMonitor writes CPU statistics into the same TensorBoard run."""
    from lessons.bylesson import lightning

    logs = tmp_path / "logs"
    run_script(
        "_trainup_lightning.py",
        *TINY,
        "--epochs",
        4,
        "--keep-best",
        2,
        "--early-stop",
        1,
        "--early-stop-delta",
        100,
        "--monitor",
        "--run-name",
        "cb",
        log_dir=logs,
        checkpoint_dir=logs / "checkpoints",
    )
    run = report.read_run(logs / "cb.jsonl")
    assert run["problems"] == [] and run["summary"]["status"] == "finished"
    cb = lightning.callbacks("cb", logs, logs / "checkpoints")
    assert cb["asked"] == 4 and len(cb["losses"]) == 2  # EarlyStopping: epoch 2 fell by under 100
    assert list(cb["kept"]) == [1, 2]  # both epochs, each named by its test loss (4 decimals)
    assert list(cb["kept"].values()) == pytest.approx(cb["losses"], abs=1e-4)
    kept = sorted((logs / "checkpoints" / "cb-best").glob("*.ckpt"))
    newest = max(kept, key=lambda p: int(p.stem.split("-")[0][len("epoch") :]))  # saved last
    state = torch.load(newest, weights_only=False)["callbacks"]
    best = next(v for k, v in state.items() if k.startswith("ModelCheckpoint") and "test_loss" in k)
    assert float(best["best_model_score"]) == pytest.approx(min(cb["losses"]), rel=1e-6)
    args = cb["args"]
    assert cb["lr"] == pytest.approx([args["lr"] * args["gamma"] ** e for e in range(2)])
    tags = lightning.tensorboard_scalars("cb", logs)
    device = [t for t in tags if t.startswith("DeviceStatsMonitor")]
    assert device and tags[device[0]] and "train_loss_step" in tags, sorted(tags)
    monitor = [r for r in run["extra"] if r["type"] == "monitor"][0]
    assert monitor["callbacks"] == ["DeviceStatsMonitor"] and "skipped" in monitor["skipped"]
