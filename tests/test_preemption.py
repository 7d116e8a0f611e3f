"""Runs that lose nothing: default names that cannot collide, one writer per run, and a run stopped by SIGTERM
in the middle of an epoch that resumes to the very parameters of a run never stopped (plain and 2-process DDP).

The signal is sent from inside the job, by conftest's sitecustomize.py put first on
PYTHONPATH (stop_site): an optimizer step hook that sends SIGTERM after global step N, on one
rank only, to its own process or its group. So the stop lands at a known step on any machine, fast
or slow, and nothing in scripts/ carries a switch for tests. Lightning's stops are in
tests/test_lightning.py. The real-SLURM requeue test is in tests/test_slurm.py's style, below.
"""

import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from conftest import (
    ROOT,
    SCRIPTS,
    STOP_AT,
    STOP_TINY,
    Ranks,
    assert_clean_error,
    finish_job,
    hold_lock,
    in_process,
    start_job,
    stop_at,
    stop_site,
    torchrun_exit_codes,
    wanted_jobs,
)
from lessons import launch, report
from trainup import metrics, preempt


def python(script, *flags, log_dir, env):
    return start_job(
        [
            sys.executable,
            str(SCRIPTS / script),
            *map(str, flags),
            "--log-dir",
            str(log_dir),
            "--checkpoint-dir",
            str(log_dir / "checkpoints"),
        ],
        {**os.environ, **env},
    )


def params(log_dir, name):
    return torch.load(log_dir / "checkpoints" / f"{name}.pt", weights_only=True)["model"]


def lines(log_dir, name):
    return [json.loads(line) for line in (log_dir / f"{name}.jsonl").read_text().splitlines()]


