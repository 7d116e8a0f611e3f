"""Stored outputs hold no digit that depends on the processor, the load or the run.

nbval (lax mode, pytest.ini) compares every cell tagged nbval-check-output with its stored output
after the sanitizer's rewrites (tests/nbval_sanitize.cfg). A float difference printed in full (a gap of 1.9e-07 stored,
2.2e-07 on another processor) passes on the machine that stored it only. Such values are rounded to
what the lesson claims, or shown in an untagged cell that asserts. The tolerances a lesson states are
constants, and may be shown, as may a value rounded to its power of ten (a gap "about 1e-02").
"""

import ast
import json
import os
import re
import subprocess
import sys

import pytest
from nbval.plugin import get_sanitize_patterns

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import stored_notebook  # noqa: E402  (tools/ is no package)

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# a float in scientific notation, other than a power of ten (1e-09: a tolerance, or an order of magnitude)
COMPARED = "nbval-check-output"  # the tag of a cell whose output nbval compares (--nbval-lax)
IN_FULL = re.compile(r"(?<![\w.])(?!1e[-+]?\d+\b)\d+(\.\d+)?e[-+]?\d+\b")


def sanitizers():
    """The rewrites as nbval reads them (its own parser: a line "replace:" with nothing after
    the colon is no rewrite to it)."""
    text = (ROOT / "tests" / "nbval_sanitize.cfg").read_text()
    return [(re.compile(regex), replace) for regex, replace in get_sanitize_patterns(text)]


def compared_text(path):
    """(cell number, line) of every output line nbval compares, after the sanitizer."""
    rewrites = sanitizers()
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    for number, cell in enumerate(cells, 1):
        if COMPARED not in cell.get("metadata", {}).get("tags", []):
            continue
        for output in cell.get("outputs", []):
            text = "".join(output.get("text") or output.get("data", {}).get("text/plain", ""))
            for regex, replace in rewrites:
                text = regex.sub(replace, text)
            for line in text.splitlines():
                yield number, line


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_compared_output_holds_a_float_printed_in_full(path):
    found = [
        f"cell {n}: {line.strip()[:120]}"
        for n, line in compared_text(path)
        if not line.startswith("$ ") and IN_FULL.search(line)
    ]
    assert not found, "stored outputs that another machine would print otherwise:\n" + "\n".join(
        found
    )


def test_the_check_finds_a_float_printed_in_full(tmp_path):
    notebook = {
        "cells": [
            {
                "cell_type": "code",
                "source": ["print(gap)"],
                "metadata": {"tags": [COMPARED]},
                "outputs": [
                    {
                        "output_type": "stream",
                        "name": "stdout",
                        "text": ["largest gap 1.9e-07, within 1e-05\n"],
                    }
                ],
            }
        ]
    }
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps(notebook))
    with pytest.raises(AssertionError, match="1.9e-07"):
        test_no_compared_output_holds_a_float_printed_in_full(path)
    notebook["cells"][0]["metadata"]["tags"] = []
    path.write_text(json.dumps(notebook))
    test_no_compared_output_holds_a_float_printed_in_full(path)


