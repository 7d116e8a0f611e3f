"""tools/run_notebooks.py, what run_course.sh runs the course with: every notebook runs even when
one fails, the failing one is kept up to its failing cell, and a summary and a non-zero exit say
so."""

import subprocess
import sys

import nbformat

from conftest import ROOT


def notebook(path, *cells):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, path)
    return path


def test_a_failing_notebook_is_kept_at_its_failing_cell_and_the_others_still_run(tmp_path):
    bad = notebook(
        tmp_path / "01_bad.ipynb", "print('before')", "raise ValueError('boom')", "print('after')"
    )
    good = notebook(tmp_path / "02_good.ipynb", "import os; print(os.path.basename(os.getcwd()))")
    out = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "tools/run_notebooks.py", "--output-dir", str(out), str(bad), str(good)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        "01_bad.ipynb" in done.stdout
        and "FAILED" in done.stdout
        and "ValueError: boom" in done.stdout
    )
    assert "1 of 2 notebooks ran to the end" in done.stdout and "Traceback" not in done.stdout
    kept = nbformat.read(out / "01_bad.ipynb", as_version=4).cells
    assert kept[0].outputs[0]["text"] == "before\n"
    assert kept[1].outputs[-1]["output_type"] == "error" and kept[1].outputs[-1]["evalue"] == "boom"
    assert kept[2].outputs == [] and kept[2].execution_count is None  # never reached
    ran = nbformat.read(out / "02_good.ipynb", as_version=4).cells
    assert ran[0].outputs[0]["text"] == f"{tmp_path.name}\n"  # run from the notebook's own folder


def test_every_notebook_ran_is_exit_0_and_a_missing_one_is_one_sentence(tmp_path):
    good = notebook(tmp_path / "good.ipynb", "1 + 1")
    run = [sys.executable, "tools/run_notebooks.py", "--output-dir", str(tmp_path / "r")]
    done = subprocess.run(run + [str(good)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "1 of 1 notebooks ran to the end." in done.stdout
    done = subprocess.run(
        run + [str(tmp_path / "nope.ipynb")], cwd=ROOT, capture_output=True, text=True
    )
    assert (
        done.returncode == 2
        and "no such notebook" in done.stderr
        and "Traceback" not in done.stderr
    )


def test_run_course_runs_every_notebook_through_it():
    text = (ROOT / "run_course.sh").read_text()
    assert "tools/run_notebooks.py" in text and "nbconvert" not in text and "exit $status" in text
