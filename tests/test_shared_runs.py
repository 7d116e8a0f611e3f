"""A test that would make one of a notebook's runs again reads the notebook's instead, where the
session runs that notebook and every cell of it passed (conftest.notebook_passed): one job, run
once. Everywhere else (a test file alone, the breakages' copies, a cell that failed) the test makes
its own."""
from types import SimpleNamespace

import conftest
from conftest import SHARED_OUTCOMES, notebook_passed

NOTEBOOK = "notebooks/04c_elastic.ipynb"
CELLS = [f"{NOTEBOOK}::Cell {i}" for i in range(3)]


def request_for(nodeids, workerinput=None):
    items = [SimpleNamespace(nodeid=n) for n in nodeids]
    config = SimpleNamespace() if workerinput is None else SimpleNamespace(workerinput=workerinput)
    return SimpleNamespace(session=SimpleNamespace(items=items), config=config)


def test_a_notebook_whose_cells_all_passed_is_read(monkeypatch):
    monkeypatch.setattr(conftest, "OUTCOMES", {c: "passed" for c in CELLS})
    assert notebook_passed(request_for(CELLS + ["tests/test_elastic.py::test_x"]), NOTEBOOK)


def test_a_failed_cell_an_absent_notebook_or_a_broken_copy_make_the_test_run_its_own(monkeypatch):
    monkeypatch.setattr(conftest, "OUTCOMES", {**{c: "passed" for c in CELLS}, CELLS[1]: "failed"})
    assert not notebook_passed(request_for(CELLS), NOTEBOOK)
    monkeypatch.setattr(conftest, "OUTCOMES", {c: "passed" for c in CELLS})
    assert not notebook_passed(request_for(["tests/test_elastic.py::test_x"]), NOTEBOOK)
    assert not notebook_passed(request_for(CELLS[:1]), "notebooks/05_horovod.ipynb")
    monkeypatch.setenv("TRAINUP_SCRIPTS_DIR", "/elsewhere/scripts")  # test_breakages' copies
    assert not notebook_passed(request_for(CELLS), NOTEBOOK)


def test_without_xdist_a_notebook_not_yet_run_is_not_waited_for(monkeypatch):
    monkeypatch.setattr(conftest, "OUTCOMES", {CELLS[0]: "passed"})
    assert not notebook_passed(request_for(CELLS), NOTEBOOK)


def test_under_xdist_the_other_workers_cells_are_waited_for(monkeypatch, tmp_path):
    monkeypatch.setattr(conftest, "OUTCOMES", {})
    shared = tmp_path / "outcomes.tsv"
    shared.write_text(f"{CELLS[0]}\tpassed\n")
    polls = []

    def later(_seconds):  # the other worker reports its last cells while this one waits
        polls.append(1)
        shared.write_text("".join(f"{c}\tpassed\n" for c in CELLS))
    monkeypatch.setattr(conftest.time, "sleep", later)
    assert notebook_passed(request_for(CELLS, {SHARED_OUTCOMES: str(shared)}), NOTEBOOK)
    assert polls == [1]


def test_files_that_read_a_notebook_run_after_the_other_files_and_before_the_breakages():
    def item(nodeid, module=None):
        return SimpleNamespace(nodeid=nodeid, module=module)
    reads = SimpleNamespace(READS_NOTEBOOK=NOTEBOOK)
    items = [item("tests/test_breakages.py::test_b"), item("tests/test_elastic.py::test_e", reads),
             item("tests/test_ddp.py::test_d"), item(CELLS[0])]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.nodeid.split("::")[0] for i in items] == [
        NOTEBOOK, "tests/test_ddp.py", "tests/test_elastic.py", "tests/test_breakages.py"]
