"""The SLURM lesson: the sbatch templates are well formed and sized, and they run on a real SLURM.

The real SLURM (tools/local_slurm.sh: munged, slurmctld and two slurmd, nodes n1 and n2 on this machine)
is started once for this module with its state in a scratch folder, and stopped at the end by pid,
also when a test fails. Where it cannot run (not root, no Debian registry), those tests skip and say why;
with TRAINUP_REQUIRE_SLURM=1 (CI sets it) they fail instead.
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import ROOT
from lessons import checks, report
from lessons.bylesson import slurm

TEMPLATES = sorted((ROOT / "slurm").glob("*.sbatch"))
GPU_TEMPLATES = [t for t in TEMPLATES if not t.name.startswith("cpu")]
IMAGENET_FLAGS = "--dataset synthetic --image-shape 3x224x224 --num-classes 1000 --model resnet50"


# --- The templates, without SLURM -------------------------------------------------------------------


def test_there_are_the_templates_the_lesson_promises():
    names = {t.name for t in TEMPLATES}
    assert {
        "1node_1gpu.sbatch",
        "1node_4gpu.sbatch",
        "nnodes_4gpu.sbatch",
        "nnodes_4gpu_torchrun.sbatch",
        "cpu.sbatch",
        "cpu_torchrun.sbatch",
    } <= names


@pytest.mark.parametrize(
    "path",
    TEMPLATES + [ROOT / "slurm" / "preflight.sh", ROOT / "tools" / "local_slurm.sh"],
    ids=lambda p: p.name,
)
def test_bash_accepts_it(path):
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_counts_fit_the_node(path):
    sentence, problems = slurm.check_counts(path)
    assert problems == [], f"{sentence}: {problems}"


def test_count_check_catches_a_template_with_more_tasks_than_gpus(tmp_path):
    bad = tmp_path / "bad.sbatch"
    text = (ROOT / "slurm" / "1node_4gpu.sbatch").read_text()
    bad.write_text(text.replace("--ntasks-per-node=4", "--ntasks-per-node=8"))
    _, problems = slurm.check_counts(bad)
    assert any("8 tasks per node for 4 GPUs" in p for p in problems), problems
    assert any("more than the node's 32 cores" in p for p in problems), problems


def test_directives_read_short_and_long_forms(tmp_path):
    f = tmp_path / "x.sbatch"
    f.write_text(
        "#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node 4\n#SBATCH --gres=gpu:a100:4  # note\n"
        "echo hi\n#SBATCH --time=1:00\n"
    )
    opts = slurm.directives(f)
    assert opts == {
        "nodes": "2",
        "ntasks-per-node": "4",
        "gres": "gpu:a100:4",
    }  # nothing after the first command
    assert slurm.gpus_per_node(opts) == 4


def _script_args(template):
    """The arguments the template's srun line hands _trainup_ddp.py, expanded by bash as in a 4-node job."""
    text = template.read_text().replace("\\\n", " ")
    line = next(l for l in text.splitlines() if l.startswith("srun ") and "_trainup_ddp.py" in l)
    args = line.split("scripts/_trainup_ddp.py", 1)[1].replace('"$@"', "")
    env = dict(
        os.environ,
        TRAINUP_WORLD_SIZE="16",
        OMP_NUM_THREADS="2",
        TRAINUP_WORKERS="6",
        SLURM_JOB_NAME="t",
        SLURM_JOB_ID="7",
    )
    out = subprocess.run(
        ["bash", "-c", f"printf '%s\\n' {args}"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return out.stdout.splitlines()


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_the_ddp_script_accepts_what_the_template_passes(path):
    import _trainup_ddp

    args = _trainup_ddp.parse_args(_script_args(path))
    assert args.run_name == "t_7"
    if path in GPU_TEMPLATES:
        assert IMAGENET_FLAGS in " ".join(_script_args(path))
        assert (args.model, args.image_shape, args.num_classes, args.device) == (
            "resnet50",
            (3, 224, 224),
            1000,
            "cuda",
        )
        assert args.batch_size == 256 * 16  # 256 per GPU, global over the job's 16 processes
    else:
        assert args.device == "cpu"


@pytest.mark.parametrize(
    "path", [*GPU_TEMPLATES, ROOT / "slurm" / "cpu.sbatch"], ids=lambda p: p.name
)
def test_templates_end_the_whole_step_when_one_rank_dies(path):
    """A dead rank leaves the others blocked in a collective (NCCL) or waiting for it (gloo) until the timeout:
    srun must kill them."""
    launches = [l for l in path.read_text().splitlines() if l.startswith("srun ")]
    assert launches and all("--kill-on-bad-exit=1" in l for l in launches), launches
    if path in GPU_TEMPLATES:
        assert (
            "40 GB" in path.read_text()
        )  # what 256 ResNet-50 images per GPU in fp32 need, and what to do below it


def _preflight(**env):
    """Source slurm/preflight.sh in bash with these SLURM variables, as a template does."""
    base = dict(
        SLURM_SUBMIT_DIR=str(ROOT),
        SLURM_JOB_ID="5",
        SLURM_JOB_NAME="t",
        SLURM_JOB_NODELIST="n1",
        SLURM_JOB_NUM_NODES="1",
        PATH=os.environ["PATH"],
    )
    return subprocess.run(
        ["bash", "-c", "set -euo pipefail; source slurm/preflight.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**base, **env},
    )


def test_preflight_stops_more_tasks_than_gpus():
    proc = _preflight(
        TRAINUP_LAUNCH="srun", TRAINUP_GPUS="4", SLURM_NTASKS_PER_NODE="8", SLURM_GPUS_ON_NODE="4"
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: 8 tasks per node but only 4 GPU(s) per node: with srun, each task is one training process on one "
        "GPU, so set --ntasks-per-node=4"
    ]


def test_preflight_counts_gpus_from_cuda_visible_devices():
    proc = _preflight(
        TRAINUP_LAUNCH="srun",
        TRAINUP_GPUS="4",
        SLURM_TASKS_PER_NODE="4(x2)",
        CUDA_VISIBLE_DEVICES="0,1",
    )
    assert proc.returncode == 2 and "4 tasks per node but only 2 GPU(s) per node" in proc.stderr, (
        proc.stderr
    )


@pytest.mark.parametrize(
    "path", [p for p in TEMPLATES if "torch.distributed.run" in p.read_text()], ids=lambda p: p.name
)
def test_torchrun_templates_pass_the_stop_signals_on_to_the_training(path):
    """torchrun forwards only the signals it handles; SLURM's --signal and scancel --signal send
    SIGUSR1, which would end torchrun unsaved (tests/test_block_stops.py sends it for real)."""
    from lessons import launch

    assert f"export PET_SIGNALS_TO_HANDLE={launch.TORCHRUN_SIGNALS}" in path.read_text()


def test_preflight_stops_a_gpu_template_that_got_no_gpu():
    proc = _preflight(TRAINUP_LAUNCH="srun", TRAINUP_GPUS="4", SLURM_NTASKS_PER_NODE="4")
    assert proc.returncode == 2 and "this job got no GPU" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "launch, gpus, cpus, threads, workers",
    [
        ("srun", "4", "8", 2, 6),  # a GPU rank: 2 threads and 6 workers on its 8 cores
        ("torchrun", "4", "32", 2, 6),  # torchrun's 4 ranks share the task's 32 cores: 8 each
        ("srun", "4", "1", 1, 0),
        ("srun", "0", "4", 4, 0),
    ],
)  # a CPU rank computes on all its cores
def test_preflight_gives_each_rank_threads_and_workers_that_fit_its_cores(
    launch, gpus, cpus, threads, workers
):
    """preflight.sh's step 4 alone (the steps before it need a SLURM job)."""
    text = (ROOT / "slurm" / "preflight.sh").read_text()
    step = text[text.index("# 4. CPU threads") : text.index("# Slurm 22.05")]
    env = dict(
        TRAINUP_LAUNCH=launch,
        TRAINUP_GPUS=gpus,
        SLURM_CPUS_PER_TASK=cpus,
        TRAINUP_NPROC_PER_NODE="4",
        PATH=os.environ["PATH"],
    )
    script = f"set -euo pipefail; {step}\necho $OMP_NUM_THREADS $TRAINUP_WORKERS"
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(threads), str(workers)], proc.stdout


def test_preflight_stops_torchrun_with_several_tasks_per_node():
    proc = _preflight(
        TRAINUP_LAUNCH="torchrun",
        TRAINUP_GPUS="4",
        SLURM_NTASKS_PER_NODE="4",
        SLURM_GPUS_ON_NODE="4",
    )
    assert proc.returncode == 2 and "srun torchrun needs exactly one per node" in proc.stderr, (
        proc.stderr
    )


# --- A real SLURM ------------------------------------------------------------------------------------


def _cpu_args(tmp, name):
    return [
        "--quick",
        *checks.PROOF,
        "--run-name",
        name,
        "--log-dir",
        tmp,
        "--checkpoint-dir",
        Path(tmp) / "checkpoints",
    ]


@pytest.fixture(scope="module")
def cpu_jobs(local_slurm, tmp_path_factory):
    """The CPU template on 1 node and on 2 nodes, and the torchrun variant on 2 nodes, through sbatch."""
    tmp = tmp_path_factory.mktemp("jobs")
    runs = {
        "srun_1node": ("cpu.sbatch", []),
        "srun_2nodes": ("cpu.sbatch", ["--nodes=2"]),
        "torchrun_2nodes": ("cpu_torchrun.sbatch", ["--nodes=2"]),
    }
    ids = {
        name: slurm.submit(
            f"slurm/{template}",
            *_cpu_args(tmp, name),
            sbatch_args=[f"--output={tmp}/{name}.out", *extra],
        )
        for name, (template, extra) in runs.items()
    }
    states = slurm.wait(ids.values(), timeout=1200)
    return {
        name: dict(id=j, state=states[j], out=(tmp / f"{name}.out"), log=tmp / f"{name}.jsonl")
        for name, j in ids.items()
    }


@pytest.mark.parametrize(
    "name,nodes,world", [("srun_1node", 1, 2), ("srun_2nodes", 2, 4), ("torchrun_2nodes", 2, 4)]
)
def test_cpu_template_completes_through_sbatch(cpu_jobs, name, nodes, world):
    job = cpu_jobs[name]
    out = job["out"].read_text() if job["out"].exists() else "(no output file)"
    assert job["state"] == "COMPLETED", out
    assert f"job {job['id']} (trainup-cpu" in out and "rendezvous at 127.0.0.1:" in out, out
    run = report.read_run(job["log"])
    assert run["problems"] == [], run["problems"]
    assert run["summary"]["status"] == "finished"
    losses = [e["loss"] for e in run["epochs"]]
    assert len(losses) == 2 and losses[-1] < losses[0], losses
    assert run["env"]["world_size"] == world and run["env"]["backend"] == "gloo"
    ddp = next(r for r in run["extra"] if r["type"] == "ddp")
    assert ddp["launcher"] == ("torchrun" if name.startswith("torchrun") else "slurm")
    assert sorted({r["node_rank"] for r in ddp["ranks"]}) == list(
        range(nodes)
    )  # the ranks did span the nodes


def test_srun_and_torchrun_launches_train_the_same(cpu_jobs):
    """Same seed, same 4 processes, same data shards: the launcher must not change the training."""
    a, b = (
        report.read_run(cpu_jobs[n]["log"])["epochs"] for n in ("srun_2nodes", "torchrun_2nodes")
    )
    # float64 (checks.PROOF): any summation order agrees far below the tolerance
    assert [e["loss"] for e in a] == pytest.approx(
        [e["loss"] for e in b], rel=0, abs=checks.FLOAT64_ATOL
    )


def test_jobs_show_in_the_queue_and_accounting(cpu_jobs):
    table = slurm.accounting()
    done = table[table.JobID.isin([j["id"] for j in cpu_jobs.values()])]
    assert set(done.State) == {"COMPLETED"} and sorted(done.NNodes) == [1, 2, 2]
    assert "COMPLETED" in slurm.queue()


def test_a_second_local_slurm_runs_beside_this_one(local_slurm, tmp_path_factory, monkeypatch):
    """Under pytest-xdist a test file's SLURM and the notebooks' run at once: the second takes
    other ports and numbers its jobs from elsewhere (the templates derive ports and file names
    from the job id)."""
    tmp = tmp_path_factory.mktemp("two")
    batch = tmp / "id.sbatch"
    batch.write_text("#!/bin/bash\necho job $SLURM_JOB_ID\n")
    ids = {"first": slurm.submit(batch, sbatch_args=[f"--output={tmp}/first.out"])}
    monkeypatch.setenv("TRAINUP_SLURM_DIR", str(tmp_path_factory.mktemp("s2")))
    started, why = slurm.start()
    try:
        assert started == "running", why
        ids["second"] = slurm.submit(batch, sbatch_args=[f"--output={tmp}/second.out"])
        assert slurm.wait([ids["second"]], timeout=120) == {ids["second"]: "COMPLETED"}
        ports = [
            (d / "slurm.conf").read_text().split("SlurmctldPort=")[1].split()[0]
            for d in (local_slurm, slurm.state_dir())
        ]
    finally:
        slurm.stop()
    monkeypatch.setenv("TRAINUP_SLURM_DIR", str(local_slurm))
    assert slurm.wait([ids["first"]], timeout=120) == {ids["first"]: "COMPLETED"}
    assert ports[0] != ports[1] and ids["first"] != ids["second"], (ports, ids)
    assert [(tmp / f"{n}.out").read_text() for n in ids] == [f"job {j}\n" for j in ids.values()]


NOTEBOOK_KERNEL = """
import sys, time
from pathlib import Path
from lessons.bylesson import slurm
have, here = slurm.for_notebook()
print("RESULT", have, here, slurm.state_dir(), flush=True)
Path(sys.argv[1]).touch()
while not Path(sys.argv[2]).exists():  # until the other notebook has its SLURM too
    time.sleep(0.1)
job = slurm.submit(sys.argv[3], sbatch_args=[f"--output={sys.argv[1]}.out"])
print("STATE", slurm.wait([job], timeout=120)[job], flush=True)
slurm.done_with(here)
"""


def test_two_notebooks_side_by_side_each_start_and_stop_a_slurm_of_their_own(
    local_slurm, tmp_path, request
):
    """Lessons 04b and 07b open at once (two kernels; the suite's two notebook units) with no SLURM
    running: each starts its own (a folder of its own under .slurm/), runs a job on it and stops
    it, and neither stops the other's. One shared folder had them start it twice (a new munge key
    under the first's daemons) and stop it under the other's jobs."""
    # the course's .slurm/, where no SLURM runs; short, as the course's own folder is (tmp_path can
    # be too long a path for slurmd's job sockets: local_slurm.sh refuses it)
    base = Path(tempfile.mkdtemp(prefix="s", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(base, ignore_errors=True))
    batch = tmp_path / "id.sbatch"
    batch.write_text("#!/bin/bash\necho job $SLURM_JOB_ID\n")
    env = {**os.environ, "TRAINUP_SLURM_DIR": str(base), "TRAINUP_START_SLURM": "1"}
    marks = [tmp_path / "a", tmp_path / "b"]
    kernels = [
        subprocess.Popen(
            [sys.executable, "-c", NOTEBOOK_KERNEL, str(mine), str(other), str(batch)],
            cwd=ROOT / "scripts",
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for mine, other in (marks, marks[::-1])
    ]
    outs = [k.communicate(timeout=300) for k in kernels]
    assert [k.returncode for k in kernels] == [0, 0], [err[-2000:] for _, err in outs]
    results = [
        next(line.split()[1:] for line in out.splitlines() if line.startswith("RESULT"))
        for out, _ in outs
    ]
    assert [r[:2] for r in results] == [["True", "True"]] * 2, outs
    folders = [Path(r[2]) for r in results]
    assert folders[0] != folders[1] and all(f.parent == base for f in folders), folders
    assert all("STATE COMPLETED" in out for out, _ in outs), outs
    assert not any(f.exists() for f in folders)  # each stopped and removed its own
    assert (
        subprocess.run(
            ["bash", str(ROOT / "tools" / "local_slurm.sh"), "status"], env=env, capture_output=True
        ).returncode
        != 0
    )  # none left in the base


def test_a_slurm_folder_too_long_for_slurmds_job_sockets_is_one_sentence_before_any_daemon(request):
    """slurmd's job steps make Unix sockets in the spool folder (at most 107 characters): a longer
    folder let every job fail to start and sit requeued for minutes. local_slurm.sh refuses it."""
    if os.geteuid() != 0:
        pytest.skip("local_slurm.sh start needs root")
    top = Path(tempfile.mkdtemp(dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(top, ignore_errors=True))
    long = top / ("x" * (80 - len(str(top)) - 1))  # 80 characters: munge's socket (99) fits
    proc = subprocess.run(
        ["bash", str(ROOT / "tools" / "local_slurm.sh"), "start"],
        env={**os.environ, "TRAINUP_SLURM_DIR": str(long)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr
    assert "too long a path (80 characters) for slurmd's job sockets" in proc.stderr, proc.stderr
    assert "shorter folder (at most 7" in proc.stderr  # 77 to 79, as its job ids have digits
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not long.exists() or not any(long.iterdir())  # nothing started, nothing left


@pytest.fixture(scope="module")
def python_without_torch(tmp_path_factory):
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    return venv / "bin" / "python"


def _failed_job(tmp, name, extra_env=None, cwd=ROOT):
    return slurm.submit(
        ROOT / "slurm" / "cpu.sbatch",
        *_cpu_args(tmp, name),
        extra_env=extra_env,
        cwd=cwd,
        sbatch_args=[f"--output={tmp}/{name}.out"],
    )


def test_bad_input_fails_with_one_clear_line_in_the_jobs_log(
    local_slurm, tmp_path, python_without_torch
):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        jobs = {
            "port": _failed_job(tmp_path, "port", {"TRAINUP_PORT": str(port)}),
            "no_torch": _failed_job(
                tmp_path, "no_torch", {"TRAINUP_PYTHON": str(python_without_torch)}
            ),
            "elsewhere": _failed_job(tmp_path, "elsewhere", cwd=tmp_path),
        }
        states = slurm.wait(jobs.values(), timeout=600)
    expected = {
        "port": f"error: port {port} on 127.0.0.1 (n1) is already in use",
        "no_torch": f"error: {python_without_torch} cannot import torch: run tools/setup_env.sh",
        "elsewhere": "error: submit from the course's top folder",
    }
    for name, j in jobs.items():
        out = (tmp_path / f"{name}.out").read_text()
        assert states[j] == "FAILED", out
        assert slurm.job(j)["ExitCode"] == "2:0", out
        errors = [l for l in out.splitlines() if l.startswith("error:")]
        assert len(errors) == 1 and errors[0].startswith(expected[name]), out
        assert "Traceback" not in out and not (tmp_path / f"{name}.jsonl").exists(), out
