"""_trainup_ddp.py run for real: 2 processes on gloo, started by torchrun or as srun starts them."""

import json
import os
import socket
import sys
from types import SimpleNamespace

import pytest
import torch

from conftest import (
    DAY,
    SCRIPTS,
    assert_clean_error,
    finish_job,
    in_process,
    rename_watch,
    run_script,
    srun_env,
    start_baseline,
    start_job,
)
from lessons import checks, launch, report
from trainup import distributed, models

SCRIPT = str(SCRIPTS / "_trainup_ddp.py")
# Dropout off: each rank draws its own masks, so only without it can 2 ranks match 1 process exactly.
# --device cpu: these tests are about gloo on the CPU, also on a machine with GPUs.
TINY = ["--quick", "--dropout", "0", "--no-progress", "--device", "cpu"]
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
RENAMES = {}  # the runs fixture's os.replace calls: (pid, source, destination)


def start(cmd, env=None):
    return start_job(cmd, launch.environment(env))


finish = finish_job


def torchrun(log_dir, name, *args, env=None, max_restarts=0):
    return start(
        launch.TORCHRUN
        + launch.torchrun_flags(nproc=2, max_restarts=max_restarts)
        + [
            SCRIPT,
            *TINY,
            *map(str, args),
            "--run-name",
            name,
            "--log-dir",
            str(log_dir),
            "--checkpoint-dir",
            str(log_dir / "checkpoints"),
        ],
        env,
    )


def params(log_dir, name):
    return torch.load(log_dir / "checkpoints" / f"{name}.pt", weights_only=True)["model"]


def records(log_dir, name, kind):
    return [r for r in report.read_run(log_dir / f"{name}.jsonl")["extra"] if r["type"] == kind]


