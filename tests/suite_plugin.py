"""The suite's own pytest plugin, loaded by the root conftest.py whatever paths pytest is given
(the whole suite, tests/ alone, one notebook): the work units pytest-xdist hands out (a test file
whole, the notebooks in three ordered units), the order they are collected in, each test's outcome
shared between the workers. A conftest.py under tests/ is
not loaded when only notebooks are collected (`bash run_tests.sh notebooks/04_ddp.ipynb`): there
the cells of one notebook were spread over the workers, each in a kernel of its own.
"""

import time
from pathlib import Path

import pytest


def pytest_configure(config):
    global _CONFIG
    _CONFIG = config  # record_outcome reads where to share outcomes


# How each test of this session did on the unbroken course, by node id: tests/test_breakages.py
# reads it (its targets must pass without a breakage) instead of running them all again. Under
# pytest-xdist (run_tests.sh: 3 workers on 2 cores) each worker also appends its outcomes to one
# file that the controller names, so that the worker running the breakages sees how the other
# workers' targets did.
OUTCOMES = {}
_CONFIG = None
SHARED_OUTCOMES = "trainup_outcomes"  # the key of that file's path in each worker's workerinput


def plain_id(nodeid):
    """A node id without the "@group" that xdist's loadgroup appends."""
    return nodeid.split("@")[0]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist's controller, once per worker: the one file of outcomes they all append to."""
    config = node.config
    if not hasattr(config, "_trainup_outcomes"):
        folder = config._tmp_path_factory.mktemp("outcomes")
        config._trainup_outcomes = Path(folder) / "outcomes.tsv"
    node.workerinput[SHARED_OUTCOMES] = str(config._trainup_outcomes)
    node.workerinput[EARLY_BREAKAGES] = str(config._trainup_outcomes.parent / "breakages.json")


# The breakages' pytests, started by the controller once a worker has collected, beside the suite
# (tests/test_breakages.py: early_run); the module, handed out last, reads what they did. Run
# after every other test, alone, they ended the suite with a tail of minutes that left cores idle.
EARLY_BREAKAGES = "trainup_breakages"  # the key of that run's output file in each workerinput
BREAKAGE_TEST = "tests/test_breakages.py::test_the_breakage_makes_its_test_fail["


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """xdist's controller, as each worker has collected: the first time, the breakages selected."""
    config = node.config
    if getattr(config, "_trainup_breakages", None) is None:
        names = [
            plain_id(i)[len(BREAKAGE_TEST) : -1]
            for i in ids
            if plain_id(i).startswith(BREAKAGE_TEST)
        ]
        config._trainup_breakages = start_breakages(config, names) if names else False


