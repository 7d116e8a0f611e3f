"""Lessons 02 and 03: choosing devices, clear errors for missing GPUs, and real CPU runs of both scripts.

Device selection is tested against torch's own answers, and against a machine with GPUs by making
torch.cuda report some (selection logic only: nothing runs on them). The script runs are real, on the CPU.
"""

import json

import pytest
import torch
import torch.nn.functional as F

from conftest import (
    DAY,
    BASELINE,
    SCRIPTS,
    assert_clean_error,
    finish_job,
    finish_script,
    in_process,
    run_script,
    start_baseline,
    start_script,
)
from lessons import checks, report
from lessons.bylesson import gpu
from trainup import UserError, devices
from trainup.parallel import dataparallel

NO_GPU = pytest.mark.skipif(
    gpu.has_gpu(), reason="this machine has GPUs, so the no-GPU errors cannot happen"
)
GPU = pytest.mark.skipif(not gpu.has_gpu(), reason="needs an NVIDIA GPU: the scripts' CUDA paths")
TWO_GPUS = pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs 2 NVIDIA GPUs: DataParallel's split"
)


def epochs_logged(path):
    """Every epoch record of a log, in order (report.read_run keeps only the last of each epoch)."""
    return [
        r["epoch"] for r in map(json.loads, path.read_text().splitlines()) if r["type"] == "epoch"
    ]


@pytest.fixture
def fake_gpus(monkeypatch):
    """torch.cuda says n GPUs exist (and set_device accepts them): only for the selection logic."""

    def install(n):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Fake GPU")
        monkeypatch.setattr(
            torch.cuda, "get_device_capability", lambda i=0: (9, 0)
        )  # an H100: new enough

    return install


def test_pick_follows_the_request_and_what_exists(fake_gpus):
    assert devices.pick("cpu") == torch.device("cpu")
    fake_gpus(0)
    assert devices.pick("auto") == torch.device("cpu")
    with pytest.raises(UserError, match="--device cuda needs an NVIDIA GPU"):
        devices.pick("cuda")
    fake_gpus(2)
    assert devices.pick("auto") == torch.device("cuda", 0)
    assert devices.pick("cpu") == torch.device("cpu")
    assert devices.pick("cuda", local_rank=1) == torch.device("cuda", 1)
    with pytest.raises(UserError, match="only 2 GPU"):
        devices.pick("cuda", local_rank=2)


def test_a_node_s_processes_share_no_gpu(fake_gpus, capsys):
    """--device auto takes GPUs only where each of a node's processes gets one (on a 1-GPU H100,
    two ranks both on GPU 0 ended in NCCL's "Duplicate GPU detected"); rank 0 of the
    node says why; --device cuda with too few is one sentence on every rank."""
    from trainup import distributed

    ctx = lambda rank, n, launcher="torchrun": distributed.Context(  # noqa: E731
        rank=rank, world_size=n, local_rank=rank, local_world_size=n, launcher=launcher
    )
    fake_gpus(1)
    assert distributed.node_device(ctx(0, 2), "auto", env={}) == ("cpu", 0)
    assert capsys.readouterr().err == (
        "note: This job's 2 processes would need 2 GPUs, one each, and this machine has 1: it "
        "runs on 2 CPU processes instead.\n"
    )
    assert distributed.node_device(ctx(1, 2), "auto", env={}) == ("cpu", 1)
    assert capsys.readouterr().err == ""  # said once a node
    for rank in (0, 1):
        with pytest.raises(UserError, match="--device cuda with 2 processes on this node needs 2"):
            distributed.node_device(ctx(rank, 2), "cuda", env={})
    assert distributed.node_device(ctx(0, 1), "auto", env={}) == ("cuda", 0)
    # srun --gpus-per-task=1: each task sees its own GPU, as GPU 0
    bound = {"SLURM_GPUS_PER_TASK": "1"}
    assert distributed.node_device(ctx(1, 4, "slurm"), "auto", env=bound) == ("auto", 0)
    assert distributed.node_device(ctx(1, 4, "slurm"), "auto", env={}) == ("cpu", 1)
    fake_gpus(2)
    assert distributed.node_device(ctx(1, 2), "auto", env={}) == ("cuda", 1)
    assert distributed.node_device(ctx(1, 2), "cpu", env={}) == ("cpu", 1)
    fake_gpus(0)  # no GPU: auto stays auto (devices.pick says whether a driver is missing)
    assert distributed.node_device(ctx(1, 2), "auto", env={}) == ("auto", 1)
    assert capsys.readouterr().err == ""


