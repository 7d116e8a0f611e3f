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