ASSERTS = re.compile(r"\b(assert|check|expect)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_cell_whose_output_is_not_compared_asserts(path):
    """nbval compares only tagged cells: an untagged one can fail only through what it asserts."""
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    quiet = [
        i
        for i, c in enumerate(cells)
        if COMPARED not in c.get("metadata", {}).get("tags", [])
        and not ASSERTS.search("".join(c["source"]))
    ]
    assert not quiet, f"{path.name}: code cells {quiet} are neither compared nor assert anything"


def test_the_assert_check_finds_a_silent_cell(tmp_path):
    path = tmp_path / "x.ipynb"
    path.write_text(
        json.dumps(
            {
                "cells": [
                    {"cell_type": "code", "source": ["print(1)"], "metadata": {}, "outputs": []}
                ]
            }
        )
    )
    with pytest.raises(AssertionError, match="neither compared"):
        test_every_cell_whose_output_is_not_compared_asserts(path)


def test_outputs_are_stored_on_a_quiet_machine_only(tmp_path):
    """tools/store_outputs.sh refuses, in one sentence, while the load average exceeds the cores."""
    cores = len(os.sched_getaffinity(0))
    busy = tmp_path / "loadavg"
    busy.write_text(f"{cores + 1.5:.2f} 1.00 1.00 3/100 1234\n")
    notebook = tmp_path / "untouched.ipynb"
    notebook.write_text("{}")
    proc = subprocess.run(
        ["bash", "tools/store_outputs.sh", str(notebook)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TRAINUP_LOADAVG_FILE": str(busy), "TRAINUP_STORE_WAIT_S": "0"},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (
        proc.stderr.strip().startswith("error: the load average is")
        and len(proc.stderr.splitlines()) == 1
    )
    assert f"on {cores} cores" in proc.stderr
    assert notebook.read_text() == "{}", "nothing was executed"


DRAWS = re.compile(r"checks\.(figure|show)\(")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_cell_that_draws_a_figure_shows_it(path):
    """A figure is shown where it is drawn: a cell that draws one unconditionally stores an image; one that
    draws only when runs exist (GPU runs, reference logs) stores an image or the sentence saying why not."""
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        source = "".join(cell["source"])
        if cell["cell_type"] != "code" or not DRAWS.search(source):
            continue
        hidden = [
            line
            for line in source.splitlines()
            if DRAWS.search(line) and line.rstrip().endswith(";")
        ]
        assert not hidden, f"{path.name} cell {i} draws a figure and hides it: {hidden}"
        images = [o for o in cell["outputs"] if "image/png" in o.get("data", {})]
        always = any(
            DRAWS.match(line) or re.match(r"\w+ = checks\.", line) for line in source.splitlines()
        )
        said = "".join("".join(o.get("text", "")) for o in cell["outputs"]).strip()
        assert images or (not always and said), (
            f"{path.name} cell {i} draws a figure and stores no image"
        )


def test_notebook_06cs_stored_sweep_states_each_bubble_against_the_formula_as_its_steps_show():
    """The stored sweep: every row of the bubble table (measured, its steps' lowest and highest, the
    formula) has its sentence, and the sentence's side of the formula is the one every step lies on
    ("above/below it in every step"), or says the steps do not decide; no remainder is given as a
    cause ("because"); interleaved 1F1B at m = 1 is held to (p-1)/p = 50 %, not (p-1)/(v+p-1)."""
    cells = json.loads((ROOT / "notebooks" / "06c_bubble_and_memory.ipynb").read_text())["cells"]
    out = next(
        "".join("".join(o.get("text", "")) for o in c["outputs"])
        for c in cells
        if "schedules.bubble_table(" in "".join(c["source"])
    )
    number = r"\s+([\d.]+)"
    rows = {
        (m[1], int(m[2])): tuple(map(float, m.groups()[2:6]))
        for m in re.finditer(
            r"^\s*(gpipe|1f1b|interleaved1f1b)\s+(\d+)" + 4 * number + r"\s", out, flags=re.M
        )
    }
    assert ("interleaved1f1b", 8) in rows and ("gpipe", 16) in rows, rows
    one = rows[("interleaved1f1b", 1)]
    assert one[3] == pytest.approx(0.5, abs=1e-3), one  # (p-1)/p at m = 1
    assert "because" not in out
    for (schedule, m), (measured, lowest, highest, theory) in rows.items():
        line = next(s for s in out.splitlines() if s.startswith(f"{schedule}, m = {m}:"))
        assert lowest <= measured <= highest, line
        # the table prints 3 decimals: a side holds to within that rounding
        if "above it in every step" in line:
            assert lowest >= theory, line
        elif "below it in every step" in line:
            assert highest <= theory, line
        else:  # 3 steps a row (--sweep-steps 3): undecided means the formula lies in their range
            assert "the steps do not put it above or below" in line, line
            assert lowest - 5e-4 <= theory <= highest + 5e-4, line


# a path that names one machine's folders: the course's checkout or its environment
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:[\w.-]+/)*(?:\.venv|site-packages)/|/(?:home|Users)/\w")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_stored_output_names_a_folder_of_the_machine_that_stored_it(path):
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    texts = [
        "".join(o.get("text") or o.get("data", {}).get("text/plain", ""))
        for c in cells
        for o in c.get("outputs", [])
    ]
    found = [m.group(0) for t in texts for m in MACHINE_PATH.finditer(t)]
    found += [str(ROOT) for t in texts if str(ROOT) in t]
    assert not found, f"{path.name} stores this machine's paths: {sorted(set(found))[:5]}"


def test_the_path_check_finds_a_machines_folder(tmp_path):
    path = tmp_path / "x.ipynb"
    for leaked in (
        "/srv/course/.venv/lib/python3.11/site-packages/tqdm/auto.py:21: Warning",
        f"$ python scripts/_trainup_ray.py --log-dir {ROOT}/logs",
    ):
        path.write_text(
            json.dumps(
                {
                    "cells": [
                        {
                            "cell_type": "code",
                            "source": [],
                            "outputs": [
                                {"output_type": "stream", "name": "stderr", "text": [leaked]}
                            ],
                        }
                    ]
                }
            )
        )
        with pytest.raises(AssertionError, match="this machine's paths"):
            test_no_stored_output_names_a_folder_of_the_machine_that_stored_it(path)


def stored_html(path):
    cells = json.loads(path.read_text())["cells"]
    return "".join(
        "".join(o.get("data", {}).get("text/html", "")) for c in cells for o in c.get("outputs", [])
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_stored_output_is_a_dashboard_frame_that_shows_nothing(path):
    """`%tensorboard`'s frame points at a server on the reader's machine: stored, it is blank."""
    assert stored_notebook.FRAME not in stored_html(path), (
        f"{path.name} stores a TensorBoard frame: store it with tools/store_outputs.sh"
    )


def test_the_store_tool_puts_a_sentence_where_the_frame_was(tmp_path):
    frame = f'<iframe id="{stored_notebook.FRAME}1ef6" width="100%"></iframe><script>...</script>'
    kept = {"output_type": "stream", "name": "stdout", "text": ["a server serves logs\n"]}
    cell = {
        "cell_type": "code",
        "metadata": {},
        "source": ["%tensorboard --logdir logs/tensorboard"],
        "outputs": [
            {"output_type": "display_data", "metadata": {}, "data": {"text/html": [frame]}},
            kept,
        ],
    }
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps({"cells": [cell], "metadata": {}}))
    subprocess.run(
        [sys.executable, "tools/stored_notebook.py", str(path), "0.5", "0.7", "2"],
        cwd=ROOT,
        check=True,
        timeout=60,
    )
    stored = json.loads(path.read_text())
    assert stored_notebook.FRAME not in stored_html(path)
    assert stored["cells"][0]["outputs"] == [
        {
            "output_type": "display_data",
            "metadata": {},
            "data": {"text/plain": [stored_notebook.LIVE_ONLY]},
        },
        kept,
    ]
    assert stored["metadata"]["trainup"]["stored_under"].endswith("on 2 cores")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_stored_diff_is_the_scripts_diff_as_they_are(path):
    """A lesson's diff cell shows its script against its parent: stored, it must be today's diff,
    not the one of the scripts when the notebook last ran."""
    notebook = json.loads(path.read_text())
    stale = [
        script
        for _, output, script in stored_notebook.diff_cells(notebook)
        if output is None
        or "".join(output["data"]["text/markdown"]) != stored_notebook.shown_diff(script)
    ]
    assert not stale, (
        f"{path.name} shows an old diff of {stale}: python tools/stored_notebook.py --diffs {path}"
    )


def test_the_diff_check_finds_an_old_diff_and_the_tool_stores_todays(tmp_path):
    source = 'diff = launch.lesson_diff("_trainup_gpu.py")\nlaunch.show_code(diff)\n'
    old = {
        "output_type": "display_data",
        "metadata": {},
        "data": {"text/markdown": ["```diff\n-x\n```"]},
    }
    cell = {"cell_type": "code", "metadata": {}, "source": [source], "outputs": [old]}
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps({"cells": [cell], "metadata": {}}))
    with pytest.raises(AssertionError, match=r"an old diff of \['_trainup_gpu.py'\]"):
        test_every_stored_diff_is_the_scripts_diff_as_they_are(path)
    subprocess.run(
        [sys.executable, "tools/stored_notebook.py", "--diffs", str(path)],
        cwd=ROOT,
        check=True,
        timeout=60,
    )
    test_every_stored_diff_is_the_scripts_diff_as_they_are(path)
    assert "+import torch" not in json.loads(path.read_text())["cells"][0]["source"][0]