def ok(proc, code=0):
    assert proc.returncode == code, (
        f"exit {proc.returncode}, not {code}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


def dead_lock(path):
    """A lock file left by a writer that died (its flock went with it): on another host, which a check of
    this machine's processes could never tell dead from alive."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("a-node-that-died 4242")


@pytest.fixture(scope="module")
def plain(tmp_path_factory, request):
    """_trainup_cpu.py: straight; stopped by SIGTERM after step 3 (then twice more: conftest's
    TRAINUP_TEST_TWICE) and resumed (over a dead run's lock); and two runs without --run-name
    started in the same (frozen) second. Those the selected tests read (their jobs marks) only: a
    test alone, as the breakages run it, makes its own."""
    want = wanted_jobs(request)

    def wanted(name):
        return want is None or name in want

    tmp = tmp_path_factory.mktemp("pre")
    log_dir = tmp / "logs"
    env = stop_site(tmp / "site")

    def cpu(name, *flags, **extra):
        return python(
            "_trainup_cpu.py",
            *STOP_TINY,
            "--run-name",
            name,
            *flags,
            log_dir=log_dir,
            env={**env, **extra},
        )

    dead_lock(log_dir / "stopped.lock")
    starts = {
        "straight": lambda: cpu("straight"),
        "stopped": lambda: cpu("stopped", TRAINUP_TEST_TWICE=str(STOP_AT)),
        "in_eval": lambda: cpu("in_eval", TRAINUP_TEST_SIGTERM_IN_EVAL="1"),
    }
    jobs = {k: start() for k, start in starts.items() if wanted(k)}
    out = SimpleNamespace(
        log_dir=log_dir, twins_dir=tmp / "twins", **{k: finish_job(p) for k, p in jobs.items()}
    )
    # the resumes and the twins, side by side: none reads another's files
    later = {}
    if wanted("stopped"):  # the checkpoint at the stop, before --resume replaces it
        out.at_stop = torch.load(log_dir / "checkpoints" / "stopped.pt", weights_only=True)
        later["resumed"] = cpu("stopped", "--resume")
    if wanted("in_eval"):
        later["in_eval_resumed"] = cpu("in_eval", "--resume")
    if wanted("twins"):
        frozen = {**env, "TRAINUP_TEST_FROZEN_TIME": str(time.time())}
        later["twins"] = [
            python(
                "_trainup_cpu.py",
                "--quick",
                "--train-size",
                "64",
                "--test-size",
                "32",
                "--epochs",
                "1",
                "--seed",
                seed,
                "--no-progress",
                log_dir=out.twins_dir,
                env=frozen,
            )
            for seed in (1, 2)
        ]
    for name, job in later.items():
        setattr(out, name, [finish_job(p) for p in job] if name == "twins" else finish_job(job))
    return out


@pytest.mark.jobs("stopped")
def test_sigterm_stops_after_the_step_in_progress_saves_and_exits_75(plain):
    """A second SIGTERM during the stop, and a third as the interpreter shuts down (the caller's
    handlers handed back), change nothing: exit 75, nothing on stderr."""
    ok(plain.stopped, preempt.STOPPED_EXIT)
    assert f"SIGTERM: stopped in epoch 1 after step {STOP_AT}" in plain.stopped.stdout
    assert not plain.stopped.stderr, plain.stopped.stderr[-3000:]
    run = report.read_run(plain.log_dir / "stopped.jsonl")
    assert run["problems"] == []
    saved = plain.at_stop
    assert (
        saved["epoch"] == 0
        and saved["position"]["epoch"] == 1
        and saved["position"]["step"] == STOP_AT
    )


@pytest.mark.jobs("straight", "stopped")
def test_resume_goes_on_from_the_step_and_ends_like_a_run_never_stopped(plain):
    """Dropout is on: only with the random states restored do the masks, and so the parameters, match."""
    ok(plain.straight), ok(plain.resumed)
    resumed, straight = params(plain.log_dir, "stopped"), params(plain.log_dir, "straight")
    for k in straight:
        assert torch.equal(resumed[k], straight[k]), k
    logged = lines(plain.log_dir, "stopped")
    assert [r["status"] for r in logged if r["type"] == "summary"] == ["stopped", "finished"]
    assert [r["epoch"] for r in logged if r["type"] == "epoch"] == [
        1,
        2,
    ]  # epoch 1 logged once, whole
    ref = [r for r in lines(plain.log_dir, "straight") if r["type"] == "epoch"]
    mine = [r for r in logged if r["type"] == "epoch"]
    for a, b in zip(mine, ref):  # the resumed epoch's sums include the steps taken before the stop
        assert (a["loss"], a["accuracy"], a["samples"]) == (b["loss"], b["accuracy"], b["samples"])


@pytest.mark.jobs("straight", "in_eval")
def test_a_stop_during_evaluation_keeps_the_random_states_and_resumes_exactly(plain):
    """Signalled as epoch 1's evaluation starts: the stop lands after the epoch, saved like any stop (random
    states included, at step 0 of epoch 2), so dropout's masks in epoch 2 are the unstopped run's."""
    ok(plain.in_eval, preempt.STOPPED_EXIT), ok(plain.in_eval_resumed)
    assert "SIGTERM: stopped after epoch 1" in plain.in_eval.stdout
    resumed, straight = params(plain.log_dir, "in_eval"), params(plain.log_dir, "straight")
    for k in straight:
        assert torch.equal(resumed[k], straight[k]), k


@pytest.mark.jobs("stopped")
def test_a_dead_writers_lock_is_taken_over_and_locks_are_released(plain):
    assert not list(plain.log_dir.glob("*.lock")) and not list(
        (plain.log_dir / "checkpoints").glob(".*.lock")
    )


def test_a_process_forked_by_the_writer_writes_as_it_and_leaves_it_the_lock(tmp_path):
    """ddp_notebook forks a notebook's kernel, which took the run's lock (lightning_run.Run): its
    rank 0 writes the run as that writer, and the lock stays the kernel's until it lets go."""
    from trainup import runlock

    path = tmp_path / "r.lock"
    lock = runlock.Lock(path, "run 'r'")
    pid = os.fork()
    if pid == 0:  # the forked rank
        try:
            child = runlock.Lock(path, "run 'r'")
            ours = child.ours
            child.release()
            os._exit(0 if ours and path.exists() else 3)
        except BaseException:
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert path.exists()
    lock.release()
    assert not path.exists()


@pytest.mark.jobs("twins")
def test_two_runs_started_in_the_same_second_get_different_names_and_both_logs_survive(plain):
    for p in plain.twins:
        ok(p)
    logs = sorted(plain.twins_dir.glob("cpu_*.jsonl"))
    assert len(logs) == 2, logs
    stamps = {p.stem.split("_")[1] for p in logs}
    assert len(stamps) == 1  # the same second: the time alone would have collided
    assert {lines(plain.twins_dir, p.stem)[0]["args"]["seed"] for p in logs} == {1, 2}
    assert len(list((plain.twins_dir / "checkpoints").glob("*.pt"))) == 2


def _main():
    import _trainup_cpu

    return _trainup_cpu.main


@pytest.fixture
def keep_signals():
    """A Stopper made in this process (in_process) catches SIGTERM: give pytest its own handlers back after."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_a_second_live_writer_is_refused_in_one_sentence(tmp_path, capsys, keep_signals):
    """A lock held by a live process (a sleeping child here) on the same run name: refused, nothing written."""
    holder = hold_lock(tmp_path / "logs" / "busy.lock")
    try:
        proc = in_process(
            _main(),
            [
                "--quick",
                "--train-size",
                "64",
                "--epochs",
                "1",
                "--run-name",
                "busy",
                "--log-dir",
                tmp_path / "logs",
                "--checkpoint-dir",
                tmp_path / "ck",
                "--no-progress",
            ],
            capsys,
        )
    finally:
        holder.kill()
        holder.wait()
    assert_clean_error(
        proc, "'busy'", "being written by another run", str(holder.pid), "--run-name"
    )
    assert not (tmp_path / "logs" / "busy.jsonl").exists()


def test_reusing_a_run_name_on_purpose_says_what_it_replaces(tmp_path, capsys):
    args = SimpleNamespace(
        run_name="again",
        log_dir=str(tmp_path),
        checkpoint_dir=str(tmp_path),
        lesson="cpu",
        resume=False,
    )
    (tmp_path / "again.jsonl").write_text("")
    (tmp_path / "again.pt").write_text("")
    metrics.RunLog(args, "x.py", "cpu").close()
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "run name 'again' was used before: this run replaces its again.jsonl and again.pt "
        "(--resume would continue it)"
    ]
    assert not list(tmp_path.glob("*.lock"))


def _torchrun(script, log_dir, name, env, *extra, srun=False):
    """2 ranks under torchrun, or (srun=True) started as srun starts them: a run never stopped,
    whose parameters torchrun's agent (an interpreter of its own) changes nothing in."""
    flags = [*STOP_TINY, "--log-dir", log_dir, "--checkpoint-dir", log_dir / "checkpoints"]
    launcher = [*launch.TORCHRUN, "--standalone", "--nproc-per-node", "2"]
    command = [str(a) for a in [SCRIPTS / script, *flags, "--run-name", name, *extra]]
    env = {**os.environ, **launch.environment(env)}
    if srun:
        return Ranks([sys.executable, *command], env)
    return start_job([*map(str, launcher), *command], env)


@pytest.fixture(scope="module")
def fabric(tmp_path_factory):
    """Lesson 07's Fabric script under torchrun: 2 ranks straight; 2 ranks of which rank 1 alone
    gets SIGTERM after step 3, then --resume."""
    tmp = tmp_path_factory.mktemp("prefabric")
    log_dir, env = tmp / "logs", stop_site(tmp / "site")
    jobs = {
        "straight": _torchrun("_trainup_fabric.py", log_dir, "straight", env),
        "stopped": _torchrun(
            "_trainup_fabric.py",
            log_dir,
            "stopped",
            {**env, **stop_at(1, STOP_AT)},
        ),
    }
    done = {k: finish_job(p) for k, p in jobs.items()}
    at_stop = torch.load(log_dir / "checkpoints" / "stopped.pt", weights_only=True)
    resumed = finish_job(_torchrun("_trainup_fabric.py", log_dir, "stopped", env, "--resume"))
    return SimpleNamespace(log_dir=log_dir, at_stop=at_stop, resumed=resumed, **done)


def test_fabric_ranks_stop_at_one_step_and_resume_to_the_parameters_of_a_run_never_stopped(fabric):
    ok(fabric.straight), ok(fabric.resumed)
    assert fabric.stopped.returncode != 0  # torchrun reports its workers' 75 as a failure
    assert "stopped in epoch 1 after step" in fabric.stopped.stdout, fabric.stopped.stdout[-2000:]
    position = fabric.at_stop["position"]
    assert (position["epoch"], position["world_size"], len(position["ranks"])) == (1, 2, 2)
    assert STOP_AT <= position["step"] < 8  # inside the epoch of 8 steps
    resumed, straight = params(fabric.log_dir, "stopped"), params(fabric.log_dir, "straight")
    for k in straight:
        assert torch.equal(resumed[k], straight[k]), k
    summaries = [r["status"] for r in lines(fabric.log_dir, "stopped") if r["type"] == "summary"]
    assert summaries == ["stopped", "finished"]


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory):
    """Lesson 09's FSDP2 (--shard parameters): 2 ranks straight (started as srun starts them); 2
    ranks under torchrun of which rank 1 alone gets SIGTERM after step 3, then --resume from the
    shards every rank wrote."""
    tmp = tmp_path_factory.mktemp("prefsdp")
    log_dir, env = tmp / "logs", stop_site(tmp / "site")
    flags = ["--shard", "parameters", "--blocks", "2", "--width", "32", "--dropout", "0.2"]
    jobs = {
        "straight": _torchrun("_trainup_fsdp.py", log_dir, "straight", env, *flags, srun=True),
        "stopped": _torchrun(
            "_trainup_fsdp.py",
            log_dir,
            "stopped",
            {**env, **stop_at(1, STOP_AT)},
            *flags,
        ),
    }
    done = {k: finish_job(p) for k, p in jobs.items()}
    folder = log_dir / "checkpoints" / "stopped.dcp"
    at_stop = torch.load(folder / "trainup_position.pt", weights_only=True)
    resumed = finish_job(_torchrun("_trainup_fsdp.py", log_dir, "stopped", env, *flags, "--resume"))
    return SimpleNamespace(log_dir=log_dir, at_stop=at_stop, folder=folder, resumed=resumed, **done)


