"""tests/warm_start.py: a job forked from a warm server ends as the same job started fresh does."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import warm_start
from conftest import ROOT, SCRIPTS, assert_clean_error, finish_job, require_horovod

FLAGS = ["--quick", "--device", "cpu", "--no-progress", "--precision", "64", "--dropout", "0",
         "--epochs", "1"]


def command(name, log_dir, *extra):
    return [sys.executable, str(SCRIPTS / "_trainup_gpu.py"), *FLAGS, *extra, "--run-name", name,
            "--log-dir", str(log_dir), "--checkpoint-dir", str(log_dir / "checkpoints")]


def records(log_dir, name, kind):
    lines = (log_dir / f"{name}.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == kind]


def test_a_forked_job_ends_as_a_fresh_interpreter_does(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    forked = warm_start.start(command("forked", tmp_path), env, ROOT)
    assert isinstance(forked, warm_start.Job), "the server did not start (a thread of its own?)"
    fresh = subprocess.run(command("fresh", tmp_path), env=env, cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
    done = finish_job(forked)
    assert done.returncode == fresh.returncode == 0, done.stderr[-2000:] + fresh.stderr[-2000:]
    # every number a run computes, bit for bit; its own process, argv and output
    forked_epoch, fresh_epoch = (records(tmp_path, n, "epoch")[0] for n in ("forked", "fresh"))
    assert (forked_epoch["loss"], forked_epoch["test_loss"]) == (fresh_epoch["loss"],
                                                                 fresh_epoch["test_loss"])
    config = records(tmp_path, "forked", "config")[0]
    assert config["script"] == "_trainup_gpu.py" and config["args"]["run_name"] == "forked"
    assert done.stdout.splitlines()[0].startswith("epoch 1: loss ")
    assert done.stdout.splitlines()[0].split()[:4] == fresh.stdout.splitlines()[0].split()[:4]
    assert forked.pid != os.getpid() and (tmp_path / "checkpoints" / "forked.pt").exists()


def forked_workers(log_dir, launcher, said):
    """The job "forked"'s workers, checked: forks of the server (its `-c`) by a zygote the launcher
    forked, each in a session of its own."""
    workers = [r["pid"] for r in records(log_dir, "forked", "ddp")[0]["ranks"]]
    for pid in workers:
        zygote = parent(pid)
        assert parent(zygote) == launcher and zygote not in workers, said
        assert os.getsid(pid) == pid
        assert b"\0-c\0" in Path(f"/proc/{pid}/cmdline").read_bytes()
    return workers


def test_torchruns_agent_and_its_workers_are_forked_and_end_as_a_fresh_job_does(tmp_path):
    """`python -m torch.distributed.run ... scripts/_trainup_ddp.py`: the agent is a fork, and so
    are its 2 workers (forks of the agent's zygote, in sessions of their own, as torchrun starts
    them); the job ends as one started fresh (torchrun's own Popen of each worker) does, bit for
    bit."""
    from lessons import launch
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    jobs = {}
    for name in ("forked", "fresh"):
        cmd = [*launch.TORCHRUN, *launch.torchrun_flags(nproc=2),
               str(SCRIPTS / "_trainup_ddp.py"), *FLAGS, "--epochs", "4", "--run-name", name,
               "--log-dir", str(tmp_path), "--checkpoint-dir", str(tmp_path / "checkpoints")]
        jobs[name] = (warm_start.start(cmd, env, ROOT) if name == "forked" else
                      subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True))
    agent = jobs["forked"]
    assert isinstance(agent, warm_start.Job)
    first = agent.stdout.readline()  # an epoch done: 3 to go, the workers still there
    forked_workers(tmp_path, agent.pid, first)  # sessions of their own, as torchrun's Popen makes
    done = {name: finish_job(job) for name, job in jobs.items()}
    assert [d.returncode for d in done.values()] == [0, 0], done["forked"].stderr[-3000:]
    fresh_pids = {r["pid"] for r in records(tmp_path, "fresh", "ddp")[0]["ranks"]}
    assert len(fresh_pids | {jobs["fresh"].pid}) == 3  # the agent and 2 workers of its own
    for forked, fresh in zip(*(records(tmp_path, n, "epoch") for n in ("forked", "fresh"))):
        assert (forked["loss"], forked["test_loss"]) == (fresh["loss"], fresh["test_loss"])
    assert first.startswith("epoch 1: loss ") and done["forked"].stdout.count("epoch ") == 3


def test_forked_workers_whose_agent_was_killed_are_orphaned_and_end_with_one_sentence_each(
        tmp_path):
    """The zygote dies with the agent (PR_SET_PDEATHSIG): the workers lose their parent as fresh
    ones do, notice, and end with one sentence each; nothing trains on."""
    from lessons import launch
    cmd = [*launch.TORCHRUN, *launch.torchrun_flags(nproc=2), str(SCRIPTS / "_trainup_ddp.py"),
           *FLAGS, "--epochs", "200", "--run-name", "orphan", "--log-dir", str(tmp_path),
           "--checkpoint-dir", str(tmp_path / "checkpoints")]
    agent = warm_start.start(cmd, {**os.environ, "OMP_NUM_THREADS": "1"}, ROOT)
    agent.stdout.readline()
    workers = [r["pid"] for r in records(tmp_path, "orphan", "ddp")[0]["ranks"]]
    os.kill(agent.pid, signal.SIGKILL)
    done = finish_job(agent)  # its output's pipes: open until the workers have gone too
    assert done.returncode == -signal.SIGKILL
    # (counted, not split into lines: two ranks that notice at once may write into each other's)
    assert done.stderr.count("error: ") == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "this rank ends here" in done.stderr
    # their outputs close a moment before their ends: nothing trains on once that moment is over
    deadline = time.monotonic() + 60
    while [pid for pid in workers if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in workers if alive(pid)]


def horovodrun(name, log_dir, epochs):
    from lessons import horovod
    flags, _ = horovod.command(name=name, np=2, quick=False)
    return [*horovod.HOROVODRUN, *flags, sys.executable, str(SCRIPTS / "_trainup_horovod.py"),
            *FLAGS, "--epochs", str(epochs), "--run-name", name, "--log-dir", str(log_dir),
            "--checkpoint-dir", str(log_dir / "checkpoints")]


def until_epoch(job):
    """The launcher's output up to rank 0's first epoch ("[0]<stdout>:epoch 1: ...")."""
    lines = [job.stdout.readline()]
    while lines[-1] and "<stdout>:epoch 1:" not in lines[-1]:
        lines.append(job.stdout.readline())
    return "".join(lines)


def test_horovodruns_launcher_and_its_workers_are_forked_and_end_as_a_fresh_job_does(tmp_path):
    """horovodrun (`python -c "...run_commandline()"`): the launcher is a fork, and so are its 2
    workers (forks of its zygote, in sessions of their own, as horovodrun's shells are); their
    output is prefixed by rank as horovodrun prefixes it, and the job ends as one started fresh
    (horovodrun's own shell for each worker) does, bit for bit."""
    from lessons import horovod
    require_horovod()
    env = horovod.environment()
    assert horovod.HOROVODRUN[2] == warm_start.HOROVODRUN
    jobs = {"forked": warm_start.start(horovodrun("forked", tmp_path, 4), env, ROOT),
            "fresh": subprocess.Popen(horovodrun("fresh", tmp_path, 4), env=env, cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)}
    launcher = jobs["forked"]
    assert isinstance(launcher, warm_start.Job)
    first = until_epoch(launcher)  # an epoch done: 3 to go, the workers still there
    forked_workers(tmp_path, launcher.pid, first)  # sessions of their own, as horovod's shells
    done = {name: finish_job(job) for name, job in jobs.items()}
    assert [d.returncode for d in done.values()] == [0, 0], done["forked"].stderr[-3000:]
    for forked, fresh in zip(*(records(tmp_path, n, "epoch") for n in ("forked", "fresh"))):
        assert (forked["loss"], forked["test_loss"]) == (fresh["loss"], fresh["test_loss"])
    out = {n: first + d.stdout if n == "forked" else d.stdout for n, d in done.items()}
    epochs = {n: [line.split()[:3] for line in text.splitlines() if "<stdout>:epoch " in line]
              for n, text in out.items()}
    assert epochs["forked"] == epochs["fresh"] and len(epochs["fresh"]) == 4, out


def test_a_forked_horovodrun_stopped_by_sigterm_stops_its_workers_as_horovodrun_does(tmp_path):
    """SIGTERM to the launcher: horovodrun passes it to each worker (its shell's child), the
    workers stop after the same step and save, and nothing is left running."""
    from lessons import horovod
    require_horovod()
    launcher = warm_start.start(horovodrun("stopped", tmp_path, 200), horovod.environment(),
                                ROOT)
    until_epoch(launcher)
    workers = [r["pid"] for r in records(tmp_path, "stopped", "ddp")[0]["ranks"]]
    os.kill(launcher.pid, signal.SIGTERM)
    done = finish_job(launcher)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "exit with status code 75" in done.stdout, done.stdout[-3000:]
    assert "SIGTERM: stopped in epoch" in done.stdout + done.stderr
    assert not [pid for pid in workers if alive(pid)]
    assert (tmp_path / "checkpoints" / "stopped.pt").exists()


def alive(pid):
    """Running, neither gone nor a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def parent(pid):
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_start_time_variables_give_a_server_of_their_own(tmp_path):
    """OpenMP reads OMP_NUM_THREADS as torch loads it: a job with its own value is forked from a
    server started with that value, and runs with it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    job = warm_start.start(command("t1", tmp_path), env, ROOT)
    assert isinstance(job, warm_start.Job) and finish_job(job).returncode == 0
    assert records(tmp_path, "t1", "env")[0]["threads"] == 1
    assert [dict(key[1]).get("OMP_NUM_THREADS") for key in warm_start._SERVERS][-1] == "1"


def test_what_a_fork_cannot_take_starts_fresh(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # a test's sitecustomize, run at start-up
    assert warm_start.start(command("x", tmp_path), env, ROOT) is None
    torchrun = ["torchrun", str(SCRIPTS / "_trainup_gpu.py")]
    assert warm_start.start(torchrun, os.environ, ROOT) is None
    off = {**os.environ, "TRAINUP_WARM_START": "0"}
    os.environ["TRAINUP_WARM_START"] = "0"
    try:
        assert warm_start.start(command("x", tmp_path), off, ROOT) is None
    finally:
        del os.environ["TRAINUP_WARM_START"]


def test_a_forked_job_gets_signals_in_its_own_session_and_says_how_it_ended(tmp_path):
    job = warm_start.start(command("long", tmp_path, "--epochs", "50"), dict(os.environ), ROOT)
    assert os.getpgid(job.pid) == job.pid  # a session of its own, as start_new_session makes
    job.stdout.readline()  # it has trained an epoch
    os.killpg(job.pid, signal.SIGKILL)
    assert job.wait(timeout=60) == -signal.SIGKILL
    bad = warm_start.start(command("bad", tmp_path, "--batch-size", "0"), dict(os.environ),
                           ROOT)
    out, err = bad.communicate(timeout=120)
    assert_clean_error(subprocess.CompletedProcess(bad.args, bad.returncode, out, err),
                       "--batch-size")


def test_a_notebooks_job_is_forked_with_its_output_as_the_cell_reads_it(tmp_path, monkeypatch):
    """lessons.jobs.start as the tests' kernels have it (install_in_kernel): a script named from
    the course's folder is forked, stderr merged into stdout where asked, bytes or text as asked;
    any other command is subprocess.Popen's."""
    from lessons import jobs
    monkeypatch.setattr(jobs, "start", jobs.start)  # put back after the test
    warm_start.install_in_kernel()
    assert jobs.start is warm_start.popen
    started = []
    monkeypatch.setattr(warm_start, "Job", lambda *a: started.append(a) or warm_start_job(*a))
    cmd = [sys.executable, "scripts/_trainup_gpu.py", *FLAGS, "--batch-size", "0",
           "--log-dir", str(tmp_path)]
    bad = jobs.run(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stderr_to_stdout=True)
    assert len(started) == 1, "the job was not forked"
    assert bad.returncode == 2 and bad.stderr == ""
    # argparse's sentence, from stderr, merged into stdout
    assert bad.stdout.startswith("_trainup_gpu.py: error: argument --batch-size")
    proc = jobs.start(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, out) == (2, "") and err.startswith("_trainup_gpu.py: error: ")
    plain = jobs.start([sys.executable, "-c", "print(1)"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
    assert isinstance(plain, subprocess.Popen) and plain.communicate()[0] == b"1\n"
    assert len(started) == 2


warm_start_job = warm_start.Job


def test_the_notebooks_kernels_start_their_jobs_from_a_warm_interpreter():
    """tests/nbval_kernels.py: a kernel nbval starts runs install_in_kernel before any cell."""
    import nbval_kernels
    km = nbval_kernels._manager(kernel_name="python3")
    km.start_kernel(cwd=str(ROOT / "notebooks"))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        said = []
        kc.execute_interactive("from lessons import jobs; print(jobs.start.__module__)",
                               timeout=120, output_hook=lambda m: said.append(
                                   m["content"].get("text", "")))
        assert "".join(said).strip() == "warm_start"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_job_that_spawns_finds_its_script_from_its_own_folder(tmp_path, monkeypatch):
    """multiprocessing's spawn (Hogwild's workers) finds a __main__ named from the job's folder
    through the folder the interpreter started in: a fork's is the job's, not its server's."""
    monkeypatch.chdir(tmp_path)  # the server starts here, as a kernel's starts in notebooks/
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TRAINUP_SERVER_OF_THIS_TEST": "1"}
    cmd = [sys.executable, "scripts/_trainup_hogwild.py", "--num-processes", "2", "--threads",
           "1", "--quick", "--epochs", "1", "--no-progress", "--log-dir", str(tmp_path)]
    job = warm_start.popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    assert isinstance(job, warm_start.Job)
    out, _ = job.communicate(timeout=300)
    assert job.returncode == 0, out[-3000:]
