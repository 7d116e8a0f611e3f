"""The block-stack scripts (lessons 06 and 09) stopped by a scheduler's signal inside an epoch: a
real torchrun job (2 processes; the four dimensions' 8), signalled after a known optimizer step,
exits 75 on every rank with a checkpoint of what each rank holds, and `--resume` ends with the
parameters of a run never stopped, bit for bit; no process of the job outlives it. A stop asked
for during an epoch's evaluation stops right after that epoch's checkpoint, and lesson 06's halves
by hand (send/recv) stop between two steps, each rank saving its own half.

The signal is sent from inside the job, by conftest's sitecustomize.py put first on PYTHONPATH
(stop_site), so that the stop lands at a known step on any machine: SIGTERM, or the course's
default --stop-signal USR1, to torchrun's whole process group (a scheduler's time limit, `scancel
--signal`; torchrun passes it on to its ranks), or USR1 to rank 1 alone. The same file notes the id
of every Python process of the job.
"""

import json
import signal
import sys
from types import SimpleNamespace

import pytest
import torch

from conftest import (
    SCRIPTS,
    STOP_AT,
    STOP_TINY,
    Ranks,
    alive,
    assert_same_params,
    finish_job,
    start_job,
    stop_at,
    stop_site,
    stopped_params,
    torchrun_exit_codes,
)
from lessons import launch
from trainup import preempt

# script -> (its flags for a tiny model, the checkpoint a stop leaves: None for rank 0's <run>.pt)
SCRIPT_FLAGS = {
    "_trainup_blocks.py": (["--blocks", "4", "--width", "32"], None),
    "_trainup_pipeline.py": (["--blocks", "4", "--width", "32", "--microbatches", "2"], ".ranks"),
    "_trainup_tp.py": (["--blocks", "2", "--width", "32", "--hidden", "64"], ".dcp"),
    "_trainup_tp_sp.py": (
        ["--blocks", "1", "--width", "32", "--heads", "2", "--hidden", "64"],
        ".dcp",
    ),
    "_trainup_cp.py": (["--blocks", "1", "--width", "32", "--heads", "2", "--hidden", "64"], None),
    "_trainup_experts.py": (
        ["--blocks", "1", "--width", "32", "--heads", "2", "--hidden", "32"],
        ".ranks",
    ),
    # pp 2 x cp 2 x tp 2, dp 1: 8 processes where every dimension > 1 takes 16, on two cores. The
    # one left at 1 is dp, whose replicas only take other samples, dealt out by a sampler that the
    # stop's skipping of steps does not touch; with cp 2, FSDP still shards every stage over the
    # folded dp x cp dimension, so each rank saves and takes back its shards of its tp slices of
    # its stage (--precision 64: the course's proofs compare float64 runs)
    "_trainup_4d.py": (
        ["--blocks", "2", "--width", "16", "--heads", "2", "--hidden", "32", "--microbatches", "2"]
        + ["--pp", "2", "--dp", "1", "--cp", "2", "--tp", "2", "--precision", "64"],
        ".dcp",
    ),
}
NPROC = {"_trainup_4d.py": 8}  # processes of a script's job; the others' 2


def _torchrun(script, tmp, name, *extra, stop=None, srun=False):
    """The script's job (NPROC) under torchrun, or (srun=True) its ranks started as srun starts
    them."""
    log_dir, pids = tmp / "logs", tmp / f"pids_{name}{len(extra)}"
    pids.mkdir(parents=True, exist_ok=True)
    env = stop_site(tmp / "site", TRAINUP_TEST_PIDS=str(pids), **(stop or {}))
    nproc = NPROC.get(script, 2)
    torchrun = [*launch.TORCHRUN, *launch.torchrun_flags(nproc=nproc)]
    launcher = [sys.executable] if srun else torchrun
    command = [
        *launcher,
        SCRIPTS / script,
        *STOP_TINY,
        *SCRIPT_FLAGS[script][0],
        "--log-dir",
        log_dir,
        "--checkpoint-dir",
        log_dir / "checkpoints",
        "--run-name",
        name,
        *extra,
    ]
    command, env = [str(a) for a in command], launch.environment(env)
    job = Ranks(command, env, ntasks=nproc) if srun else start_job(command, env)
    job.pids = pids
    return job


def _finished(job):
    done = finish_job(job)
    done.left = [p.name for p in job.pids.iterdir() if alive(int(p.name))]
    done.ranks = dict(
        p.read_text().split(" ", 1) if " " in p.read_text() else (p.read_text(), "")
        for p in job.pids.iterdir()
    )  # rank -> "stopped" or ""
    return done


