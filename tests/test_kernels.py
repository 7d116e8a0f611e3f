"""The proofs hold on any processor: the DDP proof pair run under every kernel choice torch offers here.

CI has one processor, and a learner's laptop sums floats in another order (other SIMD widths, oneDNN
kernels, thread counts). torch lets one machine play several: ATEN_CPU_CAPABILITY picks ATen's vector
width, ONEDNN_MAX_CPU_ISA caps oneDNN's, torch.backends.mkldnn.enabled turns oneDNN off (set here from
outside the script, by a sitecustomize), --threads splits the sums. Under each choice one process and
2 DDP ranks (started as srun starts them: no launcher), both in float64, must agree within
checks.FLOAT64_ATOL; and so must every pair across choices, as two machines would. A float32
baseline under each choice shows that the choices really change the sums: without that, this test
would prove nothing.
"""
import itertools
import sys

import pytest
import torch

from conftest import SCRIPTS, Ranks, finish_job, start_job
from lessons import checks, launch

SCRIPT = str(SCRIPTS / "_trainup_ddp.py")
# Short runs: float64 noise does not grow with steps the way a defect does; 4 steps of 64 samples.
SHORT = ["--train-size", "256", "--test-size", "64", "--epochs", "1", "--batch-size", "64", "--dropout", "0",
         "--device", "cpu", "--no-progress"]
_ONEDNN_OFF = '''import os
if os.environ.get("TRAINUP_TEST_ONEDNN") == "0":
    import torch
    torch.backends.mkldnn.enabled = False
'''


def choices():
    """name -> (environment, flags): every kernel choice this processor offers."""
    out = {"as is": ({}, ["--threads", "1"]), "2 threads": ({"OMP_NUM_THREADS": "2"}, ["--threads", "2"]),
           "ATen default (no SIMD)": ({"ATEN_CPU_CAPABILITY": "default"}, []),
           "oneDNN at SSE4.1": ({"ONEDNN_MAX_CPU_ISA": "SSE41"}, []),
           "oneDNN off": ({"TRAINUP_TEST_ONEDNN": "0"}, [])}
    # ATen's vector widths narrower than this processor's own (its own is "as is" already)
    if torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        out["ATen avx2"] = ({"ATEN_CPU_CAPABILITY": "avx2"}, [])
    return out


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
        env = launch.environment({"PYTHONPATH": str(site), **env})
        one = [sys.executable, SCRIPT, *SHORT, *flags, *out]
        jobs += [(start_job(one + [*checks.PROOF, "--run-name", f"one64_{i}"], env), name),
                 # started as srun starts them: no launcher, which no kernel choice reaches
                 (Ranks([sys.executable, SCRIPT, *SHORT, *flags, *out, *checks.PROOF, "--run-name",
                         f"ddp64_{i}"], env), name),
                 (start_job(one + ["--run-name", f"one32_{i}"], env), name)]
        if len(jobs) >= 6:  # two choices at a time: 2 cores
            [_ok(finish_job(p), n) for p, n in jobs]
            jobs = []
    [_ok(finish_job(p), n) for p, n in jobs]
    return log_dir / "checkpoints", list(choices())


def _ok(proc, name):
    assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stderr[-3000:]}"


def test_under_every_kernel_choice_two_ranks_end_like_one_process_in_float64(runs):
    ckpt, names = runs
    for i, name in enumerate(names):
        worst = checks.same_parameters(f"ddp64_{i}", f"one64_{i}", checkpoint_dir=ckpt)
        assert worst <= checks.FLOAT64_ATOL, name


def test_across_kernel_choices_the_float64_runs_agree_as_two_machines_would(runs):
    ckpt, names = runs
    every = [f"{kind}_{i}" for i in range(len(names)) for kind in ("one64", "ddp64")]
    for a, b in itertools.combinations(every, 2):
        checks.same_parameters(a, b, checkpoint_dir=ckpt)  # fails with the two names and the difference


def test_the_kernel_choices_really_change_the_float32_sums(runs):
    """The test above proves something only if the choices change the arithmetic: in float32 they do."""
    ckpt, names = runs
    moved = {name: checks.difference(f"one32_{i}", "one32_0", checkpoint_dir=ckpt) for i, name in enumerate(names)}
    changed = [name for name, gap in moved.items() if gap > 0]
    assert len(changed) >= 2, f"only {changed} changed the float32 result: {moved}"
    assert moved["oneDNN off"] > 0, moved  # oneDNN's convolutions against ATen's own