def test_lightning_s_auto_accelerator_is_the_same_decision(fake_gpus, monkeypatch, capsys):
    from types import SimpleNamespace
    from trainup.engines import lightning_flags

    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(k, raising=False)
    args = lambda acc, devices=None: SimpleNamespace(  # noqa: E731
        accelerator=acc, devices=devices, num_nodes=None, sync_batchnorm=False
    )
    fake_gpus(1)
    assert lightning_flags.accelerator(args("auto")) == "cuda"
    assert lightning_flags.accelerator(args("auto", "2")) == "cpu"
    assert "would need 2 GPUs, one each, and this machine has 1" in capsys.readouterr().err
    monkeypatch.setenv("RANK", "1"), monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1"), monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    assert lightning_flags.accelerator(args("auto")) == "cpu"  # torchrun's 2 workers on 1 GPU
    assert capsys.readouterr().err == ""  # local rank 0 says it
    assert lightning_flags.accelerator(args("gpu")) == "cuda"  # named: Lightning's own sentence
    fake_gpus(0)
    assert lightning_flags.accelerator(args("auto", "2")) == "auto"


def test_require_gpus_counts_what_exists(fake_gpus):
    fake_gpus(0)
    assert devices.require_gpus(0) == []
    with pytest.raises(UserError, match="--gpus 2 asks for 2 GPU.*has 0"):
        devices.require_gpus(2)
    fake_gpus(4)
    assert devices.require_gpus(3) == [0, 1, 2]
    with pytest.raises(UserError, match="has 4"):
        devices.require_gpus(8)


def test_data_parallel_takes_every_gpu_by_default_and_the_cpu_when_there_is_none(fake_gpus):
    fake_gpus(0)
    device, ids, sentence = dataparallel.choose()
    assert device == torch.device("cpu") and ids == [] and "CPU" in sentence
    with pytest.raises(UserError, match="--gpus 2"):
        dataparallel.choose(2)
    fake_gpus(4)
    assert dataparallel.choose()[:2] == (torch.device("cuda", 0), [0, 1, 2, 3])
    assert dataparallel.choose(2)[:2] == (torch.device("cuda", 0), [0, 1])
    with pytest.raises(UserError, match="has 4"):
        dataparallel.choose(5)


def test_mixed_precision_contexts():
    with devices.autocast("cpu", "bf16"):
        assert torch.ones(2, 2).matmul(torch.ones(2, 2)).dtype == torch.bfloat16
    with devices.autocast("cpu", "32"):
        assert torch.ones(2, 2).matmul(torch.ones(2, 2)).dtype == torch.float32


def test_autocast_reaches_the_threads_data_parallel_runs_replicas_in():
    """Autocast's state is per thread: a plain thread starts without it (DataParallel's
    parallel_apply enters it again, but without the dtype), so the replica's forward turns it
    on with the dtype asked."""
    import threading

    net = torch.nn.Linear(4, 2)
    results = {}

    def in_a_thread(name, module):
        worker = threading.Thread(
            target=lambda: results.__setitem__(name, module(torch.ones(1, 4)).dtype)
        )
        worker.start()
        worker.join()

    with devices.autocast("cpu", "bf16"):
        in_a_thread("plain", net)
        in_a_thread("wrapped", dataparallel.Autocast(net, "bf16"))
    assert results == {"plain": torch.float32, "wrapped": torch.bfloat16}
    assert dataparallel.Autocast(net, "32")(torch.ones(1, 4)).dtype == torch.float32


@NO_GPU
def test_asking_for_absent_gpus_is_one_sentence_and_a_nonzero_exit(log_dir, capsys):
    import _trainup_gpu

    proc = in_process(
        _trainup_gpu.main, ["--quick", "--device", "cuda", "--log-dir", log_dir], capsys
    )
    assert proc.returncode == 2
    assert_clean_error(proc, "--device cuda", "GPU")
    assert not list(log_dir.glob("*.jsonl"))  # it stopped before it began a log


