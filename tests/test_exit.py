"""Leaving a job: 4 short 2-process jobs in a row, and every rank of every one must exit 0.

About one job in ten ended, after its summary, with one rank killed by "terminate called without
an active exception": the job's process group (its gloo threads) outlived destroy_process_group()
into the interpreter's shutdown. So each rank here also checks, once main() has returned, that no
C++ thread is left. The abort was a race, the group left behind was not: it is there in every job,
so the check finds it in the first job, not one time in ten. Every rank is a fresh interpreter, as
a learner's launcher starts it: half the jobs under torchrun (its agent's store, its workers), half
as srun starts them (SLURM's variables; rank 0 opens the store, whose thread must end too). A rank
runs the script through RANK_PROGRAM: the script's main(), then the check, then the interpreter's
own shutdown, the path that aborted.
"""

import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT, SCRIPTS

# Each launcher twice: the group a leak leaves is there in every job; a second job of each gives a
# race that leaves no thread behind a second chance to show.
JOBS = 4
# A short real run: data, model, DDP, the Stopper's check every step, test, checkpoint, summary.
ARGS = [
    "--quick",
    "--train-size",
    "64",
    "--test-size",
    "64",
    "--epochs",
    "1",
    "--dropout",
    "0",
    "--device",
    "cpu",
    "--no-progress",
]

RANK_PROGRAM = r'''
import faulthandler, os, sys, threading, time
scripts, name, folder = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, scripts)
script = __import__(name)


def native_threads():
    """Threads of this process that Python did not start: C++'s (gloo's, the store's). Not autograd's
    workers (pt_autograd_*): torch keeps them for the process and stops them itself at exit."""
    python = {t.native_id for t in threading.enumerate()} | {threading.get_native_id()}
    names = []
    for tid in os.listdir("/proc/self/task"):
        if int(tid) not in python:
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    names.append(f.read().strip())
            except OSError:  # it ended between the listing and the read: not left
                pass
    return [n for n in names if not n.startswith("pt_autograd_")]


faulthandler.dump_traceback_later(120, exit=True)  # hung (at exit, say): its stacks, exit 1
script.main([*sys.argv[4:], "--run-name", os.path.basename(folder), "--log-dir", folder,
             "--checkpoint-dir", folder])
faulthandler.cancel_dump_traceback_later()  # its watchdog is a C thread too: it ends, unjoined
for _ in range(100):
    left = native_threads()
    if not left:
        break
    time.sleep(0.02)  # a thread of the course's would not end on its own: a leak stays
if left:  # they would meet the interpreter's shutdown
    print(f"C++ threads still running after main() returned: {left}", file=sys.stderr)
    sys.exit(3)
'''


def start_job(tmp_path, number, script, args, env):
    """Job `number`: even ones under torchrun, odd ones as srun starts them. Popens of its ranks
    (torchrun: its agent), each writing to job<number>/rank<r>.err."""
    from trainup import distributed

    folder = tmp_path / f"job{number}"
    folder.mkdir()
    rank_cmd = ["-c", RANK_PROGRAM, str(SCRIPTS), script, str(folder), *args]
    port = distributed.free_port()
    if number % 2 == 0:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "--no-python",
            sys.executable,
            *rank_cmd,
        ]
        err = open(folder / "rank0.err", "w")
        return "torchrun", [
            subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=err, stderr=subprocess.STDOUT)
        ]
    procs = []
    for rank in (0, 1):
        err = open(folder / f"rank{rank}.err", "w")
        rank_env = {
            **env,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "SLURM_PROCID": str(rank),
            "SLURM_NTASKS": "2",
            "SLURM_LOCALID": str(rank),
            "SLURM_NNODES": "1",
            "SLURM_NODEID": "0",
            "SLURM_JOB_ID": str(number),
            "SLURM_STEP_ID": "0",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, *rank_cmd],
                cwd=ROOT,
                env=rank_env,
                stdout=err,
                stderr=subprocess.STDOUT,
            )
        )
    return "srun", procs


def run_jobs(tmp_path, script, jobs, args):
    """Run the jobs one after another; every rank (every process torchrun started: its exit is the
    agent's) must exit 0 with no C++ thread left."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "TORCHELASTIC_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    }
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    started = time.perf_counter()
    failed = []
    for number in range(jobs):
        style, procs = start_job(tmp_path, number, script, args, env)
        for rank, proc in enumerate(procs):
            try:
                code = proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = "hung"
            if code != 0:
                failed.append((number, style, rank, code))
    seconds = time.perf_counter() - started
    messages = [
        f"job {job} ({style}) rank {rank}: exit {code}\n"
        + (tmp_path / f"job{job}" / f"rank{rank}.err").read_text()[-3000:]
        for job, style, rank, code in failed
    ]
    assert not failed, (
        f"{len({f[0] for f in failed})} of {jobs} jobs had a process fail ({seconds:.0f} s):\n"
        + "\n".join(messages[:3])
    )


def test_short_jobs_in_a_row_every_rank_exits_0(tmp_path):
    run_jobs(tmp_path, "_trainup_ddp", JOBS, ARGS)


SMALL = [
    "--quick",
    "--train-size",
    "64",
    "--test-size",
    "64",
    "--epochs",
    "1",
    "--batch-size",
    "32",
    "--blocks",
    "2",
    "--width",
    "16",
    "--no-progress",
]
# Scripts that join extra groups (a DeviceMesh's, ZeRO's, FSDP2's, the pipeline's) leave them all too:
# one job of each start.
EXTRA_GROUPS = {
    "fsdp_parameters": ("_trainup_fsdp", ["--shard", "parameters"]),
    "fsdp_optimizer": ("_trainup_fsdp", ["--shard", "optimizer"]),
    "tp": ("_trainup_tp", ["--hidden", "32"]),
    "pipeline": ("_trainup_pipeline", ["--microbatches", "2"]),
}


@pytest.mark.parametrize("case", EXTRA_GROUPS)
def test_scripts_with_extra_groups_leave_no_thread(tmp_path, case):
    script, args = EXTRA_GROUPS[case]
    run_jobs(tmp_path, script, 2, SMALL + args)