def start_breakages(config, names):
    """The breakages' early run, in a session of its own; its pid beside the file it writes."""
    import os
    import subprocess
    import sys

    out = Path(config._trainup_outcomes.parent / "breakages.json")
    here = Path(__file__).resolve().parent
    # the run cache the workers share (conftest.run_cache): the session's base folder's runs/
    env = {
        **os.environ,
        "TRAINUP_RUN_CACHE": os.environ.get(
            "TRAINUP_RUN_CACHE", str(config._tmp_path_factory.getbasetemp() / "runs")
        ),
    }
    with open(f"{out}.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(here / "test_breakages.py"), str(out), *names],
            cwd=here.parent,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    Path(f"{out}.pid").write_text(str(proc.pid))
    return proc


def pytest_unconfigure(config):
    """The controller: an early run of the breakages still going (the suite was stopped) ends."""
    import os
    import signal

    proc = getattr(config, "_trainup_breakages", None)
    if proc and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def shared_outcomes(config):
    """The other workers' outcomes so far (node id -> outcome); {} outside xdist."""
    path = getattr(config, "workerinput", {}).get(SHARED_OUTCOMES)
    if not path or not Path(path).exists():
        return {}
    out = {}
    for line in Path(path).read_text().splitlines():
        nodeid, _, outcome = line.rpartition("\t")
        out[nodeid] = "failed" if "failed" in (outcome, out.get(nodeid)) else outcome
    return out


def pytest_runtest_logreport(report):
    record_outcome(report)


def pytest_runtest_setup(item):
    wait_for_earlier_notebooks(item)


def record_outcome(report):
    nodeid = plain_id(report.nodeid)
    if report.failed:
        OUTCOMES[nodeid] = "failed"
    elif report.skipped or (report.when == "call" and report.passed):
        OUTCOMES.setdefault(nodeid, "skipped" if report.skipped else "passed")
    else:
        return
    path = getattr(_CONFIG, "workerinput", {}).get(SHARED_OUTCOMES) if _CONFIG else None
    if path:
        with open(path, "a") as f:  # one short line per write: appends do not interleave
            f.write(f"{nodeid}\t{OUTCOMES[nodeid]}\n")


# Under pytest-xdist the notebooks are three work units, each in run_course.sh's order, that start
# side by side on three workers: the notebooks take far longer than any test file, and in fewer
# units one unit's worker would end the suite alone. A unit begins at each of UNIT_STARTS. Lesson
# 10 (READS_EARLIER) reports the runs of every lesson before it, so its cells wait until the other
# units' notebooks before it have run (wait_for_earlier_notebooks). Lesson 10a reads the same runs;
# it follows 10 in the same unit.
UNIT_STARTS = ("notebooks/05_horovod.ipynb", "notebooks/09_sharding.ipynb")
READS_EARLIER = "notebooks/10_scaling_report.ipynb"


def serial_group(nodeid):
    """The work unit a test runs in under pytest-xdist: its file (a module's fixtures run once), or
    one of the three runs of notebooks. The files that start a local SLURM are units like any other:
    each starts its own (tools/local_slurm.sh: free ports, job ids of its own)."""
    path = plain_id(nodeid).split("::")[0]
    if path.startswith("notebooks/"):
        later = sum(path >= start for start in UNIT_STARTS)
        return "notebooks" + (f", unit {later + 1}" if later else "")
    return path


def wait_for_earlier_notebooks(item, poll_s=2.0):
    """Before a cell of lesson 10 under xdist: wait until every cell of the notebooks before it
    that another unit runs has an outcome (passed or not: lesson 10 then names what is missing).
    Returns the cells that never reported (NOTEBOOK_WAIT_S: a worker died)."""
    nodeid = plain_id(item.nodeid)
    config = item.session.config
    xdist = SHARED_OUTCOMES in getattr(config, "workerinput", {})
    if not xdist or not nodeid.startswith(READS_EARLIER + "::"):
        return set()
    cells = {
        plain_id(i.nodeid)
        for i in item.session.items
        if plain_id(i.nodeid).startswith("notebooks/")
        and plain_id(i.nodeid) < READS_EARLIER
        and serial_group(i.nodeid) != serial_group(nodeid)
    }
    deadline = time.monotonic() + NOTEBOOK_WAIT_S
    while True:
        missing = cells - {**shared_outcomes(config), **OUTCOMES}.keys()
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(poll_s)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's controller hands out whole work units (serial_group), in the order collected: the
    breakages, collected last, are handed out after every test they break."""
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return serial_group(nodeid)

    return Units(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The notebooks first: under xdist they are the longest work unit, so they start at once while
    the other workers take the test files. The check of the checks last, after the tests it breaks
    have run on the unbroken course. Within each, the order is kept (a stable sort)."""

    def rank(item):
        path = plain_id(item.nodeid)
        if path.startswith("notebooks/"):
            return 0
        if path.startswith("tests/test_breakages.py"):
            return 3
        # a file that reads a notebook's runs (notebook_passed) after the other files: by then the
        # notebooks' worker has long made them, and no worker waits
        return 2 if getattr(getattr(item, "module", None), "READS_NOTEBOOK", None) else 1

    items.sort(key=rank)


NOTEBOOK_WAIT_S = 1800  # far beyond the notebooks' whole run: reaching it means a worker died
