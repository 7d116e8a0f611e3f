"""Leaving a job: 50 short 2-process jobs in a row, and every rank of every one must exit 0.

About one job in ten ends, after its summary, with one rank killed by "terminate called without
an active exception": the job's process group (its gloo threads) outlives destroy_process_group()
into the interpreter's shutdown. So each rank here also checks, once main() has returned, that no
C++ thread is left.

100 fresh interpreters would take minutes on 2 cores (mostly importing torch), so one interpreter
imports the script once and forks both ranks of each job. Each rank runs the script's main() with
its launcher's variables and exits as the script does, through the interpreter's own shutdown: the
path that aborted. The jobs alternate between torchrun's start (the workers meet in the agent's
store, a process of its own here) and srun's (SLURM's variables; rank 0 opens the store).
"""
import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT, SCRIPTS

JOBS = 50
# A short real run: data, model, DDP, the Stopper's check every step, test, checkpoint, summary.
ARGS = ["--quick", "--train-size", "64", "--test-size", "64", "--epochs", "1", "--dropout", "0",
        "--device", "cpu", "--no-progress"]

JOBS_PROGRAM = r'''
import faulthandler, gc, os, signal, sys, threading, time
scripts, name, jobs, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
sys.path.insert(0, scripts)
script = __import__(name)  # imported once; each rank is a fork of this process


from trainup.distributed import free_port  # noqa: E402  (the script put trainup on the path)


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


def agent_store(port):
    """torchrun's agent holds the store its workers meet in: a process of its own here."""
    pid = os.fork()
    if pid == 0:
        import datetime
        import torch.distributed as dist
        store = dist.TCPStore("127.0.0.1", port, 3, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=120))
        signal.pause()  # until the job is over: SIGTERM
    return pid


role = None
for job in range(jobs):
    if job == 2:  # jobs 0 and 1 pay what a script pays (torch._dynamo, which DDP's constructor
        # imports after joining: seconds); the others fork a process that paid it once, alone
        script.main([*sys.argv[5:], "--run-name", "warm", "--log-dir", out,
                     "--checkpoint-dir", out])
        assert not native_threads(), f"a job of one left threads: {native_threads()}"
        gc.freeze()  # fewer pages copied into each fork
    port, style = free_port(), ("torchrun", "srun")[job % 2]
    store = agent_store(port) if style == "torchrun" else None
    ranks = []
    for rank in (0, 1):
        pid = os.fork()
        if pid == 0:
            role = job, rank, style, port
            break
        ranks.append(pid)
    if role:
        break
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in ranks]
    if store:
        os.kill(store, signal.SIGTERM)
        os.waitpid(store, 0)
    print("job", job, style, *codes, flush=True)

if role:  # one rank: the script's own start and end, then the interpreter's own exit
    job, rank, style, port = role
    folder = os.path.join(out, f"job{job}")
    os.makedirs(folder, exist_ok=True)
    log = os.open(os.path.join(folder, f"rank{rank}.err"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1), os.dup2(log, 2)
    env = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if style == "torchrun":
        env.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                   GROUP_RANK="0", TORCHELASTIC_RUN_ID="exit", TORCHELASTIC_RESTART_COUNT="0",
                   TORCHELASTIC_USE_AGENT_STORE="True")
    else:
        env.update(SLURM_PROCID=str(rank), SLURM_NTASKS="2", SLURM_LOCALID=str(rank),
                   SLURM_NNODES="1", SLURM_NODEID="0", SLURM_JOB_ID=str(job), SLURM_STEP_ID="0")
    os.environ.update(env)
    faulthandler.dump_traceback_later(120, exit=True)  # hung (at exit, say): its stacks, exit 1
    script.main([*sys.argv[5:], "--run-name", f"job{job}", "--log-dir", folder,
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


def run_jobs(tmp_path, script, jobs, args):
    """Run the jobs; every rank of every one must exit 0 with no C++ thread left."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    started = time.perf_counter()
    command = [sys.executable, "-c", JOBS_PROGRAM, str(SCRIPTS), script, str(jobs), str(tmp_path), *args]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    assert proc.returncode == 0, proc.stderr[-4000:]
    done = [line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("job ")]
    assert len(done) == jobs, proc.stdout + proc.stderr[-4000:]
    failed = [(int(job), style, rank, int(code)) for job, style, *codes in done
              for rank, code in enumerate(codes) if code != "0"]
    messages = [f"job {job} ({style}) rank {rank}: exit {code}\n"
                + (tmp_path / f"job{job}" / f"rank{rank}.err").read_text()[-3000:]
                for job, style, rank, code in failed]
    assert not failed, (f"{len(failed)} of {2 * jobs} ranks failed ({seconds:.0f} s):\n"
                        + "\n".join(messages[:3]))


def test_fifty_short_jobs_in_a_row_every_rank_exits_0(tmp_path):
    run_jobs(tmp_path, "_trainup_ddp", JOBS, ARGS)


SMALL = ["--quick", "--train-size", "64", "--test-size", "64", "--epochs", "1", "--batch-size", "32",
         "--blocks", "2", "--width", "16", "--no-progress"]
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
