"""Start a script the tests run in a process that has imported torch already: a fork of a warm
one.

Most of a quick run is starting Python: importing torch (about 1.7 CPU-seconds here) and
torch._dynamo, which the first optimizer imports (about 1.1 more: torch.optim wraps
add_param_group in torch._disable_dynamo). The suite runs hundreds of such jobs on 2 cores. So a
test's job is, where it can be, a fork of a server that imported the course's scripts once: the
child takes the job's argv, environment, folder, session and output pipes, runs the script file as
__main__ (runpy, as `python script.py` does) and leaves through the interpreter's own shutdown, as
the script would. tests/test_exit.py forks its ranks the same way. Its processes are as real as
any: they talk over gloo, get signals, exit with their own status. Under the tests the
notebooks' kernels start their jobs so too (install_in_kernel, run as each kernel starts:
tests/nbval_kernels.py); command 1 and a learner's Jupyter start each as a fresh interpreter.

What is read once, at a process's start, cannot change after the fork: the interpreter's flags
(PYTHON*), OpenMP's and the allocator's settings (OMP_*, MALLOC_*), the variables torch reads at
import (TORCH_*, except torchelastic's), TRAINUP_LOG_DIR (trainup's __init__). A job is forked from
a server started with exactly its values of every variable but those read while it runs (RUNTIME:
a rank's place, the store's address, SLURM's and torchelastic's variables); where servers would
multiply, the job starts as a fresh interpreter (start() returns None). A breakage's copy of
scripts/ gets a server that imports torch and nothing of the course: each job imports the
copy's own modules, as a fresh interpreter would. torchrun's agent
(`python -m torch.distributed.run ... scripts/x.py`) is forked the same way, and so are the
workers it starts: before the agent starts, while it is still one thread with torch imported, it
forks a process of its own that forks each worker on
the agent's request (zygote()), in the worker's own session with the worker's argv, variables,
folder and output, as `python -u scripts/x.py` starts; the agent's Popen of a worker (torchrun's
SubprocessHandler._popen) asks it, and anything else it starts as before. It dies with the agent
(PR_SET_PDEATHSIG), so that a worker whose agent was killed is orphaned as a fresh one is.
horovodrun's launcher (`python -c "...run_commandline()"`) is forked so too, and its workers are
forks of its zygote where horovodrun would start `env HOROVOD_...=... python scripts/x.py` in a
shell: their output is prefixed by rank by horovod's own code, a stop or another rank's failure
ends them as horovod ends its shells, and the launcher's death sends them SIGTERM, as horovod's
middle process does.
torchrun's and horovodrun's own starts of their workers run where a job cannot be forked (a
test's sitecustomize: tests/test_ddp.py's, tests/test_preemption.py's and tests/test_horovod.py's
fault jobs; SLURM's) and in the fresh jobs that tests/test_warm_start.py compares forked ones with.
TRAINUP_WARM_START=0 turns it all off.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

# variables a script reads while it runs (never at import): they may differ from the server's
RUNTIME = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
           "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR",
           "MASTER_PORT",
           "TORCH_NCCL_ASYNC_ERROR_HANDLING",  # torchrun's, for its workers: read by NCCL's group
           "PYTEST_CURRENT_TEST", "TRAINUP_RUN_CACHE")  # the last two: the tests' own
RUNTIME_PREFIXES = ("SLURM_", "TORCHELASTIC_")
TORCHRUN = "torch.distributed.run"
HOROVODRUN = "from horovod.runner.launch import run_commandline; run_commandline()"  # `-c` of it
# what horovodrun adds to each worker's variables (its rank, the rendezvous): read at hvd.init()
HOROVOD_RUNTIME = ("HOROVOD_", "NCCL_SOCKET_IFNAME")
MAX_SERVERS = 3  # a server holds torch's pages (some 400 MB): a few environments, not each
# imported once by each server: what the scripts that fork import at their top (Horovod's,
# Lightning's and Ray's scripts import their engines themselves, in the child)
WARM = ("_trainup_cpu", "_trainup_gpu", "_trainup_dp", "_trainup_ddp", "_trainup_ddp_tuned",
        "_trainup_fsdp", "_trainup_tp", "_trainup_pipeline", "_trainup_pipeline_manual",
        "_trainup_collectives", "_trainup_blocks", "_trainup_hogwild")

SERVER = r'''
import json, os, runpy, selectors, signal, socket, sys
sock = socket.socket(fileno=int(sys.argv[1]))
sys.path[0] = sys.argv[2]  # as `python scripts/x.py` has it: the script's folder first
import numpy  # its OpenBLAS starts its threads now, and re-makes them in a fork (pthread_atfork)
blas = len(os.listdir("/proc/self/task"))
import torch, torch._dynamo  # what every run imports: paid once, here
for name in sys.argv[3:]:
    __import__(name)
# a fork copies the calling thread alone: no other may run here (OpenMP's start at first use)
extra = len(os.listdir("/proc/self/task")) - blas
sock.send(json.dumps({"ready": extra == 0, "threads": extra}).encode())
wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)  # a child's end wakes the select below
signal.signal(signal.SIGCHLD, lambda *a: None)
sel = selectors.DefaultSelector()
sel.register(sock, selectors.EVENT_READ)
sel.register(wake_r, selectors.EVENT_READ)
children, job = set(), None
while job is None:
    for key, _ in sel.select():
        if key.fileobj == wake_r:
            os.read(wake_r, 4096)
            continue
        data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 2)
        if not data:  # the tests have gone: so does the server
            os._exit(0)
        sys.stdout.flush(), sys.stderr.flush()
        started_r, started_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            job, fds_of_job = json.loads(data), fds
            os.close(started_r)
            break
        os.close(started_w)
        os.read(started_r, 1)  # its session made: a signal to its group from now on reaches it
        os.close(started_r)
        for fd in fds:
            os.close(fd)
        children.add(pid)
        sock.send(json.dumps({"pid": pid}).encode())
    while children and job is None:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if not pid:
            break
        children.discard(pid)
        sock.send(json.dumps({"ended": pid, "code": os.waitstatus_to_exitcode(status)}).encode())
# the child: one job, started as `python script.py args` starts it, ended by the interpreter
signal.set_wakeup_fd(-1)
signal.signal(signal.SIGCHLD, signal.SIG_DFL)
sel.close(), sock.close(), os.close(wake_r), os.close(wake_w)
if job["new_session"]:
    os.setsid()
os.write(started_w, b"1"), os.close(started_w)
os.chdir(job["cwd"])
if "multiprocessing.process" in sys.modules:  # the folder it started in, as a fresh one has it:
    sys.modules["multiprocessing.process"].ORIGINAL_DIR = os.getcwd()  # spawn finds __main__ by it
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0), os.dup2(fds_of_job[0], 1), os.dup2(fds_of_job[1], 2)
for fd in (null, *fds_of_job):
    os.close(fd)
os.environ.clear()
os.environ.update(job["env"])
sys.argv = job["argv"]
if job.get("tests"):  # torchrun's or horovodrun's launcher, whose workers are forked too
    sys.path.append(job["tests"])
    import warm_start
    sys.path.pop()
    # in a worker: its job, as `python -u script` starts it (warm_start.zygote)
    job = warm_start.zygote(sys.path[0], job["route"]) or job
if job.get("module"):  # torchrun's agent: `python -m torch.distributed.run ...`
    runpy.run_module(job["module"], run_name="__main__", alter_sys=True)
elif job.get("code"):  # horovodrun's launcher: `python -c "...run_commandline()" ...`
    sys.path[0] = ""
    exec(compile(job["code"], "<string>", "exec"), {"__name__": "__main__"})
else:
    runpy.run_path(sys.argv[0], run_name="__main__")
'''


class Forks:
    """A process that forks jobs on request (a SERVER, or an agent's zygote) and the thread that
    reads what it says: each fork's pid, each child's exit status."""

    def __init__(self, sock, ready=True):
        import queue
        self.sock, self.pids, self.codes, self.running = sock, queue.Queue(), {}, set()
        self.ended = threading.Condition()
        self.lock = threading.Lock()
        self.ready = ready
        if self.ready:
            threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self):
        while True:
            data = self.sock.recv(1 << 16)
            if not data:  # the process died: no job of its will be told it ended
                self.ready = False
                self.pids.put(None)
                with self.ended:
                    self.ended.notify_all()
                return
            said = json.loads(data)
            if "pid" in said:
                self.pids.put(said["pid"])
            else:
                with self.ended:
                    self.codes[said["ended"]] = said["code"]
                    self.running.discard(said["ended"])
                    self.ended.notify_all()

    def send(self, job, fds):
        """Ask for a fork; its pid, once it runs in its own session."""
        with self.lock:
            socket.send_fds(self.sock, [json.dumps(job).encode()], fds)
            pid = self.pids.get()
            with self.ended:
                if pid is not None and pid not in self.codes:
                    self.running.add(pid)
        if pid is None:
            raise RuntimeError("the warm-start server died")
        return pid

    def code(self, pid, timeout):
        with self.ended:
            self.ended.wait_for(lambda: pid in self.codes or not self.ready, timeout)
            if pid in self.codes:
                return self.codes[pid]
            if not self.ready:
                raise RuntimeError("the warm-start server died before its job ended")
            return None


class Server(Forks):
    """One warm process (SERVER)."""

    def __init__(self, scripts, env, warm=WARM):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(theirs.fileno()),
                                      str(scripts), *warm], pass_fds=[theirs.fileno()],
                                     env=env, stdin=subprocess.DEVNULL)
        theirs.close()
        first = json.loads(ours.recv(1 << 16) or b'{"ready": false}')
        super().__init__(ours, first["ready"])

    def fork(self, argv, env, cwd, new_session, module=None, merge=False, code=None):
        """Fork a job (a script, a module run as `python -m`, or code run as `python -c`); its
        pid and the reading ends of its stdout and stderr (merge: stderr into stdout, as
        stderr=subprocess.STDOUT; None)."""
        out_r, out_w = os.pipe()
        err_r, err_w = (None, out_w) if merge else os.pipe()
        route = "torchrun" if module == TORCHRUN else "horovod" if code == HOROVODRUN else None
        job = dict(argv=argv, env=env, cwd=str(cwd), new_session=new_session, module=module,
                   code=code, route=route, tests=str(Path(__file__).parent) if route else None)
        try:
            pid = self.send(job, [out_w, err_w])
        except RuntimeError:
            for fd in {out_r, err_r} - {None}:
                os.close(fd)
            raise
        finally:
            for fd in {out_w, err_w}:
                os.close(fd)
        return pid, out_r, err_r

    def close(self):
        self.sock.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def zygote(scripts, route="torchrun"):
    """In torchrun's agent or horovodrun's launcher, forked from a SERVER before it starts (one
    thread, torch imported): fork the process that forks its workers. None in the launcher, whose
    start of a course script (torchrun's SubprocessHandler._popen, horovodrun's
    safe_shell_exec.execute) now asks that process for a fork; in a worker, its job, the process
    set up as `python -u script.py args` sets one up."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    agent = os.getpid()
    if os.fork():
        theirs.close()
        if route == "horovod":
            _route_horovod(Forks(ours), scripts, _horovod_key(os.environ))
        else:
            _route_workers(Forks(ours), scripts, _key(os.environ))
        return None
    ours.close()
    return _serve_workers(theirs, agent)


def _route_workers(forks, scripts, key):
    """The agent's side: a worker that is a script of the course's, with the variables read at
    start that the zygote has, is a fork of it; anything else starts as torchrun starts it."""
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler
    handler = subprocess_handler.SubprocessHandler
    popen = handler._popen

    def _popen(self, args, env):
        argv = [str(a) for a in args]
        script = Path(argv[2]) if len(argv) > 2 and argv[:2] == [sys.executable, "-u"] else None
        if (script is None or not forks.ready or _key(env) != key
                or not script.name.startswith("_trainup_") or script.suffix != ".py"
                or Path(os.getcwd(), script).resolve().parent != Path(scripts).resolve()):
            return popen(self, args, env)
        outs = [f.fileno() if f else fd for f, fd in ((self._stdout, 1), (self._stderr, 2))]
        job = dict(argv=argv[2:], env=env, cwd=os.getcwd())
        return Job(forks, forks.send(job, outs), argv)

    handler._popen = _popen


def _horovod_key(env):
    return _key({k: v for k, v in env.items() if not k.startswith(HOROVOD_RUNTIME)})


def _horovod_job(command, env, scripts, key):
    """A worker's job from horovodrun's command for it (`env K=V ... python script.py args`, run
    by a shell with the launcher's variables); None where it is not a script of the course's or
    its variables read at start differ from the zygote's."""
    import re
    import shlex
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if words[:1] != ["env"]:
        return None
    assigned = [w for w in words[1:] if re.match(r"[A-Za-z_][A-Za-z0-9_]*=", w)]
    argv = words[1 + len(assigned):]
    if len(argv) < 2 or argv[0] != sys.executable or not argv[1].endswith(".py"):
        return None
    script = Path(os.getcwd(), argv[1])
    if (not script.name.startswith("_trainup_")
            or script.resolve().parent != Path(scripts).resolve()):
        return None
    env = {**(os.environ if env is None else env), **dict(w.split("=", 1) for w in assigned)}
    if _horovod_key(env) != key:
        return None
    return dict(argv=argv[1:], env=env, cwd=os.getcwd(), pdeathsig=int(signal.SIGTERM))


class _Fd:
    """A pipe's reading end as horovod's prefix_connection reads it (fileno, close)."""

    def __init__(self, fd):
        self.fd = fd

    def fileno(self):
        return self.fd

    def close(self):
        os.close(self.fd)


def _route_horovod(forks, scripts, key):
    """horovodrun's side: each worker that is a script of the course's, with the variables read at
    start that the zygote has, is a fork of it, its output prefixed and its end awaited as
    horovodrun's safe_shell_exec.execute does for the shell it starts; anything else as before.
    A worker whose launcher dies gets SIGTERM (as horovod's middle process sends it)."""
    from horovod.runner.common.util import safe_shell_exec
    from horovod.runner.util.threads import in_thread, on_event
    execute = safe_shell_exec.execute

    def _execute(command, env=None, stdout=None, stderr=None, index=None, events=None,
                 prefix_output_with_timestamp=False):
        job = _horovod_job(command, env, scripts, key) if forks.ready else None
        if job is None:
            return execute(command, env, stdout, stderr, index, events,
                           prefix_output_with_timestamp)
        (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
        try:
            pid = forks.send(job, [out_w, err_w])
        except RuntimeError:  # the zygote died: the worker as horovodrun starts it
            os.close(out_r), os.close(err_r)
            return execute(command, env, stdout, stderr, index, events,
                           prefix_output_with_timestamp)
        finally:
            os.close(out_w), os.close(err_w)
        outputs = [in_thread(safe_shell_exec.prefix_connection,
                             (_Fd(fd), to or default, name, index, prefix_output_with_timestamp))
                   for fd, to, default, name in ((out_r, stdout, sys.stdout, "stdout"),
                                                 (err_r, stderr, sys.stderr, "stderr"))]
        stop = threading.Event()
        for event in events or []:  # another worker failed, or horovodrun was stopped
            on_event(event, _stop_worker, args=(pid,), stop=stop, silent=True)
        try:
            code = forks.code(pid, None)
        finally:
            stop.set()
        for t in outputs:
            t.join()
        return 128 - code if code < 0 else code  # a signal's end, as the shell reports it

    safe_shell_exec.execute = _execute


def _stop_worker(pid, grace_s=5):
    """What horovod's terminate_executor_shell_and_children does to the shell's child: SIGTERM,
    and after grace_s, SIGKILL to it and whatever it started."""
    import psutil
    try:
        worker = psutil.Process(pid)
        worker.terminate()
    except psutil.NoSuchProcess:
        return
    for p in psutil.wait_procs([worker], timeout=grace_s)[1]:
        try:
            for child in p.children(recursive=True):
                child.kill()
            p.kill()
        except psutil.NoSuchProcess:
            pass


def _serve_workers(sock, agent):
    """The zygote: forks a worker for each request; says each one's pid and exit status. It holds
    nothing of the agent's open (its output's readers wait for the end of it) and dies with it."""
    import ctypes
    import select
    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    if os.getppid() != agent:  # it died before that
        os._exit(0)
    zygote = os.getpid()
    os.closerange(3, sock.fileno())
    os.closerange(sock.fileno() + 1, 1 << 16)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)  # a child's end wakes the select below
    signal.signal(signal.SIGCHLD, lambda *a: None)
    children, listening = set(), True
    while listening or children:
        ready = select.select([sock, wake_r] if listening else [wake_r], [], [])[0]
        if wake_r in ready:
            os.read(wake_r, 4096)
        if sock in ready:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 2)
            if not data:  # the agent is done: the zygote ends with its last worker
                listening = False
                continue
            started_r, started_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for fd in (sock.fileno(), wake_r, wake_w, started_r):
                    os.close(fd)
                os.setsid()  # torchrun starts each worker in a session of its own
                job = json.loads(data)
                if job.get("pdeathsig"):  # horovod's: the launcher's death ends its workers
                    ctypes.CDLL(None).prctl(1, job["pdeathsig"])  # PR_SET_PDEATHSIG
                    if os.getppid() != zygote:  # the zygote (with the launcher) died before
                        os.kill(os.getpid(), job["pdeathsig"])
                os.write(started_w, b"1"), os.close(started_w)
                return _become_worker(job, fds)
            os.close(started_w)
            os.read(started_r, 1)  # its session made: torchrun's killpg reaches it from now on
            os.close(started_r)
            for fd in fds:
                os.close(fd)
            children.add(pid)
            sock.send(json.dumps({"pid": pid}).encode())
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if not pid:
                break
            children.discard(pid)
            if listening:
                try:
                    sock.send(json.dumps({"ended": pid,
                                          "code": os.waitstatus_to_exitcode(status)}).encode())
                except OSError:  # the agent is gone: no one to tell
                    listening = False
    os._exit(0)