def test_fsdp_ranks_save_their_shards_at_a_stop_and_resume_to_a_run_never_stopped(fsdp):
    ok(fsdp.straight), ok(fsdp.resumed)
    assert fsdp.stopped.returncode != 0  # torchrun reports its workers' 75 as a failure
    assert "stopped in epoch 1 after step" in fsdp.stopped.stdout, fsdp.stopped.stdout[-2000:]
    assert (fsdp.at_stop["epoch"], fsdp.at_stop["world_size"]) == (1, 2)
    assert STOP_AT <= fsdp.at_stop["step"] < 8
    assert not (fsdp.folder / "trainup_position.pt").exists()  # the resumed run's end replaced it
    resumed, straight = params(fsdp.log_dir, "stopped"), params(fsdp.log_dir, "straight")
    for k in straight:
        assert torch.equal(resumed[k], straight[k]), k
    summaries = [r["status"] for r in lines(fsdp.log_dir, "stopped") if r["type"] == "summary"]
    assert summaries == ["stopped", "finished"]


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    """SIGTERM to the whole process group (what SLURM's time limit and scancel --signal do) while DataLoader
    workers run: lesson 02's script with 2 workers, Hogwild's 2 worker processes, and rank 1 of a
    torchrun DDP job with 2 workers a rank. The runs never stopped load in the main process
    (--workers 0): where a batch is loaded changes no sample and no sum, so the stopped runs'
    workers must end them on those very parameters. Jobs that read no other's files run side by
    side."""
    tmp = tmp_path_factory.mktemp("group")
    log_dir, env = tmp / "logs", stop_site(tmp / "site")
    flags = [*STOP_TINY, "--device", "cpu"]
    workers, in_main = [*flags, "--workers", "2"], [*flags, "--workers", "0"]
    hit = {**env, **stop_at(0, STOP_AT, "TERM", "group")}
    out = ["--log-dir", log_dir, "--checkpoint-dir", log_dir / "checkpoints"]
    ddp = [str(a) for a in [SCRIPTS / "_trainup_ddp.py", *out]]
    torchrun = [*launch.TORCHRUN, "--standalone", "--nproc-per-node", "2", *ddp]

    def ddp_job(name, flags, how, *extra):
        return start_job(
            [*torchrun, *map(str, flags), "--run-name", name, *extra],
            {**os.environ, **launch.environment(how)},
        )

    # rank 1's group: rank 1 and its loader workers (torchrun starts each worker in a session
    # of its own); rank 0 gets no signal
    t_hit = {**env, **stop_at(1, STOP_AT, "TERM", "group")}
    jobs = {
        "straight": python(
            "_trainup_gpu.py", *in_main, "--run-name", "straight", log_dir=log_dir, env=env
        ),
        "stopped": python(
            "_trainup_gpu.py", *workers, "--run-name", "stopped", log_dir=log_dir, env=hit
        ),
        "hogwild": python(
            "_trainup_hogwild.py",
            *STOP_TINY,
            "--num-processes",
            2,
            "--threads",
            1,
            "--run-name",
            "hogwild",
            log_dir=log_dir,
            env={**env, **stop_at(0, 2, "TERM", "group")},
        ),
        "t_straight": Ranks(
            [sys.executable, *ddp, *map(str, in_main), "--run-name", "t_straight"],
            {**os.environ, **launch.environment(env)},
        ),
        "t_stopped": ddp_job("t_stopped", workers, t_hit),
    }
    done = {k: finish_job(p) for k, p in jobs.items()}
    done["at_stop"] = torch.load(log_dir / "checkpoints" / "stopped.pt", weights_only=True)
    done["t_at_stop"] = torch.load(log_dir / "checkpoints" / "t_stopped.pt", weights_only=True)
    resumes = {
        "resumed": python(
            "_trainup_gpu.py",
            *workers,
            "--run-name",
            "stopped",
            "--resume",
            log_dir=log_dir,
            env=env,
        ),
        "t_resumed": ddp_job("t_stopped", workers, env, "--resume"),
    }
    done.update({k: finish_job(p) for k, p in resumes.items()})
    return SimpleNamespace(log_dir=log_dir, **done)


