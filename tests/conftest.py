"""Shared test plumbing: the course's module on sys.path, and running a script for real."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))


def run_script(script, *args, log_dir, timeout=300, env=None, check=True):
    """Run scripts/<script> in a fresh interpreter, as a learner would; logs and checkpoints go to log_dir."""
    cmd = [sys.executable, str(ROOT / "scripts" / script), *map(str, args),
           "--log-dir", str(log_dir), "--checkpoint-dir", str(Path(log_dir) / "checkpoints"), "--no-progress"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return proc


def assert_clean_error(proc, *words):
    """Exit status non-zero, one sentence on stderr naming the problem, no traceback."""
    assert proc.returncode != 0, proc.stdout
    err = proc.stderr.strip()
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, err


@pytest.fixture
def log_dir(tmp_path):
    return tmp_path / "logs"