@pytest.fixture(scope="module")
def never_stopped(tmp_path_factory):
    """start(script): the script's run never stopped, in this module's folder, started once and
    shared by every case of that script (the stop's signal and its sender change nothing in it);
    finish(script): that run, finished, and the folder of its checkpoint. Its ranks start as
    srun starts them: the parameters it ends with are the reference, and torchrun's agent, an
    interpreter of its own that passes no signal here, adds nothing to them."""
    tmp = tmp_path_factory.mktemp("never_stopped")
    jobs, done = {}, {}

    def start(script):
        if script not in jobs:
            jobs[script] = _torchrun(script, tmp / script[: -len(".py")], "straight", srun=True)

    def finish(script):
        if script not in done:
            done[script] = _finished(jobs[script])
        return done[script], tmp / script[: -len(".py")] / "logs" / "checkpoints"

    return SimpleNamespace(start=start, finish=finish)


def stopped_and_resumed(tmp, script, stop, never_stopped):
    """A run never stopped (never_stopped's), the same run stopped by `stop`
    (TRAINUP_TEST_STOP_AT), and its --resume."""
    never_stopped.start(script)
    stopped = _finished(_torchrun(script, tmp, "s", stop=stop))
    ckpts = tmp / "logs" / "checkpoints"
    suffix = SCRIPT_FLAGS[script][1]
    saved = ckpts / f"s{suffix or '.pt'}"
    if suffix == ".dcp":  # DCP's shards, and rank 0's file of where the run stopped
        at_stop = torch.load(saved / "trainup_position.pt", weights_only=True)
    else:  # rank 0's whole checkpoint, or its file beside the ranks' own
        at_stop = torch.load(saved / "run.pt" if suffix else saved, weights_only=True)["position"]
    files = sorted(p.name for p in saved.iterdir()) if saved.is_dir() else [saved.name]
    resumed = _finished(_torchrun(script, tmp, "s", "--resume"))
    straight, straight_ckpts = never_stopped.finish(script)
    return SimpleNamespace(
        straight=straight,
        straight_ckpts=straight_ckpts,
        stopped=stopped,
        resumed=resumed,
        at_stop=at_stop,
        files=files,
        ckpts=ckpts,
    )


# the blocks' job takes the course's default --stop-signal, USR1, to torchrun's group; the other
# scripts (the four dimensions' too: its 8 ranks stop together, each saving its own shards)
# SIGTERM; the pipeline's USR1 to rank 1 alone, which then posts the stop for both. The
# pipeline has that one case: SIGTERM to torchrun's group reaches every rank through the handler
# and the agreement on the step (preempt.Stopper) that the tp, tp_sp, cp and experts cases take,
# and a pipeline's stop then saves and resumes through the code of its USR1 case
# (pipeline.stage_saver, load_stages) whichever signal asked for it.
CASES = [
    (script, "USR1" if script == "_trainup_blocks.py" else "TERM", "launcher")
    for script in SCRIPT_FLAGS
    if script != "_trainup_pipeline.py"
] + [("_trainup_pipeline.py", "USR1", "self")]