def test_a_signal_to_the_whole_group_stops_a_run_with_loader_workers_and_resumes_exactly(group):
    ok(group.straight), ok(group.stopped, preempt.STOPPED_EXIT), ok(group.resumed)
    assert "DataLoader worker" not in group.stopped.stderr
    assert group.at_stop["position"]["step"] == STOP_AT
    assert not list((group.log_dir / "checkpoints").glob("*.tmp"))
    resumed, straight = params(group.log_dir, "stopped"), params(group.log_dir, "straight")
    for k in straight:
        assert torch.equal(resumed[k], straight[k]), k


def test_one_ranks_group_signalled_stops_every_rank_at_the_step_it_posted_and_resumes_exactly(
    group,
):
    """torchrun's rank 1 and its 2 DataLoader workers get SIGTERM after step 3, rank 0 none: rank
    1 posts "stop after step 4", every rank exits 75 after that step (torchrun reports the stop as
    a failure of its own), no loader worker fails, and --resume ends as if never stopped."""
    stopped = group.t_stopped
    out = stopped.stdout + stopped.stderr
    assert stopped.returncode != 0 and "DataLoader worker" not in out, out[-3000:]
    assert torchrun_exit_codes(stopped) == {0: preempt.STOPPED_EXIT, 1: preempt.STOPPED_EXIT}
    ok(group.t_straight), ok(group.t_resumed)
    # rank 1, signalled in step 3, posts "stop after step 4": rank 0 may already be inside step 4
    after = STOP_AT + preempt.STOP_CHECK["cpu"][1]
    assert f"a signal on another rank: stopped in epoch 1 after step {after}" in stopped.stdout
    position = group.t_at_stop["position"]
    assert (
        position["epoch"],
        position["step"],
        position["world_size"],
        len(position["ranks"]),
    ) == (1, after, 2, 2)
    summaries = [r["status"] for r in lines(group.log_dir, "t_stopped") if r["type"] == "summary"]
    assert summaries == ["stopped", "finished"]
    resumed, straight = params(group.log_dir, "t_stopped"), params(group.log_dir, "t_straight")
    for k in straight:
        assert torch.equal(resumed[k], straight[k]), k


