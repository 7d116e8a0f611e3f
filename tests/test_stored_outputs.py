"""Stored outputs hold no digit that depends on the processor, the load or the run.

nbval compares every cell not marked NBVAL_IGNORE_OUTPUT with its stored output after the sanitizer's
rewrites (notebooks/nbval_sanitize.cfg). A float difference printed in full (a gap of 1.9e-07 stored,
2.2e-07 on another processor) passes on the machine that stored it only. Such values are rounded to
what the lesson claims, or shown in an ignored cell that asserts. The tolerances a lesson states are
constants, and may be shown, as may a value rounded to its power of ten (a gap "about 1e-02").
"""
import configparser
import json
import os
import re
import subprocess

import pytest

from conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# a float in scientific notation, other than a power of ten (1e-09: a tolerance, or an order of magnitude)
IN_FULL = re.compile(r"(?<![\w.])(?!1e[-+]?\d+\b)\d+(\.\d+)?e[-+]?\d+\b")


def sanitizers():
    config = configparser.ConfigParser()
    config.read(ROOT / "notebooks" / "nbval_sanitize.cfg")
    return [(re.compile(config[s]["regex"]), config[s]["replace"]) for s in config.sections()]


def compared_text(path):
    """(cell number, line) of every output line nbval compares, after the sanitizer."""
    rewrites = sanitizers()
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    for number, cell in enumerate(cells, 1):
        source = "".join(cell["source"])
        if "NBVAL_IGNORE_OUTPUT" in source or "NBVAL_SKIP" in source:
            continue
        for output in cell.get("outputs", []):
            text = "".join(output.get("text") or output.get("data", {}).get("text/plain", ""))
            for regex, replace in rewrites:
                text = regex.sub(replace, text)
            for line in text.splitlines():
                yield number, line


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_compared_output_holds_a_float_printed_in_full(path):
    found = [f"cell {n}: {line.strip()[:120]}" for n, line in compared_text(path)
             if not line.startswith("$ ") and IN_FULL.search(line)]
    assert not found, "stored outputs that another machine would print otherwise:\n" + "\n".join(found)


def test_the_check_finds_a_float_printed_in_full(tmp_path):
    notebook = {"cells": [{"cell_type": "code", "source": ["print(gap)"], "outputs": [
        {"output_type": "stream", "name": "stdout", "text": ["largest gap 1.9e-07, within 1e-05\n"]}]}]}
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps(notebook))
    with pytest.raises(AssertionError, match="1.9e-07"):
        test_no_compared_output_holds_a_float_printed_in_full(path)
    notebook["cells"][0]["source"] = ["# NBVAL_IGNORE_OUTPUT\n", "print(gap)"]
    path.write_text(json.dumps(notebook))
    test_no_compared_output_holds_a_float_printed_in_full(path)


def test_outputs_are_stored_on_a_quiet_machine_only(tmp_path):
    """tools/store_outputs.sh refuses, in one sentence, while the load average exceeds the cores."""
    cores = len(os.sched_getaffinity(0))
    busy = tmp_path / "loadavg"
    busy.write_text(f"{cores + 1.5:.2f} 1.00 1.00 3/100 1234\n")
    notebook = tmp_path / "untouched.ipynb"
    notebook.write_text("{}")
    proc = subprocess.run(["bash", "tools/store_outputs.sh", str(notebook)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ, "TRAINUP_LOADAVG_FILE": str(busy), "TRAINUP_STORE_WAIT_S": "0"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.strip().startswith("error: the load average is") and len(proc.stderr.splitlines()) == 1
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
        hidden = [line for line in source.splitlines() if DRAWS.search(line) and line.rstrip().endswith(";")]
        assert not hidden, f"{path.name} cell {i} draws a figure and hides it: {hidden}"
        images = [o for o in cell["outputs"] if "image/png" in o.get("data", {})]
        always = any(DRAWS.match(line) or re.match(r"\w+ = checks\.", line) for line in source.splitlines())
        said = "".join("".join(o.get("text", "")) for o in cell["outputs"]).strip()
        assert images or (not always and said), f"{path.name} cell {i} draws a figure and stores no image"


def test_notebook_06s_stored_sweep_shows_the_bubble_shrinking_or_says_why_not():
    """The stored sweep (a quiet machine's): GPipe's measured bubble at m = 8 below that at m = 1, and each
    row at m >= 4 within 10 % of (p-1)/(v*m+p-1) or followed by the reason computed from the same steps;
    interleaved 1F1B among them."""
    cells = json.loads((ROOT / "notebooks" / "06_pipeline_parallel.ipynb").read_text())["cells"]
    out = next("".join("".join(o.get("text", "")) for o in c["outputs"]) for c in cells
               if "schedules.bubble_table(" in "".join(c["source"]))
    rows = {(m[1], int(m[2])): float(m[3])
            for m in re.finditer(r"^\s*(gpipe|1f1b|interleaved1f1b)\s+(\d+)\s+([\d.]+)\s", out, flags=re.M)}
    assert rows[("gpipe", 8)] < rows[("gpipe", 1)], rows
    assert ("interleaved1f1b", 8) in rows, rows
    for (schedule, m), _ in rows.items():
        if m >= 4:
            line = next(s for s in out.splitlines() if s.startswith(f"{schedule}, {m} micro-batch(es)"))
            assert "(within 10%)" in line or "because" in line, line


# a path that names one machine's folders: the course's checkout or its environment
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:[\w.-]+/)*(?:\.venv|site-packages)/|/(?:home|Users)/\w")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_stored_output_names_a_folder_of_the_machine_that_stored_it(path):
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    texts = ["".join(o.get("text") or o.get("data", {}).get("text/plain", ""))
             for c in cells for o in c.get("outputs", [])]
    found = [m.group(0) for t in texts for m in MACHINE_PATH.finditer(t)]
    found += [str(ROOT) for t in texts if str(ROOT) in t]
    assert not found, f"{path.name} stores this machine's paths: {sorted(set(found))[:5]}"


def test_the_path_check_finds_a_machines_folder(tmp_path):
    path = tmp_path / "x.ipynb"
    for leaked in ("/srv/course/.venv/lib/python3.11/site-packages/tqdm/auto.py:21: Warning",
                   f"$ python scripts/_trainup_ray.py --log-dir {ROOT}/logs"):
        path.write_text(json.dumps({"cells": [{"cell_type": "code", "source": [], "outputs": [
            {"output_type": "stream", "name": "stderr", "text": [leaked]}]}]}))
        with pytest.raises(AssertionError, match="this machine's paths"):
            test_no_stored_output_names_a_folder_of_the_machine_that_stored_it(path)