@pytest.mark.fast
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_stored_output_belongs_to_a_cell_that_ran(path):
    """nbval fails a cell that holds outputs but no execution count ("Unrun reference cell has
    outputs"): a cell stored by hand must carry the count a run would give it."""
    notebook = json.loads(path.read_text())
    unrun = [
        i
        for i, cell in enumerate(notebook["cells"])
        if cell["cell_type"] == "code" and cell["outputs"] and cell["execution_count"] is None
    ]
    assert not unrun, f"{path.name}: cells {unrun} hold outputs but never ran"


def bare_values(notebook):
    """(cell index, text) of each result that is only a Python literal (a name, a number): what a
    call's return value leaves under a cell when it ends the cell, not something the lesson shows."""
    for index, cell in enumerate(notebook["cells"]):
        for output in cell.get("outputs", []):
            if output["output_type"] != "execute_result" or set(output["data"]) != {"text/plain"}:
                continue
            text = "".join(output["data"]["text/plain"])
            try:
                ast.literal_eval(text)
            except (ValueError, SyntaxError):
                continue
            yield index, text


@pytest.mark.fast
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_stored_output_is_a_stray_return_value(path):
    stray = list(bare_values(json.loads(path.read_text())))
    assert not stray, f"{path.name}: cells end with a call whose value is shown: {stray}"