@NO_GPU
def test_data_parallel_without_the_gpus_asked_for_is_one_sentence(log_dir, capsys):
    import _trainup_dp

    for flags, words in [
        (["--gpus", "2"], ["--gpus 2", "has 0"]),
        (["--phases"], ["--phases", "2 or more"]),
    ]:
        proc = in_process(_trainup_dp.main, ["--quick", "--log-dir", str(log_dir), *flags], capsys)
        assert proc.returncode == 2 and proc.stderr.startswith("error: "), proc.stderr
        assert_clean_error(proc, *words)
    assert not log_dir.exists()


def test_bad_lesson_flags_are_one_sentence(capsys):
    import _trainup_gpu

    for flags, words in [
        (["--sweep", "64,abc"], ["--sweep", "64,abc"]),
        (["--workers", "-1"], ["--workers", "0 or more"]),
        (["--precision", "8"], ["--precision", "invalid choice"]),
        (["--dataset", "synthetic", "--resident"], ["--resident", "synthetic"]),
    ]:
        proc = in_process(_trainup_gpu.parse_args, ["--quick", *flags], capsys)
        assert proc.returncode == 2
        assert_clean_error(proc, *words)


def test_one_device_on_the_cpu_and_data_parallel_pass_through_train_the_same_model(
    log_dir, tmp_path_factory
):
    """The same flags give the same losses: without GPUs, nn.DataParallel just calls the model. The
    DataParallel run stops after one epoch and resumes (--resume): it must still match, epoch for epoch.
    The one-device run (the session's baseline, the same flags) goes beside the DataParallel one's
    two parts."""
    # dropout draws from the RNG, which a checkpoint does not keep; float64: no summation order matters
    flags = ["--quick", "--dropout", "0", "--batch-size", "64", *checks.PROOF]
    assert sorted(BASELINE) == sorted([*flags, "--device", "cpu"])  # the flags it was made with
    one = start_baseline(tmp_path_factory, log_dir)
    finish_script(
        start_script("_trainup_dp.py", *flags, "--epochs", "1", "--run-name", "dp", log_dir=log_dir)
    )
    proc = finish_script(
        start_script(
            "_trainup_dp.py",
            *flags,
            "--epochs",
            "2",
            "--resume",
            "--run-name",
            "dp",
            log_dir=log_dir,
        )
    )
    assert finish_job(one).returncode == 0
    one, dp = report.read_run(log_dir / "one.jsonl"), report.read_run(log_dir / "dp.jsonl")
    for run in (one, dp):
        assert run["problems"] == [] and run["summary"]["status"] == "finished"
        assert run["epochs"][-1]["loss"] < run["epochs"][0]["loss"]
    assert one["env"]["device"] == "cpu" and not [e for e in one["extra"] if e["type"] == "gpu"]
    assert one["config"]["args"]["workers"] == 0
    assert epochs_logged(log_dir / "dp.jsonl") == [1, 2]  # the resumed run ran epoch 2 only
    if not gpu.has_gpu():
        assert "No GPU here, so this run trains on the CPU" in proc.stdout
        assert dp["env"]["device"] == "cpu" and not [e for e in dp["extra"] if e["type"] == "gpu"]
        assert dp["config"]["args"]["gpus"] == 0 and dp["env"]["backend"] == "none"
        assert [e["loss"] for e in dp["epochs"]] == pytest.approx(
            [e["loss"] for e in one["epochs"]], rel=0, abs=checks.FLOAT64_ATOL
        )
    else:  # every GPU, and its samples
        assert dp["env"]["device"] == "cuda:0" and [e for e in dp["extra"] if e["type"] == "gpu"]
    state = torch.load(log_dir / "checkpoints" / "dp.pt", weights_only=True)
    assert not any(
        k.startswith("module.") for k in state["model"]
    )  # the model saved, not its wrapper


# float16 on the CPU trains at about 20 samples a second here (oneDNN's float16 kernels): 128
# samples an epoch (2 steps) learn enough to show it, in a few seconds
FP16 = [
    "--quick",
    "--device",
    "cpu",
    "--precision",
    "16",
    "--run-name",
    "fp16",
    "--train-size",
    "128",
]