def _become_worker(job, fds):
    """A worker's process, as `python -u script.py args` has it; the SERVER's end runs it."""
    import io
    os.chdir(job["cwd"])
    os.dup2(fds[0], 1), os.dup2(fds[1], 2)
    for fd in fds:
        os.close(fd)
    os.environ.clear()
    os.environ.update(job["env"])
    sys.argv = job["argv"]
    sys.path[0] = str(Path(job["argv"][0]).resolve().parent)  # as `python dir/script.py` has it
    for fd, name, errors in ((1, "stdout", "strict"), (2, "stderr", "backslashreplace")):
        # -u: written through to the file at once
        stream = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), write_through=True,
                                  encoding=getattr(sys, name).encoding, errors=errors)
        setattr(sys, name, stream), setattr(sys, f"__{name}__", stream)
    if "multiprocessing.process" in sys.modules:  # the folder `python script.py` started in
        sys.modules["multiprocessing.process"].ORIGINAL_DIR = os.getcwd()
    return dict(argv=job["argv"], module=None)


_SERVERS = {}


def _key(env):
    return tuple(sorted((k, v) for k, v in env.items()
                        if k not in RUNTIME and not k.startswith(RUNTIME_PREFIXES)))


def start(cmd, env, cwd, new_session=True, merge=False, text=True):
    """cmd ([sys.executable, a script of the course's, args...]) forked from a warm server made
    with env's start-time variables; None where it must start as a fresh interpreter instead.
    merge: stderr into stdout; text: str pipes (else bytes), as subprocess.Popen's."""
    if os.environ.get("TRAINUP_WARM_START") == "0" or sys.platform != "linux":
        return None
    # a breakage's pytest runs a copy of scripts/ (TRAINUP_SCRIPTS_DIR): its server imports torch
    # and nothing of the course, so that each job imports the copy's trainup, as a fresh one does
    copy = bool(os.environ.get("TRAINUP_SCRIPTS_DIR"))
    if len(cmd) < 2 or cmd[0] != sys.executable:
        return None
    # torchrun's agent and horovodrun's launcher are forked too, and fork their workers
    module = cmd[2] if [str(a) for a in cmd[1:3]] == ["-m", TORCHRUN] else None
    code = cmd[2] if [str(a) for a in cmd[1:3]] == ["-c", HOROVODRUN] else None
    launcher = module or code
    scripts = [Path(a) for a in cmd[3 if launcher else 1:] if str(a).endswith(".py")]
    if not scripts or (not launcher and str(cmd[1]) != str(scripts[0])):
        return None
    script = Path(cwd, scripts[0])  # a notebook's job names it from the course's folder
    if script.parent.name != "scripts" or not script.name.startswith("_trainup_"):
        return None
    if env.get("PYTHONPATH", "") != os.environ.get("PYTHONPATH", ""):
        return None  # a sitecustomize of a test's, run at the start of each process
    env = dict(env)
    key = (str(script.parent), _key(env))
    server = _SERVERS.pop(key, None)  # put back last: the most recently used
    if server is None:
        idle = [k for k, s in _SERVERS.items() if not s.running]
        if len(_SERVERS) >= MAX_SERVERS and not idle:
            return None
        if len(_SERVERS) >= MAX_SERVERS:  # the least recently used server without a job ends
            _SERVERS.pop(idle[0]).close()
        server = Server(script.parent, dict(key[1]), () if copy else WARM)
    _SERVERS[key] = server
    if not server.ready:
        return None
    argv = [str(a) for a in cmd[3 if launcher else 1:]]
    first = [module] if module else ["-c"] if code else []  # sys.argv[0], as Python sets it
    pid, out, err = server.fork([*first, *argv], env, cwd, new_session, module, merge, code)
    return Job(server, pid, [str(a) for a in cmd], out, err, text)