def test_a_signal_to_the_whole_group_stops_hogwild_after_the_epoch(group):
    """Hogwild's workers ignore the signal and finish the epoch; the main process saves it and ends them."""
    ok(group.hogwild, preempt.STOPPED_EXIT)
    assert "SIGTERM: stopped after epoch 1" in group.hogwild.stdout
    logged = lines(group.log_dir, "hogwild")
    assert [r["status"] for r in logged if r["type"] == "summary"] == ["stopped"]
    assert torch.load(group.log_dir / "checkpoints" / "hogwild.pt", weights_only=True)["epoch"] == 1


def _stopped_by_two(tmp_path, world_size=2):
    from trainup import checkpoint

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    args = SimpleNamespace(run_name="w", run_name_default=False, stop_signal="USR1", resume=True)
    ckpt = tmp_path / "w.pt"
    ranks = [
        dict(rng=preempt.rng_state(), meter=[1.0, 2.0, 3.0]),
        dict(rng=None, meter=[4.0, 5.0, 6.0]),
    ]
    checkpoint.save(
        ckpt,
        model,
        optimizer,
        scheduler,
        0,
        args,
        position=dict(epoch=1, step=2, world_size=world_size, ranks=ranks, extra={}),
    )
    assert (
        checkpoint.load(ckpt, model, optimizer, scheduler) == 1
    )  # the stopped epoch, not the next
    return preempt.Stopper(args).watch(ckpt, None, model, optimizer, scheduler)


