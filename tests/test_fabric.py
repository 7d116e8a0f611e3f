"""_trainup_fabric.py run for real: lesson 04's loop under Lightning Fabric, 2 CPU processes that
Fabric starts itself, against the course's one-process baseline; a run stopped after its first
epoch and resumed ends the same; what Fabric chose is logged; bad input is one sentence.
(Notebook 07 runs it under torchrun and proves the same.)"""
import sys

import pytest

from conftest import (SCRIPTS, assert_clean_error, finish_job, in_process, run_script,
                      start_baseline, start_job)
from lessons import checks, launch, lightning, report

SCRIPT = str(SCRIPTS / "_trainup_fabric.py")
# as the baseline (conftest.BASELINE): dropout off, float64, the global batch of 64
TINY = ["--quick", "--dropout", "0", "--no-progress", "--batch-size", "64", *checks.PROOF,
        "--accelerator", "cpu"]
pytestmark = pytest.mark.filterwarnings("ignore:The `srun` command is available")


def _job(log_dir, name, *flags):
    return start_job([sys.executable, SCRIPT, *TINY, "--devices", "2", "--run-name", name,
                      "--log-dir", str(log_dir), "--checkpoint-dir", str(log_dir / "checkpoints"),
                      *flags], launch.environment())


def ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The baseline, a whole Fabric run and one stopped after epoch 1, side by side; then that one
    resumed."""
    log_dir = tmp_path_factory.mktemp("fabric") / "logs"
    one = start_baseline(tmp_path_factory, log_dir)
    whole, first = _job(log_dir, "f_whole"), _job(log_dir, "f_resumed", "--epochs", "1")
    ok(finish_job(first))
    resumed = _job(log_dir, "f_resumed", "--resume")
    for proc in (one, whole, resumed):
        ok(finish_job(proc))
    return log_dir


def test_fabric_on_two_processes_ends_like_one_process_and_so_does_a_resumed_run(runs):
    for name in ("f_whole", "f_resumed"):
        checks.learned(name, log_dir=runs)
        worst = checks.same_parameters(name, "one", atol=checks.FLOAT64_ATOL,
                                       checkpoint_dir=runs / "checkpoints")
        assert worst <= checks.FLOAT64_ATOL
    one, whole = (report.read_run(runs / f"{n}.jsonl") for n in ("one", "f_whole"))
    for e1, e2 in zip(one["epochs"], whole["epochs"], strict=True):
        assert e2["samples"] == e1["samples"] == 512  # the whole set each epoch, summed over ranks
        assert e2["loss"] == pytest.approx(e1["loss"], abs=checks.FLOAT64_ATOL)
        assert e2["test_accuracy"] == pytest.approx(e1["test_accuracy"], abs=1e-12)
    resumed = report.read_run(runs / "f_resumed.jsonl")
    # one log: the first epoch, then the resumed run's second
    assert [e["epoch"] for e in resumed["epochs"]] == [1, 2]
    assert resumed["epochs"][1]["loss"] == pytest.approx(whole["epochs"][1]["loss"],
                                                         abs=checks.FLOAT64_ATOL)


def test_fabric_started_two_processes_ran_ddp_and_put_in_a_distributed_sampler(runs):
    chose = lightning.fabric_setup("f_whole", log_dir=runs)
    assert chose == dict(strategy="DDPStrategy", launcher="LightningEnvironment",
                         accelerator="CPUAccelerator", precision="DoublePrecision", num_nodes=1,
                         devices=2, world_size=2, sampler="DistributedSampler")
    assert report.read_run(runs / "f_whole.jsonl")["env"]["backend"] == "gloo"


def test_one_process_keeps_its_loader_and_learns(tmp_path):
    """No --devices: one process, no group, Fabric's single-device strategy; the script still
    sums its metrics through fabric.all_reduce (there, the value itself)."""
    run_script("_trainup_fabric.py", "--quick", "--no-progress", "--run-name", "f_one",
               log_dir=tmp_path)
    chose = lightning.fabric_setup("f_one", log_dir=tmp_path)
    assert (chose["strategy"], chose["world_size"], chose["launcher"]) == (
        "SingleDeviceStrategy", 1, "none")
    checks.learned("f_one", log_dir=tmp_path)


@pytest.mark.parametrize("flags, words", [
    (["--strategy", "nonsense"], ["Fabric refuses these flags", "nonsense"]),
    (["--accelerator", "gpu"], ["needs an NVIDIA GPU"]),
    (["--resident"], ["unrecognized arguments", "--resident"]),
])
def test_bad_flags_are_one_sentence(flags, words, capsys, tmp_path):
    import _trainup_fabric
    proc = in_process(_trainup_fabric.main, ["--quick", *flags, "--log-dir", str(tmp_path)], capsys)
    assert proc.returncode == 2
    assert_clean_error(proc, *words)


def test_an_uneven_global_batch_is_one_sentence_before_a_process_starts(tmp_path):
    proc = finish_job(_job(tmp_path, "f_uneven", "--batch-size", "63"))
    assert_clean_error(proc, "--batch-size 63", "split evenly over 2 processes")
    assert not (tmp_path / "f_uneven.jsonl").exists()  # nothing half-written