def popen(argv, **kw):
    """subprocess.Popen(argv, **kw), or where it can, that job forked from a warm server: what
    lessons.jobs.start is in the notebooks' kernels under the tests (install_in_kernel)."""
    piped = (kw.get("stdout") == subprocess.PIPE
             and kw.get("stderr") in (subprocess.PIPE, subprocess.STDOUT))
    if piped and set(kw) <= {"cwd", "env", "stdout", "stderr", "text", "start_new_session"}:
        job = start(argv, dict(kw.get("env") or os.environ), kw.get("cwd") or os.getcwd(),
                    new_session=kw.get("start_new_session", False),
                    merge=kw["stderr"] == subprocess.STDOUT, text=kw.get("text", False))
        if job is not None:
            return job
    return subprocess.Popen(argv, **kw)


def install_in_kernel():
    """Run at the start of a notebook's kernel under the tests (tests/nbval_kernels.py): each job
    its cells start (lessons.jobs.start: the commands they print) that runs one of the course's
    scripts is forked from a warm server, as the tests' own jobs are. What the cells show and
    check is the same: the job is the same script, run as __main__ in a process of its own."""
    from lessons import jobs
    jobs.start = popen


def close_all():
    for server in _SERVERS.values():
        server.close()
    _SERVERS.clear()