@pytest.mark.fast
def test_the_stray_value_check_finds_a_name_and_leaves_a_table():
    def result(text):
        return {"output_type": "execute_result", "data": {"text/plain": [text]}}

    notebook = {
        "cells": [
            {"cell_type": "code", "outputs": [result("'fourd_16'")]},
            {"cell_type": "code", "outputs": [result("   N  bytes\n0  2  401408")]},
        ]
    }
    assert list(bare_values(notebook)) == [(0, "'fourd_16'")]


LESSONS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))


def stored_label(notebook):
    """The opening's Stored outputs bullet, unwrapped, or None."""
    cells = notebook["cells"]
    title = next(i for i, c in enumerate(cells) if "".join(c["source"]).startswith("# "))
    opening = "".join(cells[title + 1]["source"])
    found = re.search(re.escape(stored_notebook.LABEL) + r"(.*?)(?=\n- |\Z)", opening, re.S)
    return " ".join(found.group(1).split()) if found else None


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_every_lesson_says_what_run_its_stored_outputs_come_from(path):
    """A learner reads the stored outputs before running anything: the opening says whether they
    come from full-length or quick runs, on what machine and day, as the metadata records."""
    notebook = json.loads(path.read_text())
    stored = notebook["metadata"].get("trainup", {})
    label = stored_label(notebook)
    assert label, f"{path.name}: no '{stored_notebook.LABEL.strip()}' bullet in its opening"
    assert stored.get("mode") in stored_notebook.MODES, f"{path.name}: no stored mode"
    said = f"from {stored_notebook.MODES[stored['mode']]} on {stored['machine']}, {stored['date']}"
    assert label.startswith(said), (label, said)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", stored["date"])


@pytest.mark.parametrize("quick", ["1", "0"])
def test_the_store_tool_labels_the_run_once(tmp_path, quick):
    plan = "- **You will learn:** a thing.\n- **Time:** about 1 min in quick mode."
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": ["# 99 · A lesson"]},
        {"cell_type": "markdown", "metadata": {}, "source": plan.splitlines(keepends=True)},
    ]
    path = tmp_path / "99_lesson.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}}))
    for _ in range(2):  # stored again: the bullet is replaced, not added
        subprocess.run(
            [sys.executable, "tools/stored_notebook.py", str(path), "0.5", "0.7", "2"],
            cwd=ROOT,
            check=True,
            timeout=60,
            env={**os.environ, "TRAINUP_QUICK": quick},
        )
    stored = json.loads(path.read_text())
    opening = "".join(stored["cells"][1]["source"])
    assert opening.startswith(plan + "\n" + stored_notebook.LABEL)
    assert opening.count(stored_notebook.LABEL) == 1
    mode = "quick" if quick == "1" else "full"
    assert stored["metadata"]["trainup"]["mode"] == mode
    assert stored_label(stored).startswith(f"from {stored_notebook.MODES[mode]} on 2 CPU cores")
    assert "load average 0.5 at the start, 0.7 at the end" in stored_label(stored)
    test_every_lesson_says_what_run_its_stored_outputs_come_from(path)


def test_nbval_reads_every_rewrite_of_the_sanitizer():
    """A section nbval's parser skips (an empty replace) would compare what it was meant to hide."""
    text = (ROOT / "tests" / "nbval_sanitize.cfg").read_text()
    assert len(sanitizers()) == len(re.findall(r"^\[[\w-]+\]$", text, re.M))


def test_a_cell_stored_from_a_full_run_reads_as_the_tests_quick_run():
    def rewritten(text):
        for regex, replace in sanitizers():
            text = regex.sub(replace, text)
        return text

    full = "$ python scripts/_trainup_cpu.py --run-name cpu_t1\ncpu_t1: finished, 5 epochs, the"
    quick = "$ python scripts/_trainup_cpu.py --run-name cpu_t1 --quick\ncpu_t1: finished, 2 epochs, the"
    assert rewritten(full) == rewritten(quick)
    assert rewritten(full) != rewritten(quick.replace("cpu_t1 --quick", "cpu_t2 --quick"))
