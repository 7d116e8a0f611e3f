"""The course's own code meets no deprecated API: its scripts run with deprecation warnings raised
by their code (the script itself and every trainup module) turned into errors. In this interpreter
pytest.ini does the same for trainup, lessons and the scripts' main() called in-process."""

import os
import sys

from conftest import SCRIPTS, finish_job, start_job
from lessons import launch

TINY = ["--quick", "--epochs", "1", "--train-size", "128", "--test-size", "64", "--no-progress"]


def as_errors():
    """PYTHONWARNINGS naming each of the course's modules (its module field is matched
    literally)."""
    mods = (
        ["__main__"]
        + [
            ".".join(p.relative_to(SCRIPTS).with_suffix("").parts)
            for p in sorted((SCRIPTS / "trainup").rglob("*.py"))
            if p.stem != "__init__"
        ]
        + ["trainup"]
    )
    return ",".join(
        f"error::{kind}:{m}" for m in mods for kind in ("DeprecationWarning", "FutureWarning")
    )


def test_the_scripts_meet_no_deprecated_api(tmp_path):
    env = {**os.environ, "PYTHONWARNINGS": as_errors()}
    common = [*TINY, "--log-dir", str(tmp_path / "logs")]
    jobs = [
        start_job(
            [sys.executable, str(SCRIPTS / "_trainup_gpu.py"), *common, "--run-name", "gpu"],
            env=env,
        ),
        start_job(
            launch.TORCHRUN
            + launch.torchrun_flags(nproc=2)
            + [str(SCRIPTS / "_trainup_ddp.py"), *common, "--run-name", "ddp"],
            env=env,
        ),
    ]
    for job in jobs:
        done = finish_job(job)
        assert done.returncode == 0, done.stderr[-3000:]  # a deprecation met is an error: exit 1
        # nor one that torch raises for the course's calls (the end of a run scanned every object
        # with DeviceMesh's isinstance, which warned about torch.distributed.reduce_op)
        assert "Warning:" not in done.stderr, done.stderr[-3000:]


def test_a_deprecation_in_the_course_would_fail(tmp_path):
    """The filter itself: a script whose own line meets a deprecation exits non-zero under it."""
    import subprocess

    probe = "import warnings; warnings.warn('old', DeprecationWarning)"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": as_errors()},
    )
    assert done.returncode != 0 and "DeprecationWarning: old" in done.stderr
