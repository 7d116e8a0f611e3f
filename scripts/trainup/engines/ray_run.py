"""Ray Train's job of many processes, in the shape of trainup/distributed.py's calls.

    ray_run.add_flags(p)               # --ray-workers, --max-failures, the group's flags
    args, gpus = ray_run.check(args)   # Ray there, the batch splits: said before Ray starts
    with ray_run.cluster(args, gpus):  # a local Ray cluster on this machine, offline
        trainer = TorchTrainer(ray_run.stoppable(train_loop), ...)
        result = ray_run.fit(trainer, args)  # gave up on: one sentence; stopped: exit 75
    ctx = ray_run.context(args)        # in a worker: the Context (Ray joined the group)
    stop = ray_run.Stopper(args, ctx)  # in a worker: the driver's stop, at one step on all ranks
    args, start = ray_run.restore(args, ckpt, model, optimizer, scheduler, device, scaler)
    ray_run.report(record, ckpt, ctx)  # every rank, each epoch; rank 0's with the checkpoint
    ray_run.show_placement()           # in the driver: each actor's process, node and state

Ray is a package like Horovod: where `import ray.train` fails, `ray` is None and check() says
how to install it. Ray's workers are processes of its own (actors) that do not start in the
driver's folder: every path handed to them is absolute.

A stop (SIGTERM or --stop-signal, to the driver or its process group) is the driver's to catch: it
writes the signal's name in stop_file(args); each worker's Stopper reads it there, and the ranks
stop at one step as any script's do (trainup/preempt.py), save, report that checkpoint to Ray and
return; the driver, told so by the last report, exits STOPPED_EXIT. --resume goes on from Ray's
record of that checkpoint, at the very step.
"""
import functools
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from .. import ROOT, UserError, checkpoint, cli, config, devices, preempt
from ..distributed import Context

try:
    import ray
    import ray.train
    import ray.train.torch
except ImportError as e:  # not installed, or one of its dependencies missing
    ray, RAY_MISSING = None, str(e).splitlines()[0] if str(e) else "no module named ray"

PIN = "ray[default,train]==2.60.0"


def add_flags(p):
    """--ray-workers, --max-failures, and the group's flags but --backend: Ray picks it."""
    g = p.add_argument_group("ray")
    g.add_argument("--ray-workers", type=cli.positive(int), default=2,
                   help="training processes (Ray workers); one GPU each where there are GPUs")
    g.add_argument("--max-failures", type=int, default=2,
                   help="times Ray restarts the workers from the last checkpoint after one dies")
    cli.add_group(p, backend=False)


def check(args):
    """What must hold before Ray starts: Ray itself, a batch that splits, a GPU per worker.
    Returns the configuration the workers get (its paths absolute) and the GPUs they take (0 on
    CPUs)."""
    if ray is None:
        raise UserError(f"Ray is not installed in this Python ({RAY_MISSING}); install it with "
                        f"pip install '{PIN}'")
    if args.batch_size % args.ray_workers:
        raise UserError(f"--batch-size {args.batch_size} is the global batch and cannot be split "
                        f"evenly over {args.ray_workers} Ray workers; use a multiple of "
                        f"{args.ray_workers}")
    gpus = devices.gpu_count() if args.device != "cpu" else 0
    if args.device == "cuda" and not gpus:  # else Ray's workers would train on the CPU, unsaid
        raise UserError("--device cuda asks for a GPU for each Ray worker, and this machine has "
                        "none that torch can use; use --device cpu (or auto)")
    if args.device == "auto" and gpus:  # a GPU for each worker, else the CPU (devices.py)
        device, why = devices.auto_device(args.ray_workers, gpus)
        if why:
            print(f"note: {why}", file=sys.stderr)
        gpus = gpus if device == "cuda" else 0
    if gpus and args.ray_workers > gpus:
        raise UserError(f"--ray-workers {args.ray_workers} asks for one GPU each and this machine "
                        f"has {gpus}; use --ray-workers {gpus} or fewer, or --device cpu")
    args = config.replaced(args, **{  # the workers do not start in this folder
        name: str(Path(getattr(args, name)).absolute()) for name in ("log_dir", "checkpoint_dir")})
    kept = checkpoint.path_for(args) if getattr(args, "resume", False) else None
    if kept is not None and kept.exists():  # here: a worker's refusal, Ray would retry, and retry
        checkpoint.same_run(kept, checkpoint.read(kept).get("args") or {}, args)
    return args, gpus


def storage(args):
    """Where Ray keeps the run's checkpoints: <checkpoint-dir>/ray/<run>. A run of the same name
    without --resume starts afresh, as its log does (Ray would otherwise carry the old one on)."""
    folder = Path(args.checkpoint_dir) / "ray"
    if not args.resume:
        shutil.rmtree(folder / args.run_name, ignore_errors=True)
    return str(folder)