@pytest.fixture(scope="module")
def cpu_runs(tmp_path_factory):
    """The CPU runs of the tests below that depend on no other, started together (most of each is starting
    Python and importing torch, on one core); then the fp16 run's resumed second epoch. Their stdout by name."""
    log_dir = tmp_path_factory.mktemp("gpu_scripts") / "logs"
    procs = dict(
        bf16=start_script(
            "_trainup_gpu.py",
            "--quick",
            "--device",
            "cpu",
            "--precision",
            "bf16",
            "--workers",
            "2",
            "--run-name",
            "bf16",
            log_dir=log_dir,
        ),
        sweep=start_script(
            "_trainup_gpu.py",
            "--quick",
            "--device",
            "cpu",
            "--resident",
            "--sweep",
            "8,32,1024",
            "--sweep-steps",
            "3",
            "--run-name",
            "sweep",
            log_dir=log_dir,
        ),
        dpsweep=start_script(
            "_trainup_dp.py",
            "--quick",
            "--sweep",
            "8,16",
            "--sweep-steps",
            "2",
            "--run-name",
            "dpsweep",
            log_dir=log_dir,
        ),
        fp16=start_script("_trainup_gpu.py", *FP16, "--epochs", "1", log_dir=log_dir),
    )
    out = {name: finish_script(proc).stdout for name, proc in procs.items()}
    # the scaler's state after epoch 1, before the resumed run replaces the checkpoint
    out["fp16_scaler"] = torch.load(log_dir / "checkpoints" / "fp16.pt", weights_only=True)[
        "scaler"
    ]
    out["fp16_resumed"] = finish_script(
        start_script("_trainup_gpu.py", *FP16, "--epochs", "2", "--resume", log_dir=log_dir)
    ).stdout
    return log_dir, out


def test_bf16_and_two_loader_workers_on_the_cpu(cpu_runs):
    log_dir, _ = cpu_runs
    run = report.read_run(log_dir / "bf16.jsonl")
    assert run["problems"] == [] and run["config"]["args"]["precision"] == "bf16"
    assert run["config"]["args"]["workers"] == 2
    assert run["epochs"][-1]["loss"] < run["epochs"][0]["loss"]


def test_a_sweep_logs_throughput_for_each_batch_size_that_fits(cpu_runs, tmp_path):
    runs, out = cpu_runs
    log_dir = (
        tmp_path / "logs"
    )  # this test adds reference logs beside the run's: a folder of its own
    log_dir.mkdir()
    for f in ("sweep.jsonl", "sweep.stdout"):
        (log_dir / f).write_text((runs / f).read_text())
    run = report.read_run(log_dir / "sweep.jsonl")
    assert run["problems"] == [] and run["summary"]["status"] == "finished" and run["epochs"] == []
    sweeps = [e for e in run["extra"] if e["type"] == "sweep"]
    assert [s["batch_size"] for s in sweeps] == [8, 32]  # 1024 is more than the 512 quick samples
    assert all(s["steps"] == 3 and s["samples_per_s"] > 0 and s["step_s"] > 0 for s in sweeps)
    assert "batch size 1024: skipped" in out["sweep"]
    assert (
        report.check("sweep", log_dir)
        == "sweep: finished, 2 batch sizes measured, the log follows the schema."
    )
    table = gpu.sweeps([log_dir / "sweep.jsonl"])
    assert list(table["batch_size"]) == [8, 32] and table["gpu_util_pct"].isna().all()

    # the same log, committed as a reference measured elsewhere: the lesson's tables say where it ran
    assert gpu.references("gpu_*", log_dir) == []
    assert "No reference logs matching gpu_*.jsonl have been committed yet" in gpu.about_references(
        "gpu_*", log_dir
    )
    folder = log_dir / "reference" / f"H100_{DAY}"
    folder.mkdir(parents=True)
    (folder / "gpu_sweep.jsonl").write_text((log_dir / "sweep.jsonl").read_text())
    assert gpu.references("gpu_*", log_dir) == [folder / "gpu_sweep.jsonl"]
    assert f"measured on H100_{DAY} (not here)" in gpu.about_references("gpu_*", log_dir)
    both = gpu.sweeps([log_dir / "sweep.jsonl", folder / "gpu_sweep.jsonl"])
    assert list(both["measured_on"]) == ["here", "here", f"H100_{DAY}", f"H100_{DAY}"]
    assert list(both["label"])[-1] == f"sweep (H100_{DAY})"
    table = gpu.runs([folder / "gpu_sweep.jsonl"], log_dir)
    assert list(table["measured_on"]) == [f"H100_{DAY}"] and list(table["device"]) == ["cpu"]


