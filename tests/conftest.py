"""Shared test plumbing: the course's module on sys.path, and running a script for real.

TRAINUP_SCRIPTS_DIR points the tests at another copy of scripts/ (tests/test_breakages.py runs tests
against copies with one deliberate defect each, to prove that the tests catch it).
"""

import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import suite_plugin as suite
from suite_plugin import SHARED_OUTCOMES, plain_id

ROOT = Path(__file__).resolve().parents[1]
# the date in a reference set's name (<machine>_<date>) where a test makes one
DAY = "2026-01-01"
SCRIPTS = Path(os.environ.get("TRAINUP_SCRIPTS_DIR", ROOT / "scripts"))
sys.path.insert(0, str(SCRIPTS))


# The fast tier (`bash run_tests.sh -m fast`, tests/README.md): files of unit tests whole, and one
# real multi-process run per strategy, each a test whose module starts only the jobs it reads.
FAST_FILES = {
    "test_activations.py",
    "test_data.py",
    "test_elastic.py",
    "test_gpumon.py",
    "test_install.py",
    "test_k8s.py",
    "test_lesson_shape.py",
    "test_metrics.py",
    "test_perfmodel.py",
    "test_planner.py",
    "test_predict_here.py",
    "test_readme.py",
    "test_stored_outputs.py",
    "test_fresh_jobs.py",
    "test_machine.py",
    "test_style.py",
    "test_manifest.py",
}
FAST_TESTS = {
    "test_horovod.py::test_two_horovod_ranks_with_half_the_batch_end_like_one_process_with_all_of_it",
    "test_blocks.py::test_two_ranks_end_with_the_parameters_of_one_process",
    "test_ddp.py::test_two_ranks_with_half_the_batch_end_like_one_process_with_all_of_it",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = plain_id(item.nodeid).split("::")
        if path[0].startswith("tests/") and (
            path[0][len("tests/") :] in FAST_FILES
            or "::".join([path[0][len("tests/") :], path[-1].split("[")[0]]) in FAST_TESTS
        ):
            item.add_marker(pytest.mark.fast)


def wanted_jobs(request):
    """The jobs that the selected tests using this fixture read (their jobs marks), so that a test run alone
    (tests/test_breakages.py runs its targets so) starts only its own; None where one has no mark: all."""
    want = set()
    for item in request.session.items:
        if getattr(item, "module", None) is request.module and request.fixturename in getattr(
            item, "fixturenames", ()
        ):
            mark = item.get_closest_marker("jobs")
            if mark is None:
                return None
            want.update(mark.args)
    return want


def start_wanted(request, starters):
    """starters: name -> a function that starts that job (a Popen); the wanted ones started, side by side,
    then each finished (finish_job): name -> its CompletedProcess, or None where no selected test reads it."""
    want = wanted_jobs(request)
    procs = {name: start() for name, start in starters.items() if want is None or name in want}
    return {name: finish_job(procs[name]) if name in procs else None for name in starters}


def notebook_cells(request, notebook):
    """The cells of `notebook` that this session runs on the unbroken course: none where it does
    not run it (a test file run alone, the fast tier) or where the scripts are the breakages'
    copies. Without them a test makes its own runs, and may start them beside its others at once."""
    if os.environ.get("TRAINUP_SCRIPTS_DIR"):
        return set()
    return {
        plain_id(item.nodeid)
        for item in request.session.items
        if plain_id(item.nodeid).startswith(f"{notebook}::")
    }


def notebook_passed(request, notebook, poll_s=2.0):
    """Whether this session runs `notebook` ("notebooks/04c_elastic.ipynb") on the unbroken course
    and every one of its cells passed, waited for where another xdist worker runs it: a test that
    would make one of that notebook's runs again reads the notebook's instead (one job, run once).
    False where this session does not run it (a test file run alone, the breakages' copies), where
    a cell failed or it did not end in time: the test then makes the run itself."""
    cells = notebook_cells(request, notebook)
    xdist = SHARED_OUTCOMES in getattr(request.config, "workerinput", {})
    deadline = time.monotonic() + suite.NOTEBOOK_WAIT_S
    while cells:
        seen = {**suite.shared_outcomes(request.config), **suite.OUTCOMES}
        if cells <= seen.keys():
            return all(seen[cell] == "passed" for cell in cells)
        if not xdist or time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return False


def notebook_or_own(request, notebook, load, make):
    """A run a notebook also makes: the notebook's, read back (load()), where this session ran that
    notebook and every cell passed; else make() makes the test's own. One job, run once."""
    if notebook_passed(request, notebook):
        found = load()
        assert found is not None, f"{notebook} passed without leaving its run's record"
        return found
    return make()


def drill_beside_its_baseline(folder, flags, env, drill):
    """A drill (drill(log_dir, checkpoint_dir) makes it) and, side by side, one process of
    lesson 04's DDP script with the same flags: the run it must end equal to. Returns (the
    drill, "one")."""
    logs, ckpt = folder / "logs", folder / "checkpoints"
    one = start_job(
        [
            sys.executable,
            str(SCRIPTS / "_trainup_ddp.py"),
            *flags,
            "--quick",
            "--run-name",
            "one",
            "--log-dir",
            str(logs),
            "--checkpoint-dir",
            str(ckpt),
        ],
        env,
    )
    made = drill(logs, ckpt)
    done = finish_job(one)
    assert done.returncode == 0, done.stderr[-3000:]
    return made, "one"


HANG_GUARD_S = 240  # far beyond a healthy job: reaching it means the job hung, and the test fails


def start_job(cmd, env):
    """Start a job as a learner does, a fresh interpreter (under its launcher where cmd names one),
    in a session of its own, so that a hung job can be ended with all its children."""
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )


def finish_job(proc):
    """Wait for a job started by start_job; a job still running after HANG_GUARD_S hung: end it, fail."""
    if isinstance(proc, (Baseline, Ranks)):
        return proc.finish()
    try:
        out, err = proc.communicate(timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        try:  # whatever it wrote says where it hung
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            out, err = "", "(its output: held open by a process outside its tree)"
        raise AssertionError(
            f"{proc.args} did not end within {HANG_GUARD_S} s: it hung\n"
            f"{(out or '')[-2000:]}\n{(err or '')[-4000:]}"
        ) from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def descendants(pid):
    """pid's children, theirs, and so on (Linux's /proc): also those in sessions of their own, as
    torchrun starts its workers, which a signal to pid's process group does not reach."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended while listed
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(pid):
    """SIGKILL a hung job: its process group and every descendant, listed before any dies (a
    killed parent's children are handed to init and no longer found under it)."""
    tree = descendants(pid)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def srun_env(rank, ntasks, port, job="1"):
    """What srun gives task `rank` of an ntasks-task step on one node, and where rank 0 opens the
    store: the scripts read these as they read torchrun's."""
    return dict(
        SLURM_PROCID=str(rank),
        SLURM_NTASKS=str(ntasks),
        SLURM_LOCALID=str(rank),
        SLURM_NNODES="1",
        SLURM_NODEID="0",
        SLURM_JOB_ID=job,
        SLURM_STEP_ID="0",
        MASTER_PORT=str(port),
    )


class Ranks:
    """A job's ranks started as `srun -n N python ...` starts them: no launcher (a test that is not
    about torchrun spares its agent, an interpreter of its own). finish(): rank 0's output, the
    first non-zero exit status."""

    def __init__(self, cmd, env, ntasks=2):
        from trainup import distributed

        port = distributed.free_port()
        self.procs = [start_job(cmd, {**env, **srun_env(r, ntasks, port)}) for r in range(ntasks)]

    def finish(self):
        done = [finish_job(p) for p in self.procs]
        code = next((d.returncode for d in done if d.returncode), 0)
        return subprocess.CompletedProcess(
            done[0].args, code, done[0].stdout, "".join(d.stderr for d in done)
        )


# The one-process run that the proofs of DDP, Horovod and Lightning compare with, the same in each
# file (float64: threads and kernels move it by about 1e-16). It is made once a session and reused
# by the breakages' pytests whose copy leaves its code alone (start_baseline).
BASELINE = [
    "--quick",
    "--dropout",
    "0",
    "--device",
    "cpu",
    "--batch-size",
    "64",
    "--precision",
    "64",
]
RUN_CACHE = "TRAINUP_RUN_CACHE"  # where runs made once are kept; the breakages' pytests inherit it


def run_cache(factory):
    """The session's folder of runs made once: beside the xdist workers' own temporary folders."""
    if not os.environ.get(RUN_CACHE):
        base = factory.getbasetemp()
        shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
        os.environ[RUN_CACHE] = str(shared / "runs")
    return Path(os.environ[RUN_CACHE])


def baseline_key(scripts=None):
    """What the baseline executes: its script's text, the trainup package's, its flags."""
    scripts = Path(scripts or SCRIPTS)
    digest = hashlib.sha256(repr(BASELINE).encode())
    for path in [scripts / "_trainup_gpu.py", *sorted((scripts / "trainup").rglob("*.py"))]:
        digest.update(str(path.relative_to(scripts)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


class Baseline:
    """start_baseline's run: made by this call, or already made (another worker waits on the lock
    while one makes it). finish() puts one.jsonl and checkpoints/one.pt into log_dir."""

    def __init__(self, folder, log_dir):
        from lessons import launch

        self.folder, self.log_dir = folder, Path(log_dir)
        folder.parent.mkdir(parents=True, exist_ok=True)
        self.lock = open(folder.with_suffix(".lock"), "w")
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        self.proc = None
        if not (folder / "made").exists():
            shutil.rmtree(folder, ignore_errors=True)  # a run that did not finish
            flags = [*BASELINE, "--run-name", "one"]
            self.proc = start_job(
                _script_command("_trainup_gpu.py", flags, folder, None), launch.environment()
            )

    def finish(self):
        done = finish_job(self.proc) if self.proc else subprocess.CompletedProcess([], 0, "", "")
        if done.returncode == 0 and self.proc:
            (self.folder / "made").write_text("")
        fcntl.flock(self.lock, fcntl.LOCK_UN)
        self.lock.close()
        if done.returncode == 0:
            (self.log_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
            shutil.copy(self.folder / "one.jsonl", self.log_dir)
            shutil.copy(self.folder / "checkpoints" / "one.pt", self.log_dir / "checkpoints")
        return done


def start_baseline(tmp_path_factory, log_dir):
    return Baseline(run_cache(tmp_path_factory) / baseline_key(), log_dir)


def _script_command(script, args, log_dir, checkpoint_dir):
    return [
        sys.executable,
        str(SCRIPTS / script),
        *map(str, args),
        "--log-dir",
        str(log_dir),
        "--checkpoint-dir",
        str(checkpoint_dir or Path(log_dir) / "checkpoints"),
        "--no-progress",
    ]


def _failed(script, proc):
    return AssertionError(
        f"{script} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )


def run_script(script, *args, log_dir, timeout=300, env=None, check=True, checkpoint_dir=None):
    """Run scripts/<script> as a learner would (start_job); logs and checkpoints go to log_dir."""
    job = start_job(
        _script_command(script, args, log_dir, checkpoint_dir),
        {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    try:
        out, err = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(job.pid)
        try:
            job.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pass  # held open by a process outside its tree: the timeout is the failure
        raise
    proc = subprocess.CompletedProcess(job.args, job.returncode, out, err)
    if check and proc.returncode != 0:
        raise _failed(script, proc)
    return proc


def start_script(script, *args, log_dir, env=None, checkpoint_dir=None):
    """run_script's run, started and not waited for (finish_script waits): runs that do not depend on each
    other go side by side (most of each is starting Python and importing torch, on one core)."""
    proc = start_job(
        _script_command(script, args, log_dir, checkpoint_dir),
        {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    proc.script = script
    return proc


def finish_script(proc):
    done = finish_job(proc)
    if done.returncode != 0:
        raise _failed(proc.script, done)
    return done


def in_process(main, flags, capsys):
    """Run a script's main() in this interpreter (seconds faster than a new one) where it must stop early:
    its exit status and output, shaped like subprocess's answer so that assert_clean_error reads it."""
    with pytest.raises(SystemExit) as exit:
        main([str(f) for f in flags])
    out, err = capsys.readouterr()
    return SimpleNamespace(returncode=exit.value.code, stdout=out, stderr=err)


def assert_clean_error(proc, *words):
    """Exit status non-zero, one sentence on stderr naming the problem, no traceback."""
    assert proc.returncode != 0, proc.stdout
    err = proc.stderr.strip()
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, err


# Written into a folder put first on PYTHONPATH: Python imports it at start-up in every process
# (torchrun's workers too) and logs each os.replace/os.rename with the process id. Nothing in
# scripts/ is changed.
_RENAME_WATCH = """import os, sys
_log = os.environ.get("TRAINUP_TEST_RENAMES")
if _log:
    def _hook(event, args):
        if event == "os.rename":
            with open(_log, "a") as f:
                f.write(f"{os.getpid()}\\t{os.fspath(args[0])}\\t{os.fspath(args[1])}\\n")
    sys.addaudithook(_hook)
"""


def rename_watch(folder):
    """(env, read): run a job with env, then read() gives the (pid, source, destination) of its renames."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_RENAME_WATCH)
    log = folder / "renames.tsv"
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": path, "TRAINUP_TEST_RENAMES": str(log)}

    def read():
        lines = log.read_text().splitlines() if log.exists() else []
        return [
            (int(pid), Path(src), Path(dst))
            for pid, src, dst in (line.split("\t") for line in lines)
        ]

    return env, read


@pytest.fixture
def log_dir(tmp_path):
    return tmp_path / "logs"


@pytest.fixture(scope="module")
def local_slurm(tmp_path_factory):
    """A real SLURM for the module that asks (apt-get installs it the first time); every daemon stopped by
    pid. Where it cannot start: skipped, or failed under TRAINUP_REQUIRE_SLURM=1 (CI sets it)."""
    from lessons.bylesson import slurm

    state = tmp_path_factory.mktemp("slurm")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRAINUP_SLURM_DIR", str(state))
        started, why = slurm.start(
            owner=os.getpid()
        )  # the owner: a watchdog stops it if this test run dies
        if started == "cannot" and os.environ.get("TRAINUP_REQUIRE_SLURM") != "1":
            pytest.skip(f"the real-SLURM tests need root and Debian's slurm-wlm and munge: {why}")
        if started == "cannot":
            pytest.fail(
                f"TRAINUP_REQUIRE_SLURM=1 (CI) and the local SLURM cannot start: {why}",
                pytrace=False,
            )
        if started != "running":
            pytest.fail(f"the local SLURM did not start: {why}", pytrace=False)
        pids = {f.name: int(f.read_text()) for f in (state / "run").glob("*.pid")}
        try:
            yield state
        finally:
            slurm.stop()
            alive = [
                name
                for name, pid in pids.items()
                if Path(f"/proc/{pid}").exists()
                and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
            ]
            assert not alive, f"still running after stop: {alive}"


# Faults injected from outside the scripts (which hold no switch for them): put first on PYTHONPATH
# as sitecustomize.py, with TRAINUP_FAIL_AT=RANK:STEP[:raise|exit|hang] that rank raises (the
# default), dies at once or hangs just before its optimizer's STEP-th step (counted over the whole
# run), on the first attempt only: a restarted worker (torchrun --max-restarts, a requeued SLURM
# step) runs clean.
FAULT_ENV = "TRAINUP_FAIL_AT"
_FAULTS = """import os
_spec = os.environ.get("TRAINUP_FAIL_AT", "").split(":")
_rank = next((os.environ[k] for k in ("RANK", "HOROVOD_RANK", "SLURM_PROCID") if k in os.environ), "0")
_first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == os.environ.get("SLURM_RESTART_COUNT", "0") == "0"
if len(_spec) >= 2 and _spec[0] == _rank and _first:
    import time
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    _at, _mode, _steps = int(_spec[1]), (_spec[2] if len(_spec) > 2 else "raise"), [0]

    def _fault(optimizer, args, kwargs):
        _steps[0] += 1
        if _steps[0] == _at:
            if _mode == "exit":
                os._exit(1)
            if _mode == "hang":
                time.sleep(3600)
            raise RuntimeError(f"injected fault (TRAINUP_FAIL_AT) at step {_at}")
    register_optimizer_step_pre_hook(_fault)
"""


def require_horovod():
    """Skip where Horovod is not built; fail where TRAINUP_REQUIRE_HOROVOD=1 says it must be."""
    from lessons.bylesson import horovod

    ok, sentence = horovod.available()
    if not ok:
        if os.environ.get("TRAINUP_REQUIRE_HOROVOD") == "1":
            pytest.fail(f"TRAINUP_REQUIRE_HOROVOD=1 but {sentence}", pytrace=False)
        pytest.skip(sentence)


@pytest.fixture(scope="session")
def inject(tmp_path_factory):
    """inject(spec, env=None): env (a job's extra variables) plus the fault spec and its sitecustomize."""
    site = tmp_path_factory.mktemp("faultsite")
    (site / "sitecustomize.py").write_text(_FAULTS)

    def env_with(spec, env=None):
        path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
        return {**(env or {}), FAULT_ENV: spec, "PYTHONPATH": path}

    return env_with


def hold_lock(path):
    """Another live writer of a run: a process holding path's lock as trainup.runlock.Lock holds it (flock,
    its host and pid inside) until killed. Returned once it holds it."""
    code = (
        "import fcntl, os, socket, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR, 0o644)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, f'{socket.gethostname()} {os.getpid()}'.encode())\n"
        "print('held', flush=True)\n"
        "time.sleep(300)\n"
    )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held", "the holder did not take the lock"
    return proc


def start_run(script, nproc, args, log_dir, name, env=None, srun=False):
    """scripts/<script> as a learner starts it: python for one process, torchrun for several (or,
    srun=True, nproc fresh interpreters as srun starts them: Ranks); its log and checkpoint under
    log_dir, named name; launch.environment(env) its variables."""
    from lessons import launch

    cmd = [
        str(SCRIPTS / script),
        *map(str, args),
        "--run-name",
        name,
        "--log-dir",
        str(log_dir),
        "--checkpoint-dir",
        str(Path(log_dir) / "checkpoints"),
    ]
    if srun:
        return Ranks([sys.executable, *cmd], launch.environment(env), ntasks=nproc)
    launcher = (
        launch.TORCHRUN + launch.torchrun_flags(nproc=nproc) if nproc > 1 else [sys.executable]
    )
    return start_job([*launcher, *cmd], launch.environment(env))


def finish_ok(proc, name="job"):
    """finish_job, and its exit status 0 (else its output in the failure)."""
    done = finish_job(proc)
    assert done.returncode == 0, f"{name}: exit {done.returncode}\n{done.stderr[-4000:]}"
    return done


# --- Stops at a known step: the stop-and-resume tests (test_preemption, test_block_stops,
# test_lightning, test_faults_stops) stop a job from inside it, so that the stop lands at a known
# step on any machine, fast or slow, and nothing in scripts/ carries a switch for tests.

# 256 samples in batches of 32: 8 steps an epoch, 2 epochs; STOP_AT: step 3, inside epoch 1
STOP_TINY = [
    "--quick",
    "--train-size",
    "256",
    "--test-size",
    "64",
    "--batch-size",
    "32",
    "--epochs",
    "2",
    "--no-progress",
]
STOP_AT = 3

# Put first on PYTHONPATH as sitecustomize.py: Python imports it at start-up in every process of
# the job (torchrun's workers, Lightning's ranks, loader workers too).
# TRAINUP_TEST_STOP_AT="RANK:STEP:SIGNAL:WHOM": the rank RANK (RANK, SLURM_PROCID or LOCAL_RANK;
#   0 where none is set), after its STEP-th optimizer step, sends SIGNAL to WHOM: "self", "group"
#   (its own process group: a job started in a session of its own, with its children), "launcher"
#   (its parent's group: torchrun's, whose workers run in sessions of their own) or "agent"
#   (SIGKILL to its parent, torchrun's agent, leaving its workers).
# TRAINUP_TEST_TWICE=STEP: after the STEP-th optimizer step this process gets SIGTERM (the stop
#   lands after that very step), a second one 0.1 s later (during the stop), and a third as the
#   interpreter shuts down (atexit): the moment the stop has handed the caller's handlers back,
#   where a second SIGTERM's default action ended the run -15.
# TRAINUP_TEST_SIGTERM_IN_EVAL: SIGTERM to this process as its first evaluation starts.
# TRAINUP_TEST_FROZEN_TIME: time.strftime frozen at that time, so that two runs surely start "in
#   the same second".
# TRAINUP_TEST_PIDS: a folder where every Python process of the job leaves a file named by its
#   process id, holding its rank ("launcher" where RANK is unset), and " stopped" as it exits after
#   a stop.
_STOP_SITE = """import atexit, os, signal, sys, time
_pids = os.environ.get("TRAINUP_TEST_PIDS")
if _pids:
    _mine = os.path.join(_pids, str(os.getpid()))
    with open(_mine, "w") as f:
        f.write(os.environ.get("RANK", "launcher"))
    def _note_stop():
        # a run that stopped (SystemExit 75 out of main) ignores the stop signals as it exits
        # (cli.main_guard): noted, since torchrun, signalled itself, reports no rank's status
        if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
            with open(_mine, "a") as f:
                f.write(" stopped")
    atexit.register(_note_stop)
_frozen = os.environ.get("TRAINUP_TEST_FROZEN_TIME")
if _frozen:
    _strftime = time.strftime
    time.strftime = lambda fmt, t=None: _strftime(fmt, time.localtime(float(_frozen)))
_at = os.environ.get("TRAINUP_TEST_STOP_AT", "").split(":")
_twice = os.environ.get("TRAINUP_TEST_TWICE")

def _rank():  # read as the step ends: a launcher may set it after start-up
    names = ("RANK", "SLURM_PROCID", "LOCAL_RANK")
    return next((os.environ[k] for k in names if k in os.environ), "0")

def _signal_after(step, send, rank=None):
    def _hook(event, args, done=[0]):
        if done[0] or event != "import" or "torch.optim.optimizer" not in sys.modules:
            return
        done[0] = 1
        from torch.optim.optimizer import register_optimizer_step_post_hook
        steps = [0]
        def count(opt, a, kw):
            steps[0] += 1
            if steps[0] == step and rank in (None, _rank()):
                send()
        register_optimizer_step_post_hook(count)
    sys.addaudithook(_hook)

def _send():
    import subprocess
    name, whom = _at[2], _at[3]
    if whom == "agent":
        os.kill(os.getppid(), signal.SIGKILL)
    elif whom in ("group", "launcher"):  # from another process, as a scheduler signals
        group = os.getpgid(0 if whom == "group" else os.getppid())
        subprocess.run(["kill", f"-{name}", "--", f"-{group}"])
    else:
        os.kill(os.getpid(), getattr(signal, f"SIG{name}"))

def _send_twice():
    import subprocess
    me = os.getpid()
    os.kill(me, signal.SIGTERM)
    subprocess.Popen(["sh", "-c", f"sleep 0.1; kill -TERM {me}"])
    def again():
        os.kill(me, signal.SIGTERM)
        time.sleep(0.2)
    atexit.register(again)

if len(_at) == 4:
    _signal_after(int(_at[1]), _send, rank=_at[0])
# rank 1 stalls after that step, as a hung disk or a stopped process would
_stall = os.environ.get("TRAINUP_TEST_STALL_AT")
if _stall:
    _signal_after(int(_stall), lambda: time.sleep(30), rank="1")
if _twice:
    _signal_after(int(_twice), _send_twice)
if os.environ.get("TRAINUP_TEST_SIGTERM_IN_EVAL"):
    def _eval_hook(event, args, done=[0]):
        if done[0] or event != "import" or "torch.optim.optimizer" not in sys.modules:
            return
        done[0] = 1
        import torch
        evaluate = torch.nn.Module.eval
        def signalled(self, sent=[0]):
            if not sent[0]:
                sent[0] = 1
                os.kill(os.getpid(), signal.SIGTERM)
            return evaluate(self)
        torch.nn.Module.eval = signalled
    sys.addaudithook(_eval_hook)
"""


def stop_site(folder, **env):
    """The variables that put _STOP_SITE (written into folder) first on PYTHONPATH, one thread a
    process, unbuffered output, and env (TRAINUP_TEST_STOP_AT and the like): a job's extra
    variables, for launch.environment or beside os.environ."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_STOP_SITE)
    return {
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p
        ),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        **env,
    }


def stop_at(rank, step, signal="TERM", whom="self"):
    """TRAINUP_TEST_STOP_AT's value: rank `rank` sends SIG<signal> to whom after step `step`."""
    return {"TRAINUP_TEST_STOP_AT": f"{rank}:{step}:{signal}:{whom}"}


def torchrun_exit_codes(done):
    """Each rank's exit status, from torchrun's table of failed workers."""
    import re

    return {
        int(r): int(c)
        for r, c in re.findall(
            r"rank\s*:\s*(\d+) \(local_rank.*?\n\s*exitcode\s*:\s*(-?\d+)",
            done.stderr + done.stdout,
        )
    }


def alive(pid):
    """Whether process pid still runs (a zombie has ended; its parent has not yet collected it)."""
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False


def stopped_params(path):
    """The model's parameters in the course checkpoint at path."""
    import torch

    return torch.load(path, weights_only=True)["model"]


def assert_same_params(mine, never):
    """Every parameter of mine equal, bit for bit, to the never-stopped run's."""
    import torch

    assert mine.keys() == never.keys()
    for k in never:
        assert torch.equal(mine[k], never[k]), k


@pytest.fixture
def one_rank_group(tmp_path):
    """A real gloo group of one process, as a 1-process torchrun job has."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()