@contextmanager
def cluster(args, gpus=0):
    """A Ray cluster of this machine alone for the run (or the running cluster: init_args), no
    usage report; its files in a short temporary folder (a socket's path must stay under 108
    bytes)."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # else Ray reports usage over the network
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")  # else each print shows twice
    # the workers import the train loop's modules: trainup from this checkout
    paths = [str(ROOT / "scripts"), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    address = os.environ.get("RAY_ADDRESS")
    if not address:  # no cloud takes back a node of this machine's own cluster: Ray Train's
        # watcher for that would be one more actor, a process importing Ray, for nothing
        os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    stops = {signal.SIGTERM, getattr(signal, f"SIG{args.stop_signal}")}
    asked = stop_file(args)
    asked.unlink(missing_ok=True)  # an earlier run's of this name
    if not args.resume:
        traceback_file(args).unlink(missing_ok=True)
    try:
        # A stop signal to the driver's whole process group (SLURM's time limit, scancel
        # --signal, kill -TERM -PGID) reaches the processes ray.init starts in it (Ray's GCS,
        # raylet, dashboard), and would end them with the run: they start with the stop signals
        # blocked (a child inherits its parent's signal mask; Ray's workers, the raylet's), and
        # ray.shutdown ends them. Ray's own SIGTERM handler would end the driver: replaced.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, stops)
        try:
            start(init_args(args, gpus, temp, address))
            aside(traceback_file(args))
            for sig in stops:
                signal.signal(sig, lambda signum, _: ask_to_stop(asked, signum))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
        asked.unlink(missing_ok=True)


NODE_LATE = "timed out during startup"  # Ray's words (ray/_private/node.py)
# Ray's heading above the last lines of dashboard.log, raised when its dashboard did not come up
# within RAY_DASHBOARD_STARTUP_TIMEOUT_S (60 s) or exited (ray/_private/services.py)
DASHBOARD_LATE = "(it contains the error message from the dashboard)"
# raised instead when the dashboard died before writing either of its logs (both empty)
DASHBOARD_SILENT = "Failed to read dashboard.err file"
# for each start Ray gave up on: what to say once, and for good
LATE = {
    NODE_LATE: ("Ray's node did not register within Ray's 30 s",
                f"Ray's node {NODE_LATE} {{tries}} times (Ray waits 30 s for it to register): "
                "this machine is too busy; run again once it is quieter"),
    DASHBOARD_LATE: ("Ray's dashboard did not start within Ray's 60 s",
                     "Ray's dashboard did not start {tries} times (Ray waits 60 s for it, "
                     "RAY_DASHBOARD_STARTUP_TIMEOUT_S): this machine is too busy, or the "
                     "dashboard fails; run again once it is quieter"),
}
LATE[DASHBOARD_SILENT] = LATE[DASHBOARD_LATE]


def start(init, tries=2):
    """ray.init. Ray waits 30 s (its own constant) for a local node's raylet to register with
    the GCS, and 60 s for its dashboard to start; on a loaded machine either can pass (seen with
    the test suite and more jobs on 2 cores: "The current node timed out during startup", "Failed
    to start the dashboard"). Then the processes that start began are ended, and the cluster
    started again, up to `tries` times (the lessons' drill waits for the load to fall, and runs
    again: lessons/bylesson/ray_drill.py)."""
    import psutil
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    for attempt in range(tries):
        try:
            return ray.init(**init)
        except Exception as e:  # noqa: BLE001  Ray raises a plain Exception for these
            late = next((LATE[words] for words in LATE if words in str(e)), None)
            if late is None:
                raise
            if attempt == tries - 1:
                raise UserError(late[1].format(tries=tries)) from None
            began = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
            for p in began:
                p.kill()
            psutil.wait_procs(began, timeout=30)
            ray.shutdown()
            print(f"note: {late[0]} (a loaded machine); its processes ended, Ray started again",
                  file=sys.stderr)


def init_args(args, gpus, temp, address=None):
    """ray.init's arguments. A Ray job on a running cluster (`ray job submit`, a RayJob's pod on
    Kubernetes) finds RAY_ADDRESS set: it joins that cluster, whose machines and dashboard are the
    cluster's own. Else a cluster of this machine alone, for the run: one CPU per worker, and the
    dashboard (it serves the state API: Ray Train's clean-up polls it, the lesson reads it) on
    127.0.0.1."""
    if address:
        return dict(address=address, configure_logging=False)
    return dict(address="local", num_cpus=args.ray_workers, num_gpus=gpus,
                include_dashboard=True, dashboard_host="127.0.0.1",
                _node_ip_address="127.0.0.1", _temp_dir=temp, configure_logging=False)


def fit(trainer, args):
    """trainer.fit(); a run that failed more often than --max-failures allows: one sentence. A run
    its workers stopped (the driver's stop signal: their last report says where) exits
    STOPPED_EXIT, once Ray has recorded the stop's checkpoint, saying how to go on."""
    try:
        result = trainer.fit()
    except ray.train.TrainingFailedError as e:
        kept = traceback_file(args)
        where = f" (Ray's tracebacks: {kept})" if kept.exists() else ""
        raise UserError(f"Ray Train gave up on the run after {args.max_failures} restart(s) "
                        f"(--max-failures): {why(e)}{where}") from None
    at = result.metrics or {}
    if STOPPED_IN not in at:
        return result
    asked = stop_file(args)
    print(f"{asked.read_text() if asked.exists() else 'a stop signal'}: stopped in epoch "
          f"{at[STOPPED_IN]} after step {at[AFTER_STEP]}, and Ray keeps that checkpoint in "
          f"{result.checkpoint.path}; --resume --run-name {args.run_name} continues from it")
    raise SystemExit(preempt.STOPPED_EXIT)


# A failed attempt's report in Ray's output, from its first line on: a traceback (each worker's,
# then the controller's again for every worker), Ray Train's heading of a worker's error, and
# its failure policy's (RETRY or RAISE) with the errors it names
REPORT_START = re.compile(r"Traceback \(most recent call last\):|Error in training function:|"
                          r"\[FailurePolicy\]")
# the lines that go on with one: indented, empty, Ray's headings, an exception's own line
REPORT_GOES_ON = re.compile(r"\s|$|Error:|\[Rank [\d,]+ Error Snippet\]|"
                            r"[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")


def traceback_file(args):
    """Where the driver keeps what Ray's processes printed of each failure: tracebacks."""
    return Path(args.log_dir) / f"{args.run_name}.ray_errors"


def aside(path):
    """Ray prints what its processes print in the driver's terminal: every failed attempt puts
    each worker's traceback, and each again from Ray's controller, above fit's one sentence.
    Those reports go to path; all else is printed as Ray prints it."""
    from ray._private import worker
    try:  # Ray's own printer, not a public API: where a Ray lacks it, Ray prints as it does
        dispatcher = worker.global_worker_stdstream_dispatcher
        bare = worker._should_ignore_worker_log_prefix(worker.global_worker)
        show = functools.partial(worker.print_to_stdstream, ignore_prefix=bare)
        remove, add = dispatcher.remove_handler, dispatcher.add_handler
    except AttributeError:
        return
    inside = {}  # process id -> whether its last line was part of a report

    def route(data):
        if not data.get("is_err"):
            return show(data)
        shown, kept, pid = [], [], data.get("pid")
        for line in data["lines"]:
            inside[pid] = bool(REPORT_START.search(line) or inside.get(pid)
                               and REPORT_GOES_ON.match(line))
            (kept if inside[pid] else shown).append(line)
        if kept:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as f:
                f.write("".join(f"({data.get('actor_name') or 'ray'} pid={pid}) {line}\n"
                                for line in kept))
        if shown:
            show(dict(data, lines=shown))

    remove("ray_print_logs")
    add("ray_print_logs", route)


STOPPED_IN, AFTER_STEP = "stopped_in_epoch", "stopped_after_step"  # a stop's report to Ray


def stop_file(args):
    """Where the driver asks the workers to stop: beside Ray's folder of the run, which every worker
    reads (on a cluster of many machines a shared disk, as Ray's storage is)."""
    return Path(args.checkpoint_dir) / "ray" / f"{args.run_name}.stop"


def ask_to_stop(path, signum):
    """The driver's handler of the stop signals: the signal's name, written once (whole: renamed
    into place). A second signal during the stop changes nothing."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(signal.Signals(signum).name)
    os.replace(tmp, path)


class Stopped(Exception):
    """A worker's train loop stopped by the driver: stoppable() returns from it."""


def stoppable(loop):
    """The train loop Ray runs: a stop returns from it (the checkpoint reported), where an exit
    would be a failure that Ray restarts the workers from."""
    @functools.wraps(loop)
    def run(config):
        try:
            return loop(config)
        except Stopped:
            return None
    return run


class Stopper(preempt.Stopper):
    """A worker's preempt.Stopper. The signal is the driver's to catch (this loop runs in a thread,
    where Python sets no handler): a thread reads the driver's stop_file. The ranks stop at one
    step, rank 0 saves where they are, and every rank reports it to Ray (rank 0's report with the
    checkpoint, which Ray records) before the loop returns."""

    def __init__(self, args, ctx):
        super().__init__(args, preempt.TorchDistributed(ctx), catch=False)
        self.ctx, self.asked, self.at = ctx, stop_file(self.args), None
        threading.Thread(target=self._read, name="trainup-ray-stop", daemon=True).start()

    def watch(self, *a, **kw):
        """preempt.Stopper.watch; a run Ray started again from its checkpoint resumes (restore),
        where a stop may have left it inside an epoch."""
        if ray.train.get_checkpoint() is not None:
            self.args = config.replaced(self.args, resume=True)
        return super().watch(*a, **kw)

    def _read(self, every_s=0.2):
        while self.signal is None:
            try:
                self.signal = self.asked.read_text()
            except FileNotFoundError:  # not asked (yet)
                time.sleep(every_s)

    def _save(self, epoch, step, meter, wall_s):
        self.at = (epoch, step)
        return super()._save(epoch, step, meter, wall_s)

    def _exit(self, ckpt, log, where):
        epoch, step = self.at
        report({STOPPED_IN: epoch, AFTER_STEP: step}, ckpt, self.ctx)  # the driver says it
        log.summary(checkpoint=ckpt, status="stopped")
        raise Stopped(where)


def placement():
    """What ran where, from Ray's state API (the dashboard serves it): each of the run's actors,
    its process, node and state, the dead ones too (a killed worker and the group it took down).
    Asked of this run's own cluster by its address: without one the state API looks for a cluster
    on the machine, and refuses where another Ray program runs one too."""
    from ray.util.state import list_actors
    here = ray.get_runtime_context().gcs_address
    return [dict(actor=a.class_name, pid=a.pid, node=a.node_id[:8], state=a.state)
            for a in list_actors(address=here, detail=True, raise_on_missing_output=False)
            if a.class_name in ("TrainController", "RayTrainWorker")]


def show_placement():
    for a in placement():
        print(f"Ray's state API: {a['actor']} pid {a['pid']} on node {a['node']}: {a['state']}")


def why(error):
    """Each failed rank in a few words: a process that died, or its error's last line (a
    UserError's sentence, or the exception). A controller's error: its own last line."""
    failures = getattr(error, "worker_failures", None) or {None: error}
    parts = []
    for rank, cause in sorted(failures.items(), key=lambda f: f[0] or 0):
        lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
        died = type(cause).__name__ == "WorkerHealthCheckFailedError"  # Ray's, not public
        lost = cli.PEER_GONE.search(str(cause))  # gloo's, when another rank died mid-collective
        said = ("its process died" if died else f"another rank is gone ({lost.group(0)})" if lost
                else lines[-1][:300] if lines else type(cause).__name__)
        parts.append(said if rank is None else f"rank {rank}: {said}")
    return "; ".join(parts)


def context(args):
    """This worker's place in the job, from Ray: Ray joined the process group (gloo, or nccl
    with GPUs) before the train loop started, so it is not joined again here."""
    if args.precision == "64":  # cli.parse set it in the driver; this is another process
        torch.set_default_dtype(torch.float64)
    if args.threads:
        torch.set_num_threads(args.threads)
    c = ray.train.get_context()
    return Context(rank=c.get_world_rank(), world_size=c.get_world_size(),
                   local_rank=c.get_local_rank(), local_world_size=c.get_local_world_size(),
                   node_rank=c.get_node_rank(), launcher="ray",
                   nnodes=max(c.get_world_size() // c.get_local_world_size(), 1),
                   master_addr=os.environ.get("MASTER_ADDR", ""),
                   master_port=int(os.environ.get("MASTER_PORT", 0)),
                   backend=dist.get_backend(),
                   device=ray.train.torch.get_device(), timeout_s=args.timeout)


def restore(args, path, model, optimizer, scheduler, device, scaler=None):
    """The configuration to go on with and the epoch to start from. After a failure Ray starts
    every worker again and hands it the last checkpoint it kept: the run goes on from there, its
    log appended (resume). Else --resume reads the course's own."""
    kept = ray.train.get_checkpoint()
    if kept is None:
        if not args.resume:
            return args, 1
        return args, checkpoint.load(path, model, optimizer, scheduler, device, scaler)
    args = config.replaced(args, resume=True)  # the log goes on
    with kept.as_directory() as folder:
        saved = Path(folder) / path.name
        epoch = checkpoint.load(saved, model, optimizer, scheduler, device, scaler)
    # where a stop left the run inside an epoch: the Stopper looks for it under the run's own path
    checkpoint._POSITIONS[str(path)] = checkpoint.position(saved)
    return args, epoch


def report(record, path, ctx):
    """Every rank reports each epoch (Ray waits for all); rank 0's carries a copy of the course's
    checkpoint, which Ray keeps in its storage (CheckpointConfig: the last num_to_keep)."""
    metrics = {k: v for k, v in record.items() if isinstance(v, (int, float))}
    if not ctx.is_main:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as folder:
        shutil.copy2(path, Path(folder) / path.name)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))
