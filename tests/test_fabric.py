"""_trainup_fabric.py run for real: lesson 04's loop under Lightning Fabric, 2 CPU processes that
Fabric starts itself, against the course's one-process baseline; a run stopped after its first
epoch and resumed ends the same; what Fabric chose is logged; bad input is one sentence.
(Notebook 07 runs it under torchrun and proves the same.)"""

import sys
from types import SimpleNamespace

import pytest

from conftest import (
    ROOT,
    SCRIPTS,
    assert_clean_error,
    finish_job,
    in_process,
    notebook_or_own,
    run_script,
    start_baseline,
    start_job,
)
from lessons import checks, launch, report
from lessons.bylesson import gpu, lightning

SCRIPT = str(SCRIPTS / "_trainup_fabric.py")
# as the baseline (conftest.BASELINE): dropout off, float64, the global batch of 64
TINY = [
    "--quick",
    "--dropout",
    "0",
    "--no-progress",
    "--batch-size",
    "64",
    *checks.PROOF,
    "--accelerator",
    "cpu",
]
READS_NOTEBOOK = "notebooks/07_lightning.ipynb"  # its torchrun run l_fabric: the same flags
pytestmark = pytest.mark.filterwarnings("ignore:The `srun` command is available")


def _job(log_dir, name, *flags):
    return start_job(
        [
            sys.executable,
            SCRIPT,
            *TINY,
            "--devices",
            "2",
            "--run-name",
            name,
            "--log-dir",
            str(log_dir),
            "--checkpoint-dir",
            str(log_dir / "checkpoints"),
            *flags,
        ],
        launch.environment(),
    )


def ok(proc):
    assert proc.returncode == 0, (
        f"exit {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )
    return proc


@pytest.fixture(scope="module")
def runs(tmp_path_factory, request):
    """A run stopped after epoch 1, then resumed, that Fabric starts itself (--devices 2); beside
    it a whole run: notebook 07's (under torchrun, the same flags) where this session ran it, else
    this module's own, with the baseline."""
    log_dir = tmp_path_factory.mktemp("fabric") / "logs"
    first = _job(log_dir, "f_resumed", "--epochs", "1")

    def own():
        one, whole = start_baseline(tmp_path_factory, log_dir), _job(log_dir, "f_whole")
        for proc in (one, whole):
            ok(finish_job(proc))
        return dict(folder=log_dir, whole="f_whole", one="one", ckpts=log_dir / "checkpoints")

    def load():
        found = (ROOT / "logs" / "l_fabric.jsonl").exists()
        return found and dict(
            folder=ROOT / "logs", whole="l_fabric", one="l_one", ckpts=ROOT / "checkpoints"
        )

    ok(finish_job(first))
    resumed = _job(log_dir, "f_resumed", "--resume")
    made = notebook_or_own(request, READS_NOTEBOOK, load, own)
    ok(finish_job(resumed))
    if made["one"] != "one":  # the resumed run's baseline: the notebook's
        ckpt = log_dir / "checkpoints" / "one.pt"
        ckpt.write_bytes((made["ckpts"] / f"{made['one']}.pt").read_bytes())
    return SimpleNamespace(log_dir=log_dir, **made)


def test_fabric_on_two_processes_ends_like_one_process_and_so_does_a_resumed_run(runs):
    resumed = (runs.log_dir, "f_resumed", runs.log_dir / "checkpoints", "one")
    for folder, name, ckpts, one in ((runs.folder, runs.whole, runs.ckpts, runs.one), resumed):
        checks.learned(name, log_dir=folder)
        worst = checks.same_parameters(name, one, atol=checks.FLOAT64_ATOL, checkpoint_dir=ckpts)
        assert worst <= checks.FLOAT64_ATOL
    one, whole = (report.read_run(runs.folder / f"{n}.jsonl") for n in (runs.one, runs.whole))
    for e1, e2 in zip(one["epochs"], whole["epochs"], strict=True):
        assert e2["samples"] == e1["samples"] == 512  # the whole set each epoch, summed over ranks
        assert e2["loss"] == pytest.approx(e1["loss"], abs=checks.FLOAT64_ATOL)
        assert e2["test_accuracy"] == pytest.approx(e1["test_accuracy"], abs=1e-12)
    resumed = report.read_run(runs.log_dir / "f_resumed.jsonl")
    # one log: the first epoch, then the resumed run's second
    assert [e["epoch"] for e in resumed["epochs"]] == [1, 2]
    assert resumed["epochs"][1]["loss"] == pytest.approx(
        whole["epochs"][1]["loss"], abs=checks.FLOAT64_ATOL
    )


def test_fabric_started_two_processes_ran_ddp_and_put_in_a_distributed_sampler(runs):
    chose = lightning.fabric_setup("f_resumed", log_dir=runs.log_dir)
    assert chose == dict(
        strategy="DDPStrategy",
        launcher="LightningEnvironment",
        accelerator="CPUAccelerator",
        precision="DoublePrecision",
        num_nodes=1,
        devices=2,
        world_size=2,
        sampler="DistributedSampler",
    )
    assert report.read_run(runs.log_dir / "f_resumed.jsonl")["env"]["backend"] == "gloo"


def test_one_process_keeps_its_loader_and_learns(tmp_path):
    """No --devices: one process, no group, Fabric's single-device strategy; the script still
    sums its metrics through fabric.all_reduce (there, the value itself)."""
    run_script(
        "_trainup_fabric.py", "--quick", "--no-progress", "--run-name", "f_one", log_dir=tmp_path
    )
    chose = lightning.fabric_setup("f_one", log_dir=tmp_path)
    assert (chose["strategy"], chose["world_size"], chose["launcher"]) == (
        "SingleDeviceStrategy",
        1,
        "none",
    )
    checks.learned("f_one", log_dir=tmp_path)


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--strategy", "nonsense"], ["Fabric refuses these flags", "nonsense"]),
        pytest.param(
            ["--accelerator", "gpu"],
            ["needs an NVIDIA GPU"],
            marks=pytest.mark.skipif(
                gpu.has_gpu(), reason="this machine has a GPU, so the no-GPU sentence cannot happen"
            ),
        ),
        (["--resident"], ["unrecognized arguments", "--resident"]),
    ],
)
def test_bad_flags_are_one_sentence(flags, words, capsys, tmp_path):
    import _trainup_fabric

    proc = in_process(_trainup_fabric.main, ["--quick", *flags, "--log-dir", str(tmp_path)], capsys)
    assert proc.returncode == 2
    assert_clean_error(proc, *words)


def test_an_uneven_global_batch_is_one_sentence_before_a_process_starts(capsys, tmp_path):
    import _trainup_fabric

    proc = in_process(
        _trainup_fabric.main,
        [
            *TINY,
            "--devices",
            "2",
            "--batch-size",
            "63",
            "--run-name",
            "f_uneven",
            "--log-dir",
            str(tmp_path),
        ],
        capsys,
    )
    assert_clean_error(proc, "--batch-size 63", "split evenly over 2 processes")
    assert not (tmp_path / "f_uneven.jsonl").exists()  # nothing half-written