def test_resuming_inside_an_epoch_with_another_world_size_goes_on_from_the_step(
    tmp_path, keep_signals
):
    """Elastic torchrun: a job of 2 stopped at step 2 goes on at step 3 in a job of 1, with the
    job's sums so far; the batches it skips are the ones the 2 ranks took together (same global
    batch)."""
    stopper = _stopped_by_two(tmp_path)
    data = torch.utils.data.TensorDataset(torch.arange(8.0))
    steps = stopper.batches(torch.utils.data.DataLoader(data, batch_size=2), 1)
    assert steps.skip == 2 and len(steps) == 2
    assert steps.meter.as_tensor().tolist() == [5.0, 7.0, 9.0]
    assert [b[0].tolist() for b in steps] == [[4.0, 5.0], [6.0, 7.0]]


def test_resuming_inside_an_epoch_with_another_world_size_and_padded_shares_is_one_sentence(
    tmp_path, keep_signals
):
    from trainup import UserError

    stopper = _stopped_by_two(tmp_path)
    data = torch.utils.data.TensorDataset(torch.arange(7.0))  # 7 samples: 2 ranks would get 4 each
    with pytest.raises(
        UserError,
        match=r"stopped inside an epoch by a job of 2 process\(es\), and "
        r"this one has 1: 7 samples do not split evenly",
    ):
        stopper.batches(torch.utils.data.DataLoader(data, batch_size=2), 1)


# --- A real SLURM: the requeue template, stopped midway, comes back and finishes -------------------------------

REQUEUE = ROOT / "slurm" / "requeue" / "cpu.sbatch"


def test_the_requeue_template_is_well_formed():
    from lessons.bylesson import slurm

    assert subprocess.run(["bash", "-n", str(REQUEUE)]).returncode == 0
    sentence, problems = slurm.check_counts(REQUEUE)
    assert problems == [], sentence
    opts = slurm.directives(REQUEUE)
    assert opts["signal"] == "B:USR1@60" and "requeue" in opts and opts["open-mode"] == "append"
    text = REQUEUE.read_text()
    assert "--resume --stop-signal USR1" in text and 'scontrol requeue "$SLURM_JOB_ID"' in text


@pytest.fixture(scope="module")
def requeued(local_slurm, tmp_path_factory):
    """The same job twice, side by side: one never stopped; one given its notice once it trains (requeued)."""
    from lessons.bylesson import slurm

    tmp = tmp_path_factory.mktemp("requeue")
    flags = [
        "--quick",
        "--train-size",
        "256",
        "--test-size",
        "64",
        "--batch-size",
        "16",
        "--epochs",
        "3",
        "--log-dir",
        tmp,
        "--checkpoint-dir",
        tmp / "checkpoints",
    ]
    ids = {
        name: slurm.submit(
            "slurm/requeue/cpu.sbatch",
            *flags,
            sbatch_args=[f"--output={tmp}/{name}.out", f"--job-name={name}"],
        )
        for name in ("straight", "stopped")
    }
    seen = slurm.stop_midway(ids["stopped"], tmp / f"stopped_{ids['stopped']}.jsonl")
    states = slurm.wait([ids["straight"]], timeout=600)
    return SimpleNamespace(tmp=tmp, ids=ids, seen=seen, straight_state=states[ids["straight"]])


