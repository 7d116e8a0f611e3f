"""Where each lesson's job runs: one decision (lessons/placement.py) for 0 to 8 GPUs, and every launcher
of the lessons goes through it."""

import json
import re

import pytest

from conftest import ROOT
from lessons import launch, placement, report
from lessons.bylesson import gpu, horovod, schedules, zero_stages


@pytest.mark.parametrize("gpus", [0, 1, 2, 3, 4, 8])
@pytest.mark.parametrize("nproc", [1, 2, 4, 8])
def test_a_job_uses_gpus_only_where_there_is_one_per_process(gpus, nproc):
    device, why = placement.decide(nproc, gpus)
    assert device == ("cuda" if gpus >= nproc else "cpu")
    if device == "cpu" and gpus:
        assert why == (
            f"This job's {nproc} processes would need {nproc} GPUs, one each, and this machine "
            f"has {gpus}: it runs on {nproc} CPU processes instead."
        )
    else:
        assert why is None  # on GPUs, or a CPU machine where every job runs on the CPU


@pytest.mark.parametrize("gpus", [0, 1, 2, 3, 4, 8])
def test_placed_arguments(gpus):
    said = []
    ddp = placement.placed("_trainup_ddp.py", ["--quick"], nproc=2, gpus=gpus, say=said.append)
    assert ddp == (
        ["--quick", "--device", "cpu"] if gpus == 1 else ["--quick"]
    )  # auto decides the rest
    assert bool(said) == (gpus == 1)
    auto = placement.placed(
        "_trainup_fsdp.py", ["--device", "auto"], nproc=4, gpus=gpus, say=said.append
    )
    assert auto == (["--device", "cpu"] if 0 < gpus < 4 else ["--device", "auto"])
    # Lightning spawning its own processes counts them; its flag is --accelerator
    light = placement.placed("_trainup_lightning.py", ["--devices", 2], gpus=gpus, say=said.append)
    assert light == (
        ["--devices", "2", "--accelerator", "cpu"] if gpus == 1 else ["--devices", "2"]
    )
    # the CPU is always there; scripts that choose no device are left alone
    assert placement.placed("_trainup_ddp.py", ["--device", "cpu"], nproc=8, gpus=gpus) == [
        "--device",
        "cpu",
    ]
    assert placement.placed("_trainup_cpu.py", ["--threads", 2], nproc=1, gpus=gpus) == [
        "--threads",
        "2",
    ]
    assert (
        placement.placed("_trainup_tp.py", [], nproc=4, gpus=gpus, say=said.append) == []
    )  # cpu default
    if gpus < 2:
        with pytest.raises(RuntimeError, match=f"needs 2 GPU\\(s\\), and this machine has {gpus}"):
            placement.placed("_trainup_ddp.py", ["--device", "cuda"], nproc=2, gpus=gpus)
    else:
        assert (
            placement.placed("_trainup_ddp.py", ["--device", "cuda"], nproc=2, gpus=gpus)[-1]
            == "cuda"
        )


class Started(Exception):
    pass


@pytest.fixture
def one_gpu(monkeypatch):
    """A machine with one GPU; every process start is caught and its command kept."""
    started = []

    def start(cmd, *a, **k):
        started.append([str(c) for c in cmd])
        raise Started

    monkeypatch.setattr(placement, "gpu_count", lambda: 1)
    monkeypatch.setattr("subprocess.run", start)
    monkeypatch.setattr("subprocess.Popen", start)
    return started


LAUNCHES = {
    "launch.run": lambda: launch.run("_trainup_ddp.py", name="placement_probe", nproc=2),
    "launch.Job": lambda: launch.side_by_side(
        launch.Job("_trainup_ddp.py", name="placement_probe", nproc=2)
    ),
    "launch.two_nodes": lambda: launch.two_nodes(
        "_trainup_ddp.py", name="placement_probe", nproc_per_node=2
    ),
    "sharding.run": lambda: zero_stages.run(2, "p"),
    "pipeline.run": lambda: schedules.run(
        "_trainup_pipeline.py", "--device", "auto", name="placement_probe"
    ),
    "horovod.run": lambda: horovod.run(name="placement_probe", np=2),
    "report.run": lambda: report.run(
        "_trainup_lightning.py", "--devices", 2, name="placement_probe"
    ),
}


@pytest.mark.parametrize("launcher", sorted(LAUNCHES))
def test_every_launcher_places_its_job(launcher, one_gpu, capsys):
    with pytest.raises(Started):
        LAUNCHES[launcher]()
    flag = "--accelerator" if launcher == "report.run" else "--device"
    assert one_gpu and one_gpu[0][-1 - one_gpu[0][::-1].index(flag) + 1] == "cpu", one_gpu[0]
    assert "would need 2 GPUs, one each, and this machine has 1" in capsys.readouterr().out


