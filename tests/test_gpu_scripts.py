"""Lessons 02 and 03: choosing devices, clear errors for missing GPUs, and real CPU runs of both scripts.

Device selection is tested against torch's own answers, and against a machine with GPUs by making
torch.cuda report some (selection logic only: nothing runs on them). The script runs are real, on the CPU.
"""
import pytest
import torch

from conftest import assert_clean_error, run_script
from lessons import gpu, report
from trainup import UserError, dataparallel, devices

NO_GPU = pytest.mark.skipif(gpu.has_gpu(), reason="this machine has GPUs, so the no-GPU errors cannot happen")


@pytest.fixture
def fake_gpus(monkeypatch):
    """torch.cuda says n GPUs exist (and set_device accepts them): only for the selection logic."""
    def install(n):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
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
    """Autocast is per thread: a replica run in another thread loses it unless its forward turns it on."""
    import threading
    net = torch.nn.Linear(4, 2)
    results = {}

    def in_a_thread(name, module):
        worker = threading.Thread(target=lambda: results.__setitem__(name, module(torch.ones(1, 4)).dtype))
        worker.start()
        worker.join()
    with devices.autocast("cpu", "bf16"):
        in_a_thread("plain", net)
        in_a_thread("wrapped", dataparallel.Autocast(net, "bf16"))
    assert results == {"plain": torch.float32, "wrapped": torch.bfloat16}
    assert dataparallel.Autocast(net, "32")(torch.ones(1, 4)).dtype == torch.float32


@NO_GPU
def test_asking_for_absent_gpus_is_one_sentence_and_a_nonzero_exit(log_dir):
    proc = run_script("_trainup_gpu.py", "--quick", "--device", "cuda", log_dir=log_dir, check=False)
    assert proc.returncode == 2
    assert_clean_error(proc, "--device cuda", "GPU")
    assert not list(log_dir.glob("*.jsonl"))  # it stopped before it began a log


def in_process(main, flags, capsys):
    """Run a script's main() here (faster than a new interpreter): its exit status and its stderr."""
    with pytest.raises(SystemExit) as exit:
        main(flags)
    return exit.value.code, capsys.readouterr().err.strip()


@NO_GPU
def test_data_parallel_without_the_gpus_asked_for_is_one_sentence(log_dir, capsys):
    import _trainup_dp
    for flags, words in [(["--gpus", "2"], ["--gpus 2", "has 0"]), (["--phases"], ["--phases", "2 or more"])]:
        status, err = in_process(_trainup_dp.main, ["--quick", "--log-dir", str(log_dir), *flags], capsys)
        assert status == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
        assert all(w in err for w in words), err
    assert not log_dir.exists()


def test_bad_lesson_flags_are_one_sentence(capsys):
    import _trainup_gpu
    for flags, words in [(["--sweep", "64,abc"], ["--sweep", "64,abc"]),
                         (["--workers", "-1"], ["--workers", "0 or more"]),
                         (["--precision", "8"], ["--precision", "invalid choice"]),
                         (["--dataset", "synthetic", "--resident"], ["--resident", "synthetic"])]:
        status, err = in_process(_trainup_gpu.parse_args, ["--quick", *flags], capsys)
        assert status == 2 and len(err.splitlines()) == 1, err
        assert all(w in err for w in words), err


def test_one_device_on_the_cpu_and_data_parallel_pass_through_train_the_same_model(log_dir):
    """The same flags give the same losses: without GPUs, nn.DataParallel just calls the model."""
    run_script("_trainup_gpu.py", "--quick", "--device", "cpu", "--run-name", "one", log_dir=log_dir)
    proc = run_script("_trainup_dp.py", "--quick", "--run-name", "dp", log_dir=log_dir)
    one, dp = report.read_run(log_dir / "one.jsonl"), report.read_run(log_dir / "dp.jsonl")
    for run in (one, dp):
        assert run["problems"] == [] and run["summary"]["status"] == "finished"
        assert run["epochs"][-1]["loss"] < run["epochs"][0]["loss"]
        assert run["env"]["device"] == "cpu"
        assert not [e for e in run["extra"] if e["type"] == "gpu"]  # no GPU, no samples, no error
    assert one["config"]["args"]["workers"] == 0
    if not gpu.has_gpu():
        assert "No GPU here, so this run trains on the CPU" in proc.stdout
        assert dp["config"]["args"]["gpus"] == 0 and dp["env"]["backend"] == "none"
        assert [e["loss"] for e in dp["epochs"]] == pytest.approx([e["loss"] for e in one["epochs"]], rel=1e-5)
    state = torch.load(log_dir / "checkpoints" / "dp.pt", weights_only=True)
    assert not any(k.startswith("module.") for k in state["model"])  # the model saved, not its wrapper


def test_bf16_and_two_loader_workers_on_the_cpu(log_dir):
    run_script("_trainup_gpu.py", "--quick", "--device", "cpu", "--precision", "bf16", "--workers", "2",
               "--run-name", "bf16", log_dir=log_dir)
    run = report.read_run(log_dir / "bf16.jsonl")
    assert run["problems"] == [] and run["config"]["args"]["precision"] == "bf16"
    assert run["config"]["args"]["workers"] == 2
    assert run["epochs"][-1]["loss"] < run["epochs"][0]["loss"]


def test_a_sweep_logs_throughput_for_each_batch_size_that_fits(log_dir):
    proc = run_script("_trainup_gpu.py", "--quick", "--device", "cpu", "--resident", "--sweep", "8,32,1024",
                      "--sweep-steps", "3", "--run-name", "sweep", log_dir=log_dir)
    run = report.read_run(log_dir / "sweep.jsonl")
    assert run["problems"] == [] and run["summary"]["status"] == "finished" and run["epochs"] == []
    sweeps = [e for e in run["extra"] if e["type"] == "sweep"]
    assert [s["batch_size"] for s in sweeps] == [8, 32]  # 1024 is more than the 512 quick samples
    assert all(s["steps"] == 3 and s["samples_per_s"] > 0 and s["step_s"] > 0 for s in sweeps)
    assert "batch size 1024: skipped" in proc.stdout
    assert report.check("sweep", log_dir) == "sweep: finished, 2 batch sizes measured, the log follows the schema."
    table = gpu.sweeps([log_dir / "sweep.jsonl"])
    assert list(table["batch_size"]) == [8, 32] and table["gpu_util_pct"].isna().all()

    # the same log, committed as a reference measured elsewhere: the lesson's tables say where it ran
    assert gpu.references("gpu_*", log_dir) == []
    assert "No reference logs matching gpu_*.jsonl have been committed yet" in gpu.about_references("gpu_*", log_dir)
    folder = log_dir / "reference" / "H100_2026-01-01"
    folder.mkdir(parents=True)
    (folder / "gpu_sweep.jsonl").write_text((log_dir / "sweep.jsonl").read_text())
    assert gpu.references("gpu_*", log_dir) == [folder / "gpu_sweep.jsonl"]
    assert "measured on H100_2026-01-01 (not here)" in gpu.about_references("gpu_*", log_dir)
    both = gpu.sweeps([log_dir / "sweep.jsonl", folder / "gpu_sweep.jsonl"])
    assert list(both["measured_on"]) == ["here", "here", "H100_2026-01-01", "H100_2026-01-01"]
    assert list(both["label"])[-1] == "sweep (H100_2026-01-01)"
    table = gpu.runs([folder / "gpu_sweep.jsonl"], log_dir)
    assert list(table["measured_on"]) == ["H100_2026-01-01"] and list(table["device"]) == ["cpu"]