def test_fp16_with_its_grad_scaler_trains_on_the_cpu_and_resumes_with_its_loss_scale(cpu_runs):
    """--precision 16: autocast to float16 and a GradScaler, here on the CPU (torch has both there)."""
    log_dir, out = cpu_runs
    saved = out["fp16_scaler"]  # after epoch 1
    assert (
        saved["scale"] > 0 and saved["_growth_tracker"] >= 0
    )  # the scaler's state is in the checkpoint
    run = report.read_run(log_dir / "fp16.jsonl")
    assert run["problems"] == [] and run["config"]["args"]["precision"] == "16"
    assert epochs_logged(log_dir / "fp16.jsonl") == [1, 2]
    assert run["epochs"][-1]["test_accuracy"] > 0.3  # learned, in half precision; chance is 0.1


def test_the_test_loss_is_computed_in_fp32_from_half_precision_logits():
    """Autocast's own cross-entropy runs in fp32; a loss taken outside it from bf16/fp16 logits would be
    rounded to 3 significant digits. Float64 logits keep their precision (the proofs)."""
    from trainup import evaluation

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 10))
    x, y = torch.randn(64, 4, 4), torch.randint(0, 10, (64,))
    meter = evaluation.evaluate(net, [(x, y)], torch.device("cpu"), "bf16")
    with devices.autocast("cpu", "bf16"), torch.no_grad():
        logits = net(x)
    assert logits.dtype == torch.bfloat16
    # the same float32 losses, summed per sample and divided again: a few float32 roundings (6e-8 each)
    assert meter.mean_loss == pytest.approx(F.cross_entropy(logits.float(), y).item(), rel=1e-6)
    net64, x64 = net.double(), x.double()
    exact = F.cross_entropy(net64(x64), y).item()
    assert evaluation.evaluate(net64, [(x64, y)], "cpu", "64").mean_loss == pytest.approx(
        exact, rel=1e-15, abs=0
    )


SCRIPTS_EVALUATING = [
    "_trainup_cpu",
    "_trainup_hogwild",
    "_trainup_gpu",
    "_trainup_dp",
    "_trainup_ddp",
    "_trainup_horovod",
    "_trainup_blocks",
    "_trainup_fsdp",
    "_trainup_tp",
]


@pytest.mark.parametrize("script", SCRIPTS_EVALUATING)
def test_every_script_evaluates_with_the_one_shared_copy(script):
    """One evaluate for every script (copies drifted before: Horovod's lost the fp32 cast)."""
    import importlib
    from trainup import evaluation

    text = (SCRIPTS / f"{script}.py").read_text()
    assert "def evaluate(" not in text and "evaluation.evaluate(" in text, script
    if script != "_trainup_horovod":  # importing it needs Horovod: the text is the check there
        assert importlib.import_module(script).evaluation is evaluation


def test_a_sweep_of_the_data_parallel_script(cpu_runs):
    log_dir, _ = cpu_runs
    run = report.read_run(log_dir / "dpsweep.jsonl")
    assert run["problems"] == [] and run["summary"]["status"] == "finished" and run["epochs"] == []
    sweeps = [e for e in run["extra"] if e["type"] == "sweep"]
    assert [s["batch_size"] for s in sweeps] == [8, 16] and all(
        s["samples_per_s"] > 0 for s in sweeps
    )


def test_a_gpu_too_old_for_the_cuda_build_is_one_sentence_with_what_to_install():
    cuda13 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    sentence = devices.too_old([("Tesla V100-SXM2-32GB", (7, 0))], cuda13, "13.0")
    assert "Tesla V100-SXM2-32GB (compute capability 7.0) is too old" in sentence
    assert (
        "7.5 and newer" in sentence and devices.OLDER_CUDA_INDEX in sentence and "cu126" in sentence
    )
    assert len(sentence.splitlines()) == 1
    assert devices.too_old([("T4", (7, 5)), ("H100", (9, 0))], cuda13, "13.0") is None
    assert devices.too_old([("P100", (6, 0))], ["sm_50", "sm_60", "sm_70", "sm_90"], "12.6") is None
    assert (
        devices.too_old([("H100", (9, 0))], [], None) is None
    )  # a CPU-only torch has no arch list


