"""A test that would make one of a notebook's runs again reads the notebook's instead, where the
session runs that notebook and every cell of it passed (conftest.notebook_passed): one job, run
once. Everywhere else (a test file alone, the breakages' copies, a cell that failed) the test makes
its own."""

from pathlib import Path
from types import SimpleNamespace

import conftest
import suite_plugin as suite
from conftest import notebook_cells, notebook_or_own, notebook_passed
from suite_plugin import SHARED_OUTCOMES

NOTEBOOK = "notebooks/04c_elastic.ipynb"
CELLS = [f"{NOTEBOOK}::Cell {i}" for i in range(3)]


def request_for(nodeids, workerinput=None):
    items = [SimpleNamespace(nodeid=n) for n in nodeids]
    config = SimpleNamespace() if workerinput is None else SimpleNamespace(workerinput=workerinput)
    return SimpleNamespace(session=SimpleNamespace(items=items), config=config)


def test_a_notebook_whose_cells_all_passed_is_read(monkeypatch):
    monkeypatch.setattr(suite, "OUTCOMES", {c: "passed" for c in CELLS})
    assert notebook_passed(request_for(CELLS + ["tests/test_elastic.py::test_x"]), NOTEBOOK)


def test_a_failed_cell_an_absent_notebook_or_a_broken_copy_make_the_test_run_its_own(monkeypatch):
    monkeypatch.setattr(suite, "OUTCOMES", {**{c: "passed" for c in CELLS}, CELLS[1]: "failed"})
    assert not notebook_passed(request_for(CELLS), NOTEBOOK)
    monkeypatch.setattr(suite, "OUTCOMES", {c: "passed" for c in CELLS})
    assert not notebook_passed(request_for(["tests/test_elastic.py::test_x"]), NOTEBOOK)
    assert not notebook_passed(request_for(CELLS[:1]), "notebooks/05_horovod.ipynb")
    monkeypatch.setenv("TRAINUP_SCRIPTS_DIR", "/elsewhere/scripts")  # test_breakages' copies
    assert not notebook_passed(request_for(CELLS), NOTEBOOK)


def test_a_test_knows_before_waiting_whether_a_notebooks_run_may_come(monkeypatch):
    """notebook_cells: where it finds none, the test's own run starts at once beside its others."""
    assert notebook_cells(request_for(CELLS + ["tests/test_x.py::t"]), NOTEBOOK) == set(CELLS)
    assert notebook_cells(request_for(["tests/test_x.py::t"]), NOTEBOOK) == set()
    monkeypatch.setenv("TRAINUP_SCRIPTS_DIR", "/elsewhere/scripts")  # test_breakages' copies
    assert notebook_cells(request_for(CELLS), NOTEBOOK) == set()


def test_a_test_reads_the_notebooks_run_or_makes_its_own(monkeypatch):
    made = []
    make = lambda: made.append(1) or "own"  # noqa: E731
    monkeypatch.setattr(suite, "OUTCOMES", {c: "passed" for c in CELLS})
    assert notebook_or_own(request_for(CELLS), NOTEBOOK, lambda: "read", make) == "read"
    try:  # a notebook that passed without leaving its run: said, not made again in silence
        notebook_or_own(request_for(CELLS), NOTEBOOK, lambda: None, make)
        raise RuntimeError("not refused")
    except AssertionError as e:
        assert "passed without leaving its run's record" in str(e)
    assert made == []
    assert notebook_or_own(request_for(["t"]), NOTEBOOK, lambda: "read", make) == "own"
    assert made == [1]


def test_without_xdist_a_notebook_not_yet_run_is_not_waited_for(monkeypatch):
    monkeypatch.setattr(suite, "OUTCOMES", {CELLS[0]: "passed"})
    assert not notebook_passed(request_for(CELLS), NOTEBOOK)


def test_under_xdist_the_other_workers_cells_are_waited_for(monkeypatch, tmp_path):
    monkeypatch.setattr(suite, "OUTCOMES", {})
    shared = tmp_path / "outcomes.tsv"
    shared.write_text(f"{CELLS[0]}\tpassed\n")
    polls = []

    def later(_seconds):  # the other worker reports its last cells while this one waits
        polls.append(1)
        shared.write_text("".join(f"{c}\tpassed\n" for c in CELLS))

    monkeypatch.setattr(suite.time, "sleep", later)
    assert notebook_passed(request_for(CELLS, {SHARED_OUTCOMES: str(shared)}), NOTEBOOK)
    assert polls == [1]


def test_files_that_read_a_notebook_run_after_the_other_files_and_before_the_breakages():
    def item(nodeid, module=None):
        return SimpleNamespace(nodeid=nodeid, module=module)

    reads = SimpleNamespace(READS_NOTEBOOK=NOTEBOOK)
    items = [
        item("tests/test_breakages.py::test_b"),
        item("tests/test_elastic.py::test_e", reads),
        item("tests/test_ddp.py::test_d"),
        item(CELLS[0]),
    ]
    suite.pytest_collection_modifyitems(None, items)
    assert [i.nodeid.split("::")[0] for i in items] == [
        NOTEBOOK,
        "tests/test_ddp.py",
        "tests/test_elastic.py",
        "tests/test_breakages.py",
    ]