@pytest.mark.parametrize(
    "script, sig, whom", CASES, ids=[f"{s[len('_trainup_') : -3]}-{g}-{w}" for s, g, w in CASES]
)
def test_a_block_stack_job_stopped_inside_an_epoch_resumes_to_a_run_never_stopped(
    tmp_path, script, sig, whom, never_stopped
):
    job = stopped_and_resumed(
        tmp_path, script, stop_at(1 if whom == "self" else 0, STOP_AT, sig, whom), never_stopped
    )
    s = job.stopped
    out = s.stdout + s.stderr
    assert job.straight.returncode == 0, job.straight.stderr[-3000:]
    assert job.resumed.returncode == 0, job.resumed.stderr[-3000:]
    # torchrun reports its workers' 75 as a failure of its own; it did not die of the signal
    assert s.returncode not in (0, -getattr(signal, f"SIG{sig}")), out[-3000:]
    # rank 0 says who asked: torchrun passed the group's signal on to it, or rank 1 posted the stop
    said = f"SIG{sig}" if whom == "launcher" else "a signal on another rank"
    assert f"{said}: stopped in epoch 1 after step" in s.stdout, out[-3000:]
    assert f'File "{SCRIPTS}' not in out, out[-3000:]  # no traceback from the course's code
    errors = [line for line in s.stderr.splitlines() if line.startswith("error:")]
    assert not any("torchrun" in e for e in errors), errors  # no rank blames its launcher
    if whom == "self":  # torchrun lists every worker's exit status
        codes = {0: preempt.STOPPED_EXIT, 1: preempt.STOPPED_EXIT}
        assert torchrun_exit_codes(s) == codes, out[-3000:]
    nproc = NPROC.get(script, 2)
    assert s.ranks == {"launcher": "", **{str(r): "stopped" for r in range(nproc)}}, s.ranks
    position = job.at_stop
    assert (position["epoch"], position["world_size"], len(position["ranks"])) == (1, nproc, nproc)
    assert STOP_AT <= position["step"] < 8  # inside the epoch of 8 steps
    if whom == "self":  # rank 1, signalled in step 3, posted "stop after step 4" for every rank
        assert position["step"] == STOP_AT + preempt.STOP_CHECK["cpu"][1]
    if SCRIPT_FLAGS[script][1] == ".ranks":  # each rank its own stages or experts
        assert {"rank0.pt", "rank1.pt", "run.pt"} <= set(job.files), job.files
    if script == "_trainup_4d.py":  # 8 parts, none held by two ranks: a file from each
        assert {f"__{r}_0.distcp" for r in range(nproc)} <= set(job.files), job.files
    summaries = [r["status"] for r in _records(tmp_path / "logs", "s", "summary")]
    assert summaries == ["stopped", "finished"]
    straight_logs = job.straight_ckpts.parent
    _per_step_records_go_on(tmp_path / "logs", straight_logs, position["step"])
    never = stopped_params(job.straight_ckpts / "straight.pt")
    assert_same_params(stopped_params(job.ckpts / "s.pt"), never)
    for done in (job.straight, job.stopped, job.resumed):
        assert not done.left, f"processes outlived their job: {done.left}"