def ok(proc):
    assert proc.returncode == 0, (
        f"exit {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )
    return proc


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One process with the whole batch (_trainup_gpu.py on the CPU), and 2 DDP ranks with half each.

    The DDP run also sees SLURM_PROCID=0, as every worker of the first node does under `srun torchrun` (one
    task per node: a node's workers share their task's SLURM_PROCID): torchrun's RANK must win.
    """
    log_dir = tmp_path_factory.mktemp("ddp") / "logs"
    watch, renames = rename_watch(
        log_dir.parent / "watch"
    )  # every os.replace of the job, with its pid
    slurm = dict(SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_LOCALID="0", SLURM_NNODES="1")
    ddp = torchrun(log_dir, "ddp2", "--batch-size", 64, *checks.PROOF, env={**slurm, **watch})
    one = start_baseline(tmp_path_factory, log_dir)  # made once a session (conftest.BASELINE)
    ok(finish(one)), ok(finish(ddp))
    RENAMES[log_dir] = renames()
    return log_dir


def test_two_ranks_with_half_the_batch_end_like_one_process_with_all_of_it(runs):
    one, two = params(runs, "one"), params(runs, "ddp2")
    init = models.build(
        SimpleNamespace(model="cnn", seed=1, dropout=0.0),
        SimpleNamespace(shape=(1, 28, 28), num_classes=10),
    ).state_dict()
    for k in one:
        torch.testing.assert_close(
            two[k], one[k], rtol=0, atol=checks.FLOAT64_ATOL, msg=k
        )  # float64
    assert (
        max((one[k] - init[k]).abs().max().item() for k in one) > 1e-2
    )  # they did train, far beyond atol
    # the logged metrics are the whole job's, summed over both ranks: the same as one process's
    run1, run2 = report.read_run(runs / "one.jsonl"), report.read_run(runs / "ddp2.jsonl")
    assert run2["problems"] == [] and run2["summary"]["status"] == "finished"
    for e1, e2 in zip(run1["epochs"], run2["epochs"], strict=True):
        assert e2["samples"] == e1["samples"] == 512
        assert e2["loss"] == pytest.approx(e1["loss"], abs=checks.FLOAT64_ATOL)


def test_torchrun_ranks_win_over_slurm_and_only_rank_0_writes(runs):
    ddp = records(runs, "ddp2", "ddp")[0]
    assert ddp["launcher"] == "torchrun" and ddp["world_size"] == 2 and ddp["per_rank_batch"] == 32
    assert [r["rank"] for r in ddp["ranks"]] == [0, 1] and [
        r["local_rank"] for r in ddp["ranks"]
    ] == [0, 1]
    assert report.read_run(runs / "ddp2.jsonl")["env"]["backend"] == "gloo"
    assert (runs / "ddp2.stdout").read_text().count("epoch 1:") == 1  # one writer, not one per rank


def test_only_rank_0_writes_the_checkpoint_and_always_through_a_rename(runs):
    """Each epoch's checkpoint is written whole to a temporary file by rank 0 alone, then renamed over the
    last one (atomic): rank 1 writing too, or a plain torch.save to the final name, would show here."""
    pids = {r["rank"]: r["pid"] for r in records(runs, "ddp2", "ddp")[0]["ranks"]}
    folder = runs / "checkpoints"
    into = [(pid, src, dst) for pid, src, dst in RENAMES[runs] if dst.parent == folder]
    assert [(pid, dst.name) for pid, _, dst in into] == [
        (pids[0], "ddp2.pt")
    ] * 2  # one per epoch, rank 0's
    assert all(src.parent == folder and src.name.endswith(".tmp") for _, src, _ in into)
    assert sorted(p.name for p in folder.iterdir()) == [
        "ddp2.pt",
        "one.pt",
    ]  # no temporary file left


def test_each_rank_draws_its_own_shard_and_a_new_order_each_epoch(runs):
    per_epoch = records(runs, "ddp2", "ranks")
    assert [r["epoch"] for r in per_epoch] == [1, 2]
    for r in per_epoch:
        assert r["samples"] == [256, 256]
        assert not set(r["first_indices"][0]) & set(r["first_indices"][1])
    assert per_epoch[0]["first_indices"] != per_epoch[1]["first_indices"]


def test_plain_python_is_a_job_of_one_and_without_set_epoch_every_epoch_repeats(log_dir):
    """Also --resume of the DDP script: one epoch, then the second from the checkpoint."""
    for epochs in ("--epochs", "1"), ("--epochs", "2", "--resume"):
        run_script(
            "_trainup_ddp.py",
            "--quick",
            "--device",
            "cpu",
            "--no-set-epoch",
            *epochs,
            "--run-name",
            "solo",
            log_dir=log_dir,
            env={"OMP_NUM_THREADS": "1"},
        )
    run = report.read_run(log_dir / "solo.jsonl")
    assert (
        run["problems"] == [] and run["env"]["world_size"] == 1 and run["env"]["backend"] == "gloo"
    )
    assert [r["launcher"] for r in records(log_dir, "solo", "ddp")] == ["python"] * 2
    raw = [json.loads(line) for line in (log_dir / "solo.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in raw if r["type"] == "epoch"] == [
        1,
        2,
    ]  # the second run only ran epoch 2
    assert run["epochs"][-1]["loss"] < run["epochs"][0]["loss"]
    first = [r["first_indices"] for r in records(log_dir, "solo", "ranks")]
    assert len(first) == 2 and first[0] == first[1]


def test_a_sweep_of_the_ddp_script(log_dir):
    proc = run_script(
        "_trainup_ddp.py",
        *TINY,
        "--sweep",
        "8,16,1024",
        "--sweep-steps",
        "2",
        "--run-name",
        "sw",
        log_dir=log_dir,
        env={"OMP_NUM_THREADS": "1"},
    )
    run = report.read_run(log_dir / "sw.jsonl")
    assert run["problems"] == [] and run["summary"]["status"] == "finished" and run["epochs"] == []
    sweeps = records(log_dir, "sw", "sweep")
    assert [s["batch_size"] for s in sweeps] == [8, 16] and all(
        s["samples_per_s"] > 0 for s in sweeps
    )
    assert "batch size 1024: skipped" in proc.stdout


@pytest.fixture(scope="module")
def faults(tmp_path_factory, inject):
    """The jobs with an injected fault, started together (each is mostly start-up and waiting): a rank that
    dies and is restarted, one that raises, one that hangs, and srun-style ranks (one raises)."""
    log_dir = tmp_path_factory.mktemp("faults") / "logs"
    port = distributed.free_port()
    srun = [
        start(
            [
                sys.executable,
                SCRIPT,
                *TINY,
                "--run-name",
                "srun",
                "--log-dir",
                str(log_dir),
                "--checkpoint-dir",
                str(log_dir / "checkpoints"),
            ],
            inject("1:3", srun_env(r, 2, port)),
        )
        for r in (0, 1)
    ]
    # rank 1 dies (os._exit) at step 12, in epoch 2 (8 steps an epoch); torchrun restarts both once
    restart = torchrun(
        log_dir / "restart",
        "ddp2",
        "--batch-size",
        64,
        *checks.PROOF,
        max_restarts=1,
        env=inject("1:12:exit"),
    )
    boom = torchrun(log_dir, "boom", env=inject("1:3"))
    stuck = torchrun(log_dir, "stuck", "--timeout", 5, env=inject("1:3:hang"))
    return SimpleNamespace(
        log_dir=log_dir,
        port=port,
        srun=[finish(p) for p in srun],
        restart=finish(restart),
        boom=finish(boom),
        stuck=finish(stuck),
    )


def test_a_restart_resumes_from_the_checkpoint_and_ends_like_an_uninterrupted_run(runs, faults):
    log_dir = faults.log_dir / "restart"
    proc = ok(faults.restart)
    assert "torchrun restart 1: resuming at epoch 2" in proc.stdout
    assert [r["restart_count"] for r in records(log_dir, "ddp2", "ddp")] == [0, 1]
    run = report.read_run(log_dir / "ddp2.jsonl")
    assert [e["epoch"] for e in run["epochs"]] == [1, 2] and run["summary"]["status"] == "finished"
    resumed, straight = params(log_dir, "ddp2"), params(runs, "ddp2")
    for k in straight:
        assert torch.equal(resumed[k], straight[k]), k


def test_a_rank_that_raises_ends_the_whole_job(faults):
    proc = faults.boom
    assert proc.returncode != 0 and "injected fault" in proc.stderr
    assert report.read_run(faults.log_dir / "boom.jsonl")["summary"] is None


def test_a_rank_that_hangs_fails_the_job_after_the_timeout(faults):
    proc = faults.stuck
    assert proc.returncode != 0 and "Timed out" in proc.stderr


def test_srun_style_ranks_form_a_job_and_fail_together(faults):
    """Two plain processes with SLURM's variables, as `srun -n 2 python ...` starts them: rank 1 raises,
    rank 0 (waiting in an all-reduce) must exit too, with no launcher to stop it."""
    done = faults.srun
    assert done[0].returncode != 0 and done[1].returncode != 0
    assert "injected fault" in done[1].stderr
    ddp = records(faults.log_dir, "srun", "ddp")[0]
    assert (
        ddp["launcher"] == "slurm" and ddp["world_size"] == 2 and ddp["master_port"] == faults.port
    )


def test_bad_input_is_one_sentence_and_a_nonzero_exit(monkeypatch, capsys, log_dir):
    """Each is refused before the process group is joined: checked in this interpreter (seconds, not an
    interpreter each)."""
    import _trainup_ddp

    for k in [
        k
        for k in os.environ
        if k.startswith(("SLURM_", "TORCHELASTIC_"))
        or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    ]:
        monkeypatch.delenv(k)
    busy = socket.socket()
    busy.bind(("", 0))
    busy.listen()
    cases = [
        (
            {"MASTER_PORT": str(busy.getsockname()[1])},
            [],
            ["port", str(busy.getsockname()[1]), "in use"],
        ),
        # RANK and WORLD_SIZE set by hand (the env:// convention): the split is checked before waiting
        (
            {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"},
            ["--batch-size", "63"],
            ["cannot be split"],
        ),
    ]
    if not torch.cuda.is_available():
        cases.append(({}, ["--backend", "nccl"], ["--backend nccl", "GPU"]))
    else:
        cases.append(({}, ["--backend", "nccl"], ["--backend nccl", "--device cpu"]))
    with busy:
        for env, flags, words in cases:
            with monkeypatch.context() as m:
                for k, v in env.items():
                    m.setenv(k, v)
                done = in_process(
                    _trainup_ddp.main,
                    ["--quick", "--device", "cpu", *flags, "--log-dir", log_dir],
                    capsys,
                )
            assert done.returncode == 2, flags
            assert_clean_error(done, *words)
    assert not torch.distributed.is_initialized() and not log_dir.exists()


def test_launchers_are_read_in_order_torchrun_then_slurm_then_none():
    slurm = dict(
        SLURM_PROCID="3",
        SLURM_NTASKS="4",
        SLURM_LOCALID="1",
        SLURM_NNODES="2",
        SLURM_NODEID="1",
        SLURM_JOB_ID="1234",
        MASTER_ADDR="n1",
    )
    c = distributed.from_env(slurm)
    assert (c.launcher, c.rank, c.world_size, c.local_rank, c.node_rank, c.nnodes) == (
        "slurm",
        3,
        4,
        1,
        1,
        2,
    )
    assert (c.master_addr, c.master_port) == ("n1", 21234)  # the same port in every task of the job
    torchrun_env = dict(
        RANK="3",
        WORLD_SIZE="4",
        LOCAL_RANK="1",
        LOCAL_WORLD_SIZE="2",
        GROUP_RANK="1",
        GROUP_WORLD_SIZE="2",
        MASTER_ADDR="n1",
        MASTER_PORT="29500",
        TORCHELASTIC_RUN_ID="j",
        TORCHELASTIC_RESTART_COUNT="2",
    )
    c = distributed.from_env({**slurm, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", **torchrun_env})
    assert (c.launcher, c.rank, c.local_rank, c.nnodes, c.restart_count) == ("torchrun", 3, 1, 2, 2)
    c = distributed.from_env({})
    assert (c.launcher, c.rank, c.world_size, c.master_port) == ("python", 0, 1, 0)
    assert distributed._slurm_first_host("gpu[03-05,07],cpu01") == "gpu03"


def test_python_run_directly_in_an_sbatch_script_says_so_instead_of_waiting(
    monkeypatch, capsys, log_dir
):
    """The batch script itself sees SLURM_PROCID=0 and SLURM_NTASKS=2 but no job step (srun sets SLURM_STEP_ID):
    as rank 0 of 2 it would wait for a rank 1 that never comes."""
    import _trainup_ddp

    for k in [
        k
        for k in os.environ
        if k.startswith(("SLURM_", "TORCHELASTIC_")) or k in ("RANK", "WORLD_SIZE")
    ]:
        monkeypatch.delenv(k)
    for k, v in dict(
        SLURM_PROCID="0", SLURM_NTASKS="2", SLURM_LOCALID="0", SLURM_NNODES="1", SLURM_JOB_ID="9"
    ).items():
        monkeypatch.setenv(k, v)
    proc = in_process(_trainup_ddp.main, [*TINY, "--log-dir", log_dir], capsys)
    assert proc.returncode == 2
    assert_clean_error(proc, "SLURM_NTASKS=2", "srun did not start this process", "srun python")
    assert not log_dir.exists()
    assert distributed.launched_by_srun({"SLURM_STEP_ID": "0"}) and distributed.launched_by_srun(
        {"SLURM_STEPID": "3"}
    )
    assert not distributed.launched_by_srun({}) and not distributed.launched_by_srun(
        {"SLURM_STEP_ID": "4294967294"}
    )


def test_free_ports_come_from_below_the_ephemeral_range_where_no_connection_takes_them():
    """A CI run failed on a port that bind(0) had given: gloo's connections of the tests beside it
    take their local ends from the same range, and one took it before rank 0 opened it."""
    low, high = distributed._ephemeral_range()
    ports = [distributed.free_port() for _ in range(20)]
    assert len(set(ports)) == 20, f"a port was handed out twice: {ports}"
    assert all(not low <= p <= high and distributed.port_is_free(p) for p in ports), (
        low,
        high,
        ports,
    )
    with socket.socket() as s:  # what bind(0) gives, and a connection's local end: in the range
        s.bind(("127.0.0.1", 0))
        assert low <= s.getsockname()[1] <= high


def test_setup_turns_the_stores_errors_into_one_sentence(monkeypatch, capsys, log_dir):
    """The two errors init_process_group can raise before any training: the others never came (timeout),
    and a MASTER_PORT taken between the check and the bind."""
    import _trainup_ddp

    for k in [k for k in os.environ if k.startswith(("SLURM_", "TORCHELASTIC_"))]:
        monkeypatch.delenv(k)
    port = distributed.free_port()
    (
        monkeypatch.setenv("RANK", "0"),
        monkeypatch.setenv("WORLD_SIZE", "2"),
        monkeypatch.setenv("MASTER_PORT", str(port)),
    )
    proc = in_process(_trainup_ddp.main, [*TINY, "--timeout", "2", "--log-dir", log_dir], capsys)
    assert proc.returncode == 2
    assert_clean_error(proc, "rank 0 waited 2 s for the other 1 process(es)", f"127.0.0.1:{port}")
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        monkeypatch.setenv("WORLD_SIZE", "1"), monkeypatch.setenv("MASTER_PORT", str(taken))
        monkeypatch.setattr(
            distributed, "port_is_free", lambda port, host="": True
        )  # as if taken just after
        proc = in_process(_trainup_ddp.main, [*TINY, "--log-dir", log_dir], capsys)
    assert proc.returncode == 2
    assert_clean_error(proc, f"port {taken} (MASTER_PORT) is already in use")
    assert not log_dir.exists()


@pytest.mark.skipif(
    GPUS < 2, reason="needs 2 NVIDIA GPUs: DDP over NCCL against one process on one GPU"
)
def test_on_two_gpus_nccl_ranks_end_like_one_gpu(log_dir):
    gpu_flags = [
        "--quick",
        "--dropout",
        "0",
        "--no-progress",
        "--device",
        "cuda",
        "--batch-size",
        "64",
        *checks.PROOF,
    ]  # float64: cuDNN's kernels and NCCL's sums in other orders stay ~1e-16
    ddp = start(
        launch.TORCHRUN
        + launch.torchrun_flags(nproc=2)
        + [
            SCRIPT,
            *gpu_flags,
            "--run-name",
            "nccl",
            "--log-dir",
            str(log_dir),
            "--checkpoint-dir",
            str(log_dir / "checkpoints"),
        ]
    )
    ok(finish(ddp))
    run_script("_trainup_gpu.py", *gpu_flags, "--run-name", "g1", log_dir=log_dir)
    run = report.read_run(log_dir / "nccl.jsonl")
    assert (
        run["problems"] == [] and run["env"]["backend"] == "nccl" and run["env"]["world_size"] == 2
    )
    one, two = params(log_dir, "g1"), params(log_dir, "nccl")
    for (
        k
    ) in one:  # cuDNN picks its kernels per shape: not bit-equal, float64 keeps it far below atol
        torch.testing.assert_close(two[k], one[k], rtol=0, atol=checks.FLOAT64_ATOL, msg=k)


def test_the_scaling_table_joins_this_machine_s_runs_and_the_references():
    """Notebook 04 joins its runs and the committed references (index 0, 1, 2 and 0 again): each
    machine's speedup is over its own one-process run (with the H100's reference the
    repeated index broke the table)."""
    import pandas as pd
    from lessons.bylesson import ddp

    def row(where, n, speed):
        return dict(
            measured_on=where, run=f"ddp_n{n}", world_size=n, batch_size=64, samples_per_s=speed
        )

    here = pd.DataFrame([row("here", 1, 100.0), row("here", 2, 180.0), row("here", 4, 300.0)])
    reference = pd.DataFrame([row(f"H100_{DAY}", 1, 50000.0)])
    table = ddp.scaling_table(pd.concat([here, reference]))
    got = {(r.measured_on, r.world_size): (r.speedup, r.efficiency) for r in table.itertuples()}
    assert got == {
        ("here", 1): (1.0, 1.0),
        ("here", 2): (1.8, 0.9),
        ("here", 4): (3.0, 0.75),
        (f"H100_{DAY}", 1): (1.0, 1.0),
    }
