"""The house style, checked on every change: ruff clean, and long lines only ever fewer.

ruff's settings are in pyproject.toml. Lines over 100 columns are counted here rather than by ruff's
E501, because the course still holds many from before the limit: the count may fall, never rise.
"""

import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

PYTHON = ("scripts", "tests", "tools", "notebooks/solutions")
LONG_LINES_AT_MOST = 1597  # lower it as lines are wrapped; never raise it


def ruff():
    found = Path(sys.executable).with_name("ruff")
    return str(found) if found.exists() else shutil.which("ruff")


def test_ruff_finds_nothing():
    assert ruff(), "ruff is not installed: it is pinned in requirements.txt (tools/setup_env.sh)"
    proc = subprocess.run(
        [ruff(), "check", "--output-format", "concise", *PYTHON],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]


FORMATTED = ("tests", "tools", "conftest.py")  # ruff format's layout; scripts/ keeps its own (its
# diffs are the lessons': reformatted, every lesson's diff would change at once)


def test_the_tests_and_tools_are_as_ruff_formats_them():
    assert ruff(), "ruff is not installed: it is pinned in requirements.txt (tools/setup_env.sh)"
    proc = subprocess.run(
        [ruff(), "format", "--check", *FORMATTED],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]


def long_lines(paths):
    return [
        f"{p}:{n}"
        for p in paths
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if len(line) > 100
    ]


def test_lines_over_100_columns_never_grow():
    paths = [p for folder in PYTHON for p in sorted((ROOT / folder).rglob("*.py"))]
    found = long_lines(paths)
    assert len(found) <= LONG_LINES_AT_MOST, (
        f"{len(found)} lines over 100 columns, {len(found) - LONG_LINES_AT_MOST} more than before: "
        f"wrap the new ones ({found[-3:]} ...)"
    )


def test_the_long_line_count_finds_a_long_line(tmp_path):
    path = tmp_path / "x.py"
    path.write_text("x = 1\n" + "y = '" + "a" * 100 + "'\n")
    assert long_lines([path]) == [f"{path}:2"]