def _records(log_dir, run, kind):
    """The run's records of this kind, without the run's name and the time of writing."""
    lines = (log_dir / f"{run}.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if r["type"] == kind]
    return [{k: v for k, v in r.items() if k not in ("run", "time")} for r in records]


def _per_step_records_go_on(log_dir, straight_logs, stopped_after):
    """The records a resumed run writes of the epoch it resumed inside: the pipeline's per-step
    records number on from the step after the stop, the experts' load record of that epoch
    counts every step of it, as the run never stopped counts them, and the four dimensions'
    count of a steady step is of a step after the stop."""
    steps = {(r["epoch"], r["rank"], r["step"]) for r in _records(log_dir, "s", "pipe_step")}
    if steps:
        straight = {
            (r["epoch"], r["rank"], r["step"])
            for r in _records(straight_logs, "straight", "pipe_step")
        }
        lost = {(e, rank, n) for e, rank, n in straight if e == 1 and n <= stopped_after}
        assert steps == straight - lost  # those before the stop were left unwritten by it
    load = _records(log_dir, "s", "expert_load")
    if load:
        assert load == _records(straight_logs, "straight", "expert_load")
    counted = _records(straight_logs, "straight", "4d_comm")
    if counted:  # the four dimensions' count of epoch 1's second step a run takes (its first
        # infers the stages' shapes), logged at that epoch's end: the stopped run left before
        # it, the resumed one counts the second step after the stop, and moves the same bytes
        (resumed,) = _records(log_dir, "s", "4d_comm")
        assert [r["step"] for r in counted] == [2] and resumed["step"] == stopped_after + 2
        assert resumed["ranks"] == counted[0]["ranks"]


# A stop asked for once an epoch's steps are over must stop right after that epoch's checkpoint
# (preempt.Stopper.after_epoch), not at the next epoch's first step. Every rank sends itself
# SIGTERM as its first evaluation starts (TRAINUP_TEST_SIGTERM_IN_EVAL); the pipeline, whose
# evaluation calls no eval(), has rank 1 take USR1 in epoch 1's last step: it posts "stop after
# the next step", which that epoch no longer has, so the stop too waits through the evaluation.
EPOCH_STEPS = 8  # STOP_TINY: 256 samples in batches of 32
IN_EVAL = {script: {"TRAINUP_TEST_SIGTERM_IN_EVAL": "1"} for script in SCRIPT_FLAGS}
IN_EVAL["_trainup_pipeline.py"] = stop_at(1, EPOCH_STEPS, "USR1", "self")


@pytest.mark.parametrize("script", list(IN_EVAL), ids=[s[len("_trainup_") : -3] for s in IN_EVAL])
def test_a_stop_asked_for_during_evaluation_stops_after_that_epochs_checkpoint(
    tmp_path, script, never_stopped
):
    job = stopped_and_resumed(tmp_path, script, IN_EVAL[script], never_stopped)
    s, nproc = job.stopped, NPROC.get(script, 2)
    out = s.stdout + s.stderr
    said = "a signal on another rank" if script == "_trainup_pipeline.py" else "SIGTERM"
    assert f"{said}: stopped after epoch 1;" in s.stdout, out[-3000:]
    assert torchrun_exit_codes(s) == dict.fromkeys(range(nproc), preempt.STOPPED_EXIT), out[-3000:]
    assert s.ranks == {"launcher": "", **{str(r): "stopped" for r in range(nproc)}}, s.ranks
    position = job.at_stop
    assert (position["epoch"], position["step"], len(position["ranks"])) == (2, 0, nproc)
    epochs = [r["epoch"] for r in _records(tmp_path / "logs", "s", "epoch")]
    assert epochs == [1, 2], epochs  # epoch 1 logged once, by the stopped run
    assert job.straight.returncode == 0, job.straight.stderr[-3000:]
    assert job.resumed.returncode == 0, job.resumed.stderr[-3000:]
    never = stopped_params(job.straight_ckpts / "straight.pt")
    assert_same_params(stopped_params(job.ckpts / "s.pt"), never)


# The manual halves (lesson 06, send/recv by hand): --steps steps, no epochs; rank 1 takes USR1
# (the default --stop-signal) after step 3 and posts the stop after step 4 for both halves
MANUAL = ["--quick", "--train-size", "256", "--batch-size", "32", "--blocks", "4", "--width"]
MANUAL += ["32", "--steps", "6", "--no-progress", "--precision", "64"]


def _manual(tmp, name, *extra, stop=None):
    log_dir = tmp / "logs"
    env = launch.environment(stop_site(tmp / "site", **(stop or {})))
    command = [*launch.TORCHRUN, *launch.torchrun_flags(nproc=2)]
    command += [SCRIPTS / "_trainup_pipeline_manual.py", *MANUAL, "--run-name", name]
    command += ["--log-dir", log_dir, "--checkpoint-dir", log_dir / "checkpoints", *extra]
    return start_job([str(a) for a in command], env)


def test_the_manual_halves_stopped_between_steps_resume_to_the_halves_never_stopped(tmp_path):
    straight = _manual(tmp_path, "straight")
    stopped = finish_job(_manual(tmp_path, "s", stop=stop_at(1, STOP_AT, "USR1", "self")))
    out = stopped.stdout + stopped.stderr
    assert "a signal on another rank: stopped in epoch 1 after step 4;" in stopped.stdout, out
    codes = torchrun_exit_codes(stopped)
    assert codes == {0: preempt.STOPPED_EXIT, 1: preempt.STOPPED_EXIT}, out[-3000:]
    ckpts = tmp_path / "logs" / "checkpoints"
    position = torch.load(ckpts / "s.ranks" / "run.pt", weights_only=True)["position"]
    assert (position["epoch"], position["step"]) == (1, STOP_AT + 1)
    resumed = finish_job(_manual(tmp_path, "s", "--resume"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "steps 5 to 6: loss" in resumed.stdout, resumed.stdout
    assert finish_job(straight).returncode == 0
    for rank in (0, 1):  # each its own half, bit for bit
        mine = torch.load(ckpts / "s.ranks" / f"rank{rank}.pt", weights_only=True)["model"]
        never = torch.load(ckpts / "straight.ranks" / f"rank{rank}.pt", weights_only=True)
        assert_same_params(mine, never["model"])
    logs = tmp_path / "logs"
    steps = sorted((r["rank"], r["step"]) for r in _records(logs, "s", "pipe_step"))
    assert steps == [(rank, n) for rank in (0, 1) for n in range(1, 7)]  # each step once
    losses = [r["loss"] for r in _records(logs, "s", "pipe_step") if r["rank"] == 1]
    never_losses = [r["loss"] for r in _records(logs, "straight", "pipe_step") if r["rank"] == 1]
    assert losses == never_losses
    assert [r["status"] for r in _records(logs, "s", "summary")] == ["stopped", "finished"]


# --- A checkpoint of another layout, or torn: one sentence (in this interpreter, a group of one)


def _trained():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adadelta(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, 1)


def _args(**flags):
    import argparse

    return argparse.Namespace(
        **{
            **dict(
                lesson="pipeline",
                model="cnn",
                dataset="digits",
                train_size=256,
                batch_size=32,
                precision="32",
                run_name="r",
            ),
            **flags,
        }
    )


def test_a_pipeline_checkpoint_of_another_layout_or_torn_is_one_sentence(one_rank_group, tmp_path):
    from trainup import UserError
    from trainup.parallel import pipeline

    saved = _args(stages=1, data_parallel=1, schedule="gpipe", split="manual")
    folder = tmp_path / "r.ranks"
    model, optimizer, scheduler = _trained()
    pipeline.save_stages(folder, [model], optimizer, scheduler, 1, saved)
    other = _args(**{**vars(saved), "stages": 2})
    with pytest.raises(
        UserError,
        match=r"laid out as --stages 1 --data-parallel 1 --schedule "
        r"none --split manual, and this one is --stages 2 ",
    ):
        pipeline.load_stages(folder, [model], optimizer, scheduler, other)
    assert pipeline.load_stages(folder, [model], optimizer, scheduler, saved) == (2, None)
    (folder / "rank0.pt").write_bytes(b"torn")
    with pytest.raises(UserError, match=r"rank0.pt cannot be read"):
        pipeline.load_stages(folder, [model], optimizer, scheduler, saved)


def test_a_tensor_parallel_checkpoint_of_another_mesh_is_one_sentence(one_rank_group, tmp_path):
    from trainup import UserError
    from trainup.parallel import tensor_parallel as tpar

    saved = _args(tp_layout="--dp 1 --tp 2")
    folder = tmp_path / "r.dcp"
    tpar.save(folder, *_trained(), 1, saved)
    with pytest.raises(
        UserError,
        match=r"laid out as --dp 1 --tp 2, and this one is --dp 2 --tp "
        r"1: a run resumes on the mesh it was saved from",
    ):
        tpar.load(folder, *_trained(), _args(tp_layout="--dp 2 --tp 1"))
    assert tpar.load(folder, *_trained(), saved) == (2, None)


def test_a_four_d_checkpoint_of_another_layout_is_one_sentence(one_rank_group, tmp_path):
    """The layout a 4-D job saved with (ParallelDims.layout, kept beside the shards) against the
    resuming job's: another one is refused before any shard is read. Built here for a job of 4
    processes: the refusal compares the layouts alone."""
    from trainup import UserError
    from trainup.parallel import four_d
    from trainup.parallel.parallel_dims import ParallelDims

    saved = _args(lesson="4d", checkpoint_dir=tmp_path)
    saved, folder = four_d.folder(saved, ParallelDims(dp=1, tp=1, pp=1, cp=1, world_size=1))
    four_d.save(folder, *_trained(), 1, saved)
    other = _args(lesson="4d", checkpoint_dir=tmp_path)
    other, theirs = four_d.folder(other, ParallelDims(dp=2, tp=1, pp=2, cp=1, world_size=4))
    assert theirs == folder
    with pytest.raises(
        UserError,
        match=r"laid out as --pp 1 --dp 1 --cp 1 --tp 1, and this one is --pp 2 --dp 2 --cp 1 "
        r"--tp 1: a run resumes on the mesh it was saved from",
    ):
        four_d.load(folder, *_trained(), other)
    assert four_d.load(folder, *_trained(), saved) == (2, None)


def test_a_full_disk_while_the_ranks_write_keeps_the_last_whole_checkpoint(
    one_rank_group, tmp_path, monkeypatch
):
    """A rank's write that falls short (a full disk): one sentence on every rank, the folder of the
    last whole save kept, no temporary folder left behind."""
    from trainup import UserError, checkpoint
    from trainup.parallel import pipeline

    saved = _args(stages=1, data_parallel=1, schedule="gpipe", split="manual")
    folder = tmp_path / "r.ranks"
    model, optimizer, scheduler = _trained()
    pipeline.save_stages(folder, [model], optimizer, scheduler, 1, saved)

    def full(obj, f, *a, **k):
        with open(f, "wb") as out:
            out.write(b"x" * 100)
        raise OSError(28, "No space left on device", str(f))

    monkeypatch.setattr(torch, "save", full)
    monkeypatch.setattr(checkpoint, "no_room", lambda folder: True)  # the disk, as it is then
    with pytest.raises(UserError, match=r"could not be written .*the disk is full: the last whole"):
        pipeline.save_stages(folder, [model], optimizer, scheduler, 2, saved)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "store") == ["r.ranks"]
    assert pipeline.load_stages(folder, [model], optimizer, scheduler, saved) == (2, None)
