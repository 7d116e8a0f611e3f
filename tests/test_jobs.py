"""lessons.jobs, the one runner of a notebook's jobs: subprocess.run's answer, and progress shown
live in a real Jupyter kernel while the job runs, emptied at its end so a job cell stores the same
for any speed."""

import subprocess
import sys
import time

import pytest

from conftest import SCRIPTS
from lessons import jobs

# A job that says where it is, waits, then says where it ended (its second line after the wait).
CHILD = (
    "import sys, time\n"
    "print('epoch 1: loss 2.3', flush=True)\n"
    "sys.stderr.write('epoch 2:  50%|#####     | 4/8\\r'); sys.stderr.flush()\n"
    "time.sleep(float(sys.argv[1]))\n"
    "open(sys.argv[2], 'w').write(repr(time.time()))\n"
    "print('finished')\n"
)


def test_the_answer_is_subprocess_runs(tmp_path):
    argv = [sys.executable, "-c", CHILD, "0", str(tmp_path / "end")]
    mine, theirs = jobs.run(argv), subprocess.run(argv, capture_output=True, text=True)
    assert (mine.returncode, mine.stdout, mine.stderr) == (
        theirs.returncode,
        theirs.stdout,
        theirs.stderr,
    )
    # \r read as \n
    assert mine.stdout == "epoch 1: loss 2.3\nfinished\n" and mine.stderr.endswith("4/8\n")
    failed = jobs.run([sys.executable, "-c", "import sys; sys.exit('error: no')"])
    assert failed.returncode == 1 and failed.stderr == "error: no\n"
    both = jobs.run(
        [sys.executable, "-c", "import sys; print('a', flush=True); sys.exit('b')"],
        stderr_to_stdout=True,
    )
    assert both.stdout == "a\nb\n" and both.stderr == ""


def test_a_job_past_its_time_is_killed_and_said_as_subprocess_says_it(tmp_path):
    tick = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as e:
        jobs.run(
            [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
            timeout=1,
        )
    assert time.monotonic() - tick < 30 and "started" in e.value.output


def test_the_latest_line_is_the_last_progress_frame_or_line():
    assert (
        jobs.latest("epoch 1: loss 2.3\nepoch 2:  10%|#\repoch 2:  50%|#####\r")
        == "epoch 2:  50%|#####"
    )
    assert jobs.latest("a\n\n  \n") == "a" and jobs.latest("") == ""


def _kernel():
    jupyter_client = pytest.importorskip("jupyter_client")
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name="python3")
    return km, kc


def test_progress_reaches_the_notebook_before_the_job_ends_and_is_emptied_after(tmp_path):
    """In a real kernel, as a notebook cell runs it: the job's first line is on the cell's display
    while the job still runs (before the job wrote its end time), and the display is empty once it
    ended."""
    km, kc = _kernel()
    try:
        end = tmp_path / "end"
        code = (
            f"import sys; sys.path.insert(0, {str(SCRIPTS)!r})\n"
            "from lessons import jobs\n"
            "jobs.EVERY_S = 0.2\n"
            f"p = jobs.run([sys.executable, '-c', {CHILD!r}, '3', {str(end)!r}])\n"
            "print(p.returncode, p.stdout.split()[-1])\n"
        )
        msg_id = kc.execute(code)
        seen = []  # (when it arrived, message type, what it shows)
        while True:
            msg = kc.get_iopub_msg(timeout=120)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status" and content["execution_state"] == "idle":
                break
            if kind in ("display_data", "update_display_data", "stream", "error"):
                seen.append((time.time(), kind, content.get("data", content.get("text", content))))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    ended = float(end.read_text())
    live = [(t, d) for t, kind, d in seen if kind == "update_display_data" and d]
    assert live and live[0][0] < ended, seen  # shown while the job ran
    assert any("epoch" in d["text/plain"] for _, d in live), live
    assert seen[0][1:] == ("display_data", {}), seen  # what nbval records: an empty display
    assert [s[1:] for s in seen if s[1] == "update_display_data"][-1] == (
        "update_display_data",
        {},
    )
    assert [s[2] for s in seen if s[1] == "stream"] == ["0 finished\n"]


def test_a_job_cell_stores_the_same_output_for_a_fast_and_a_slow_run(tmp_path):
    """Executed as the course stores notebooks (nbclient): the cell's outputs are equal whether the
    job took no time or seconds, and its display holds nothing nbval compares."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")

    def stored(seconds):
        nb = nbformat.v4.new_notebook(
            cells=[
                nbformat.v4.new_code_cell(
                    f"import sys; sys.path.insert(0, {str(SCRIPTS)!r})\n"
                    "from lessons import jobs\n"
                    "jobs.EVERY_S = 0.2\n"
                    f"p = jobs.run([sys.executable, '-c', {CHILD!r}, '{seconds}', {str(tmp_path / 'end')!r}])\n"
                    "print(p.stdout.split()[-1])"
                )
            ]
        )
        nb.metadata["kernelspec"] = {
            "name": "python3",
            "display_name": "Python 3",
            "language": "python",
        }
        nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
        return nb.cells[0].outputs

    fast, slow = stored(0), stored(2.5)
    assert fast == slow, (fast, slow)
    assert [(o["output_type"], o.get("data")) for o in slow] == [
        ("display_data", {}),
        ("stream", None),
    ]