def test_a_too_old_gpu_stops_a_script_with_that_sentence(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(
        devices, "too_old", lambda: "GPU P100 (compute capability 6.0) is too old for this torch"
    )
    with pytest.raises(UserError, match="P100 .* too old.*; or use --device cpu"):
        devices.pick("auto")


@GPU
def test_on_a_gpu_fp16_trains_and_the_gpu_is_sampled(log_dir):
    run_script(
        "_trainup_gpu.py",
        "--quick",
        "--device",
        "cuda",
        "--precision",
        "16",
        "--workers",
        "2",
        "--run-name",
        "cuda16",
        log_dir=log_dir,
    )
    run = report.read_run(log_dir / "cuda16.jsonl")
    assert run["problems"] == [] and run["env"]["device"] == "cuda:0"
    assert run["epochs"][-1]["loss"] < run["epochs"][0]["loss"]
    assert [e for e in run["extra"] if e["type"] == "gpu"] and not [
        e for e in run["extra"] if e["type"] == "gpumon"
    ]
    assert devices.too_old() is None


@TWO_GPUS
def test_on_two_gpus_data_parallel_times_its_phases_in_the_precision_asked(log_dir):
    run_script(
        "_trainup_dp.py",
        "--quick",
        "--gpus",
        "2",
        "--precision",
        "16",
        "--phases",
        "--run-name",
        "dp2",
        log_dir=log_dir,
    )
    run = report.read_run(log_dir / "dp2.jsonl")
    phases = [e for e in run["extra"] if e["type"] == "dp_phases"]
    assert run["problems"] == [] and len(phases) == 1 and phases[0]["gpus"] == 2


def test_gpu_throughput_leaves_out_the_first_epoch(tmp_path):
    """The committed H100 reference: its first epoch pays for start-up (the loader's workers), so
    lessons 02 and 03 use steady state, samples over seconds of the later epochs; a one-epoch run
    has only that epoch. The first epoch is shown on its own, without a direction."""
    from trainup.meter import steady_rate

    path = gpu.references("gpu_cuda")[0]
    epochs = report.read_run(path)["epochs"]
    later = epochs[1:]
    assert (
        gpu.warm_throughput(path)
        == pytest.approx(sum(e["samples"] for e in later) / sum(e["wall_s"] for e in later))
        == steady_rate(epochs)
    )
    table = gpu.runs([path])
    assert table["samples_per_s"][0] == gpu.warm_throughput(path) > epochs[0]["samples_per_s"]
    assert table["run_samples_per_s"][0] == pytest.approx(steady_rate(epochs))
    [said] = gpu.first_epochs(table)
    assert f"its first epoch took {epochs[0]['wall_s']:.2f} s" in said
    assert "DataLoader worker" in said and "faster" not in said
    one = tmp_path / "one.jsonl"  # the same log cut after its first epoch
    kept = [
        line
        for line in path.read_text().splitlines()
        if json.loads(line).get("type") != "epoch" or json.loads(line)["epoch"] == 1
    ]
    one.write_text("\n".join(kept) + "\n")
    assert gpu.warm_throughput(one) == pytest.approx(epochs[0]["samples"] / epochs[0]["wall_s"])
    assert gpu.first_epochs(gpu.runs([one])) == []


def test_the_dataparallel_picture_draws_torchs_steps_and_chunks_pieces():
    step = gpu.dp_step(batch=6, gpus=4)
    assert (
        step["pieces"] == [2, 2, 2, 0] and step["replicas"] == 3
    )  # replicate: only GPUs with a piece
    fig = gpu.plot_dp_step(step, "test_dp_step")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == list(gpu.DP_STEPS)
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"GPU {g}" for g in range(4)]
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("nothing") == 4 and texts.count("2 samples copied here") == 3
    assert "a batch of 6 on 4 GPUs" in ax.get_title() and "optimizer" in ax.get_xlabel()