class Job:
    """A forked job, as subprocess.Popen(..., stdout=PIPE, stderr=PIPE, text=True) answers."""

    def __init__(self, server, pid, args, out=None, err=None, text=True):
        self.server, self.pid, self.args, self.returncode = server, pid, args, None
        pipe = (lambda fd: open(fd, encoding="utf-8", errors="replace")) if text else (
            lambda fd: open(fd, "rb"))
        # None: not piped (a worker's output is the agent's), or stderr merged into stdout
        self.stdout = None if out is None else pipe(out)
        self.stderr = None if err is None else pipe(err)
        self._read = None

    def poll(self):
        if self.returncode is None:
            self.returncode = self.server.code(self.pid, timeout=0)
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            self.returncode = self.server.code(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, input=None, timeout=None):
        """Both outputs read to their end, side by side (a full pipe would stall the job)."""
        if self._read is None:
            self._read = {}
            self._threads = [threading.Thread(target=self._drain, args=(f,), daemon=True)
                             for f in (self.stdout, self.stderr) if f is not None]
            for t in self._threads:
                t.start()
        deadline = None if timeout is None else _now() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(0, deadline - _now()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.01, deadline - _now()))
        return self._read[self.stdout], self._read.get(self.stderr)

    def _drain(self, f):
        self._read[f] = f.read()
        f.close()

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)


def _now():
    return time.monotonic()