def test_the_notebooks_are_three_units_and_lesson_10_waits_for_the_others(monkeypatch, tmp_path):
    """Under xdist the notebooks run as three units side by side; lesson 10 reads every earlier
    lesson's runs, so its cells wait for the other units' notebooks before it, and only for
    them."""
    first, second = "notebooks/04_ddp.ipynb::Cell 0", "notebooks/05_horovod.ipynb::Cell 0"
    ninth = "notebooks/09_sharding.ipynb::Cell 0"
    tenth = f"{suite.READS_EARLIER}::Cell 3"
    later = "notebooks/11_predict_the_cluster.ipynb::Cell 0"
    group = suite.serial_group
    assert group(first) == group("notebooks/00_environment.ipynb::Cell 0")
    assert group(second) == group("notebooks/08b_tensorboard.ipynb::Cell 0")
    assert len({group(first), group(second), group(tenth)}) == 3
    assert group(ninth) == group(tenth) == group(later)
    assert suite.serial_group("tests/test_ddp.py::test_d") == "tests/test_ddp.py"
    monkeypatch.setattr(suite, "OUTCOMES", {ninth: "passed"})  # this worker's own unit
    shared = tmp_path / "outcomes.tsv"
    shared.write_text("")
    polls = []

    def later_on(_seconds):  # the other workers' notebooks end while this one waits
        polls.append(1)
        shared.write_text(f"{first}\tfailed\n" + (f"{second}\tpassed\n" if len(polls) > 1 else ""))

    monkeypatch.setattr(suite.time, "sleep", later_on)

    def item(nodeid, workerinput):
        config = SimpleNamespace(workerinput=workerinput) if workerinput else SimpleNamespace()
        cells = (first, second, ninth, tenth, later)
        session = SimpleNamespace(config=config, items=[SimpleNamespace(nodeid=n) for n in cells])
        return SimpleNamespace(nodeid=nodeid, session=session)

    xdist = {SHARED_OUTCOMES: str(shared)}
    assert suite.wait_for_earlier_notebooks(item(ninth, xdist)) == set() and polls == []
    in_order = suite.wait_for_earlier_notebooks(item(tenth, {}))  # one process: in order
    assert in_order == set() and polls == []
    assert suite.wait_for_earlier_notebooks(item(tenth, xdist)) == set() and polls == [1, 1]
    shared.write_text(f"{first}\tpassed\n")
    monkeypatch.setattr(suite, "NOTEBOOK_WAIT_S", -1)  # a worker that died: not waited for ever
    assert suite.wait_for_earlier_notebooks(item(tenth, xdist)) == {second}


def test_the_baseline_is_keyed_by_the_code_it_runs(tmp_path):
    """A breakage's copy reuses the session's one-process baseline only where it leaves the code
    of that run alone: another lesson's script may change, the baseline's script and trainup not."""
    import shutil

    copy = tmp_path / "scripts"
    shutil.copytree(conftest.SCRIPTS, copy, ignore=shutil.ignore_patterns("__pycache__"))
    key = conftest.baseline_key(copy)
    assert key == conftest.baseline_key(conftest.SCRIPTS)
    (copy / "_trainup_ddp.py").write_text((copy / "_trainup_ddp.py").read_text() + "\n# broken\n")
    assert conftest.baseline_key(copy) == key
    for changed in ("_trainup_gpu.py", "trainup/data.py"):
        again = tmp_path / changed.replace("/", "_")
        shutil.copytree(copy, again)
        (again / changed).write_text((again / changed).read_text() + "\n# broken\n")
        assert conftest.baseline_key(again) != key, changed


def test_a_baseline_made_already_is_copied_and_not_run_again(tmp_path):
    made = tmp_path / "runs" / "key"
    (made / "checkpoints").mkdir(parents=True)
    (made / "one.jsonl").write_text("{}\n")
    (made / "checkpoints" / "one.pt").write_bytes(b"state")
    (made / "made").write_text("")
    run = conftest.Baseline(made, tmp_path / "logs")
    assert run.proc is None  # nothing started
    assert conftest.finish_job(run).returncode == 0
    assert (tmp_path / "logs" / "checkpoints" / "one.pt").read_bytes() == b"state"
    assert (tmp_path / "logs" / "one.jsonl").read_text() == "{}\n"
    (made / "made").unlink()  # unfinished (a run that died): made again, from nothing
    again = conftest.Baseline(made, tmp_path / "again")
    assert again.proc is not None and not (made / "one.jsonl").exists()
    again.proc.kill()
    again.finish()


def test_a_hung_job_is_killed_with_the_workers_of_its_own_sessions_and_fails(monkeypatch):
    """torchrun starts its workers in sessions of their own: a hung job's process group does not
    hold them, and a worker still holding the job's output would keep the test waiting for ever
    (seen in a fresh-clone run). The guard kills the whole tree and fails in its time."""
    import subprocess
    import sys
    import time

    monkeypatch.setattr(conftest, "HANG_GUARD_S", 1)
    # a "launcher" whose worker runs in a session of its own, holding the launcher's stdout
    worker = "import os, time; os.setsid(); print(os.getpid(), flush=True); time.sleep(600)"
    launcher = (
        f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {worker!r}]); "
        "time.sleep(600)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", launcher],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    started = time.monotonic()
    try:
        conftest.finish_job(proc)
        raise RuntimeError("not refused")
    except AssertionError as e:
        assert "it hung" in str(e)
        pid = int(str(e).split("it hung\n")[1].split()[0])  # the worker's pid, from its output
    assert time.monotonic() - started < 30
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid), f"the worker {pid} outlived its hung job"


def alive(pid):
    """Running: not gone, and not a zombie that init has yet to reap."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
