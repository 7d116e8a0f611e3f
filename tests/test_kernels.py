"""The proofs hold on any processor: the DDP proof pair run under every kernel choice torch offers here.

CI has one processor, and a learner's laptop sums floats in another order (other SIMD widths, oneDNN
kernels, thread counts). torch lets one machine play several: ATEN_CPU_CAPABILITY picks ATen's vector
width, ONEDNN_MAX_CPU_ISA caps oneDNN's, torch.backends.mkldnn.enabled turns oneDNN off (set here from
outside the script, by a sitecustomize), --threads splits the sums. Under each choice one process and
2 DDP ranks (started as srun starts them: no launcher), both in float64, must agree within
checks.FLOAT64_ATOL; and so must every pair across choices, as two machines would. A float32
baseline under each choice shows that the choices really change the sums: without that, this test
would prove nothing.

Each choice's 4 processes (one process in float64 and in float32, the 2 ranks) are forks of one
interpreter started under that choice's environment (FORKS): each runs the script's own main().
"""

import itertools
import json
import sys

import pytest
import torch

from conftest import SCRIPTS, finish_job, srun_env, start_job
from lessons import checks, launch, report
from trainup import distributed

SCRIPT = str(SCRIPTS / "_trainup_ddp.py")
# Short runs: float64 noise does not grow with steps the way a defect does; 2 steps of 64 samples.
SHORT = [
    "--train-size",
    "128",
    "--test-size",
    "64",
    "--epochs",
    "1",
    "--batch-size",
    "64",
    "--dropout",
    "0",
    "--device",
    "cpu",
    "--no-progress",
]
_ONEDNN_OFF = """import os
if os.environ.get("TRAINUP_TEST_ONEDNN") == "0":
    import torch
    torch.backends.mkldnn.enabled = False
"""


def choices():
    """name -> (environment, flags): every kernel choice this processor offers."""
    out = {
        "as is": ({}, ["--threads", "1"]),
        "2 threads": ({"OMP_NUM_THREADS": "2"}, ["--threads", "2"]),
        "ATen default (no SIMD)": ({"ATEN_CPU_CAPABILITY": "default"}, []),
        "oneDNN at SSE4.1": ({"ONEDNN_MAX_CPU_ISA": "SSE41"}, []),
        "oneDNN off": ({"TRAINUP_TEST_ONEDNN": "0"}, []),
    }
    # ATen's vector widths narrower than this processor's own (its own is "as is" already)
    if torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        out["ATen avx2"] = ({"ATEN_CPU_CAPABILITY": "avx2"}, [])
    return out


# One interpreter a kernel choice, started under its environment (each choice is read when torch
# loads or first computes), imports the script, torch and torch._dynamo (which each run's optimizer
# imports), then forks the choice's runs, each calling main() with its flags and variables. 24
# fresh interpreters would repeat these imports in every one.
# No parallel region may have run before the forks (OpenMP's threads do not survive a fork): the
# interpreter checks that it has no thread but its own.
FORKS = r"""
import json, os, sys, traceback
scripts, name, out, runs = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
sys.path.insert(0, scripts)
script = __import__(name)
import torch._dynamo  # noqa: F401
assert os.listdir("/proc/self/task") == [str(os.getpid())], "threads before the forks"
pids = {}
for run, argv, env in runs:
    pid = os.fork()
    if pid == 0:
        log = os.open(os.path.join(out, f"{run}.out"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(log, 1), os.dup2(log, 2)
        os.environ.update(env)
        code = 0
        try:
            script.main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)  # the interpreter's own exit is test_exit.py's matter
    pids[pid] = run
for pid, run in pids.items():
    print(run, os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


def forked(runs, choice_env, out):
    """Start FORKS: runs, (name, flags, variables) each, forked from one interpreter under
    choice_env."""
    cmd = [
        sys.executable,
        "-c",
        FORKS,
        str(SCRIPTS),
        "_trainup_ddp",
        str(out),
        json.dumps([(name, [str(f) for f in flags], env) for name, flags, env in runs]),
    ]
    return start_job(cmd, choice_env)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("kernels")
    site = base / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_ONEDNN_OFF)
    log_dir = base / "logs"
    out = ["--log-dir", str(log_dir), "--checkpoint-dir", str(log_dir / "checkpoints")]
    jobs = []
    for i, (name, (env, flags)) in enumerate(choices().items()):
        # OpenMP reads OMP_NUM_THREADS as it loads, and a pool it started would not survive the
        # forks: the interpreter starts with 1 thread, and each run's --threads sets its own
        threads = {"OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1")}
        env = launch.environment({"PYTHONPATH": str(site), **env, "OMP_NUM_THREADS": "1"})
        run = [*SHORT, *flags, *out]
        port = distributed.free_port()
        # the ranks with srun's variables: no launcher, which no kernel choice reaches
        ranks = [
            (
                f"ddp64_{i}_rank{r}",
                [*run, *checks.PROOF, "--run-name", f"ddp64_{i}"],
                {**threads, **srun_env(r, 2, port)},
            )
            for r in (0, 1)
        ]
        jobs.append(
            (
                forked(
                    [
                        (f"one64_{i}", [*run, *checks.PROOF, "--run-name", f"one64_{i}"], threads),
                        *ranks,
                        (f"one32_{i}", [*run, "--run-name", f"one32_{i}"], threads),
                    ],
                    env,
                    base,
                ),
                name,
            )
        )
        if len(jobs) >= 2:  # two choices at a time: 2 cores
            [_ok(finish_job(p), n, base) for p, n in jobs]
            jobs = []
    [_ok(finish_job(p), n, base) for p, n in jobs]
    return log_dir / "checkpoints", list(choices())


def _ok(proc, name, base):
    assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    codes = dict(line.split() for line in proc.stdout.splitlines())
    assert len(codes) == 4, f"{name}: {proc.stdout}"
    for run, code in codes.items():
        output = (base / f"{run}.out").read_text()[-3000:]
        assert code == "0", f"{name}: {run} exit {code}\n{output}"


def test_under_every_kernel_choice_two_ranks_end_like_one_process_in_float64(runs):
    ckpt, names = runs
    for i, name in enumerate(names):
        # each run used the threads its choice gives it (a fork keeps the interpreter's)
        want = int(choices()[name][0].get("OMP_NUM_THREADS", 1))
        for run in (f"one64_{i}", f"ddp64_{i}", f"one32_{i}"):
            assert report.read_run(ckpt.parent / f"{run}.jsonl")["env"]["threads"] == want, run
        worst = checks.same_parameters(f"ddp64_{i}", f"one64_{i}", checkpoint_dir=ckpt)
        assert worst <= checks.FLOAT64_ATOL, name


def test_across_kernel_choices_the_float64_runs_agree_as_two_machines_would(runs):
    ckpt, names = runs
    every = [f"{kind}_{i}" for i in range(len(names)) for kind in ("one64", "ddp64")]
    for a, b in itertools.combinations(every, 2):
        checks.same_parameters(
            a, b, checkpoint_dir=ckpt
        )  # fails with the two names and the difference


def test_the_kernel_choices_really_change_the_float32_sums(runs):
    """The test above proves something only if the choices change the arithmetic: in float32 they do."""
    ckpt, names = runs
    moved = {
        name: checks.difference(f"one32_{i}", "one32_0", checkpoint_dir=ckpt)
        for i, name in enumerate(names)
    }
    changed = [name for name, gap in moved.items() if gap > 0]
    assert len(changed) >= 2, f"only {changed} changed the float32 result: {moved}"
    assert moved["oneDNN off"] > 0, moved  # oneDNN's convolutions against ATen's own
