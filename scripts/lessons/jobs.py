"""One runner for the jobs a notebook starts: subprocess.run's answer, and the job's progress live.

    proc = jobs.run(argv, env=env, timeout=900)   # a CompletedProcess: returncode, stdout, stderr

While the job runs, a notebook cell shows its latest line (the epoch just logged, the progress bar)
in one display updated in place, about once a second. When the job ends the display is emptied: an
empty display holds nothing nbval compares, so a job cell's stored output is the same for a fast
run and a slow one. Outside a notebook (a terminal, the tests) nothing is shown.
"""

import re
import subprocess
import threading
import time

from trainup import ROOT

EVERY_S = 1.0  # one update a second: a frontend keeps up, and nbval's log stays short
# a non-blank piece between \r and \n (tqdm uses \r)
_LINE = re.compile(r"[^\r\n]*[^\r\n\s][^\r\n]*")


class Live:
    """One line shown in place in a notebook cell while a job runs; nothing outside a kernel."""

    def __init__(self):
        self.handle, self.shown_at = _display(), 0.0

    def show(self, text):
        if self.handle is not None and time.monotonic() - self.shown_at >= EVERY_S:
            self.handle.update({"text/plain": text}, raw=True)
            self.shown_at = time.monotonic()

    def close(self):
        if self.handle is not None:
            # emptied: the stored cell does not depend on the timing
            self.handle.update({}, raw=True)


def _display():
    """A display to update in place, where this runs in a Jupyter kernel (not in a terminal's
    IPython)."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return None
    return display({}, raw=True, display_id=True)


def latest(text):
    """The last non-blank line or progress-bar frame of a job's output so far."""
    pieces = _LINE.findall(text[-4000:])
    return pieces[-1].strip() if pieces else ""


def start(argv, **popen):
    """Where every job a notebook starts begins: subprocess.Popen(argv, **popen), a fresh
    interpreter as a learner's shell starts it. One place, so that all jobs start the same way."""
    return subprocess.Popen(argv, **popen)


def run(argv, *, cwd=ROOT, env=None, timeout=900, stderr_to_stdout=False):
    """subprocess.run(argv, capture_output=True, text=True) that shows the job's progress as it
    goes; on a timeout the job is killed and subprocess.TimeoutExpired raised, as subprocess.run
    does."""
    proc = start(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if stderr_to_stdout else subprocess.PIPE,
    )
    streams = [proc.stdout] + ([] if stderr_to_stdout else [proc.stderr])
    chunks = [[] for _ in streams]
    readers = [
        threading.Thread(target=_drain, args=(s, c), daemon=True) for s, c in zip(streams, chunks)
    ]
    for r in readers:
        r.start()
    live, deadline = Live(), time.monotonic() + timeout
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                out, err = (_text(c) for c in chunks + [[]] * (2 - len(chunks)))
                raise subprocess.TimeoutExpired(argv, timeout, output=out, stderr=err)
            time.sleep(0.2)
            newest = max(chunks, key=lambda c: c[-1][0] if c else 0)
            line = latest(b"".join(c for _, c in newest[-8:]).decode("utf-8", errors="replace"))
            if line:
                live.show(line)
    finally:
        live.close()
    for r in readers:
        r.join()
    out, err = (_text(c) for c in chunks + [[]] * (2 - len(chunks)))
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _drain(stream, chunks):
    """Read a pipe as the bytes come (a progress bar's frames end in \\r, not \\n), each chunk with
    its time."""
    for chunk in iter(lambda: stream.read1(65536), b""):
        chunks.append((time.monotonic(), chunk))
    stream.close()


def _text(chunks):
    text = b"".join(c for _, c in chunks).decode("utf-8", errors="replace")
    return text.replace("\r\n", "\n").replace("\r", "\n")  # as subprocess.run(text=True) reads it