@pytest.mark.parametrize("gpus", [0, 1, 2])
def test_lesson_06_runs_its_stages_on_gpus_only_where_there_are_two(
    gpus, monkeypatch, tmp_path, capsys
):
    started = []

    def start(cmd, *a, **k):
        started.append([str(c) for c in cmd])
        raise Started

    monkeypatch.setattr(placement, "gpu_count", lambda: gpus)
    monkeypatch.setattr("subprocess.run", start)
    monkeypatch.setattr("subprocess.Popen", start)  # lessons.jobs starts every job
    if gpus < 2:
        committed = {p.parent.name for p in gpu.references(f"{schedules.GPU_SWEEP}_gpipe")}
        assert set(schedules.sweep_on_gpus(64, ["--width", 8])) == committed
        assert not started
        out = capsys.readouterr().out
        assert f"This machine has {gpus} GPU(s), and one stage per GPU needs 2" in out
        assert "pp_sweep_gpu_gpipe" in out and "Traceback" not in out
    else:
        with pytest.raises(Started):
            schedules.sweep_on_gpus(64, ["--width", 8])
        cmd = " ".join(started[0])
        assert "--nproc-per-node 2" in cmd and "--device cuda --stages 2 --sweep " in cmd, cmd
        assert "--device cpu" not in cmd


STARTS = re.compile(r"subprocess\.|Popen\(|os\.system|!\s*(torchrun|horovodrun|srun|python)")
MULTI = re.compile(r"torchrun|horovodrun|srun|torch\.distributed\.run|mpirun")


def test_no_notebook_starts_a_multi_process_job_but_through_the_launchers():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] != "code":
                continue
            for line in "".join(cell["source"]).splitlines():
                assert not (STARTS.search(line) and MULTI.search(line)), (
                    f"{path.name} cell {i}: {line}"
                )


def test_only_the_launchers_build_job_commands():
    builders = {
        p.name
        for p in (ROOT / "scripts" / "lessons").glob("*.py")
        if re.search(r"\b(TORCHRUN|HOROVODRUN) \+", p.read_text())
    }
    # collectives.py starts _trainup_collectives.py, which chooses no device (its --backend does);
    # elastic.py's drill runs CPU processes on any machine (its flags say --device cpu): it is
    # about membership, and its proof compares with a one-process CPU run
    # reference.py measures this machine's CPU runs for lesson 11 (--device cpu, a thread each)
    assert builders <= {
        "launch.py",
        "horovod.py",
        "collectives.py",
        "elastic.py",
        "reference.py",
    }, builders
    assert "_trainup_collectives.py" not in placement.CHOOSES_DEVICE
    from lessons.bylesson import elastic

    assert " ".join(elastic.FLAGS).count("--device cpu") == 1


def test_the_gpu_reference_runs_cover_every_gpu_path_the_notebooks_read():
    """tools/gpu_reference_runs.sh --dry-run on a pretended 2-GPU machine: the runs notebooks 02, 03 and 04
    read from logs/reference/ (04: DDP over NCCL at 1 and 2 processes)."""
    import subprocess

    dry = subprocess.run(
        ["bash", "tools/gpu_reference_runs.sh", "--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "NGPU": "2", "GPU": "X"},
    )
    assert dry.returncode == 0, dry.stderr
    for name in (
        "gpu_cuda",
        "gpu_sweep_resident",
        "dp_cnn_2gpu",
        "dp_phases_2gpu",
        "ddp_n1",
        "ddp_n2",
        "pp_sweep_gpu",
    ):
        assert f"--run-name {name} " in dry.stdout, name
    assert "--nproc-per-node 2 scripts/_trainup_ddp.py --device cuda --backend nccl" in dry.stdout
    assert "--nproc-per-node 2 scripts/_trainup_pipeline.py --device cuda" in dry.stdout
    assert f"--run-name {schedules.GPU_SWEEP} " in dry.stdout
    read = "".join(
        (ROOT / "notebooks" / n).read_text() for n in ("02_single_gpu.ipynb", "04_ddp.ipynb")
    )
    assert "reference/*/ddp_n*" in read and 'gpu.references(\\"gpu_sweep_resident' in read


def test_nccl_debug_lines_are_filtered_to_how_the_gpus_talk():
    from lessons.bylesson import collectives

    kept = [
        "host:1:1 [0] NCCL INFO Channel 00/02 :    0   1",
        "host:1:1 [0] NCCL INFO Trees [0] 1/-1/-1->0->-1 [1] 1/-1/-1->0->-1",
        "host:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
        "host:1:1 [0] NCCL INFO Connected all rings",
    ]
    dropped = [
        "host:1:1 [0] NCCL INFO NCCL version 2.27.5+cuda13.0",
        "host:1:1 [0] NCCL INFO Bootstrap: Using eth0:10.0.0.2<0>",
        "host:1:1 [0] NCCL INFO cudaDriverVersion 13000",
    ]
    assert all(collectives.NCCL_TOPOLOGY.search(line) for line in kept)
    assert not any(collectives.NCCL_TOPOLOGY.search(line) for line in dropped)