def test_a_requeued_slurm_job_comes_back_and_ends_like_the_job_never_stopped(requeued):
    tmp, ids = requeued.tmp, requeued.ids
    out = (tmp / "stopped.out").read_text()
    assert requeued.straight_state == "COMPLETED", (tmp / "straight.out").read_text()
    assert requeued.seen[-1] == "COMPLETED" and "PENDING" in requeued.seen[1:], (requeued.seen, out)
    assert "stopped with a checkpoint" in out and out.count(f"job {ids['stopped']} starts") == 2, (
        out
    )
    stopped, straight = f"stopped_{ids['stopped']}", f"straight_{ids['straight']}"
    logged = lines(tmp, stopped)
    assert [r["status"] for r in logged if r["type"] == "summary"] == ["stopped", "finished"], out
    resumed, never = params(tmp, stopped), params(tmp, straight)
    for k in never:
        assert torch.equal(resumed[k], never[k]), k


@pytest.mark.parametrize(
    "key,saved,mine",
    [
        ("batch_size", 32, 16),
        ("train_size", 256, 128),
        ("model", "cnn", "mlp"),
        ("precision", "32", "64"),
        ("lesson", "fsdp", "ddp"),
    ],
)
def test_a_resume_with_changed_flags_is_refused_in_one_sentence(tmp_path, key, saved, mine):
    """Stopped at --batch-size 32, resumed with 16: 672 samples of epoch 1 would be trained twice."""
    from trainup import UserError, checkpoint

    args = SimpleNamespace(
        checkpoint_dir=str(tmp_path),
        run_name="r",
        lesson="ddp",
        model="cnn",
        dataset="digits",
        train_size=256,
        batch_size=32,
        precision="32",
    )
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    path = checkpoint.path_for(SimpleNamespace(**{**vars(args), key: saved}))
    checkpoint.save(path, model, opt, sched, 1, SimpleNamespace(**{**vars(args), key: saved}))
    assert (
        checkpoint.load(
            checkpoint.path_for(SimpleNamespace(**{**vars(args), key: saved})), model, opt, sched
        )
        == 2
    )
    checkpoint.path_for(SimpleNamespace(**{**vars(args), key: mine}))
    flag = "the script" if key == "lesson" else "--" + key.replace("_", "-")
    said = (
        f"holds a {saved} whose weights do not fit this run's model \\({mine}\\)"
        if key == "model"
        else f"saved by a run with {flag} {saved}, and this run has {mine}"
    )
    with pytest.raises(UserError, match=said):
        checkpoint.load(path, model, opt, sched)


def test_workers_whose_torchrun_was_killed_end_with_one_sentence_each(tmp_path):
    """SIGKILL to torchrun's agent after step 3: its workers notice (the store it served stops answering, or
    their parent changed, or a peer left a collective) and end, each with one sentence, no orphan training on."""
    env = stop_site(tmp_path / "site", **stop_at(0, STOP_AT, "KILL", "agent"))
    cmd = [
        *launch.TORCHRUN,
        "--standalone",
        "--nproc-per-node",
        "2",
        SCRIPTS / "_trainup_ddp.py",
        *STOP_TINY,
        "--device",
        "cpu",
        "--epochs",
        "3",
        "--run-name",
        "orphan",
        "--log-dir",
        tmp_path / "logs",
        "--checkpoint-dir",
        tmp_path / "logs" / "checkpoints",
    ]
    done = finish_job(start_job([str(c) for c in cmd], {**os.environ, **launch.environment(env)}))
    assert (
        done.returncode == -signal.SIGKILL
    )  # the agent; its workers' pipes closed when they ended
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2 and all("this rank ends here" in e for e in errors), done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    summaries = [r["status"] for r in lines(tmp_path / "logs", "orphan") if r["type"] == "summary"]
    assert summaries in ([], ["failed"])  # it never claims to have finished
