"""Every lesson opens and closes the same way, and stays short enough to follow.

Opening: right after the title ("# NN · ..."), a cell with what the learner will learn, the
lessons it builds on, the hardware it uses and how long it takes. Closing: "What to remember", then
a last cell linking the next lesson (the last lesson links the course's front page).
"""
import json
import re

import pytest
from conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
LABELS = ("**You will learn:**", "**Prerequisites:**", "**Hardware:**", "**Time:**")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def markdown(path):
    cells = json.loads(path.read_text())["cells"]
    return [(i, "".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "markdown"]


def problems(path, following):
    """What the notebook at path lacks, as sentences; following: the file its Next cell links."""
    cells = json.loads(path.read_text())["cells"]
    said = []
    title = next((i for i, text in markdown(path) if re.match(r"# \w+ ·", text)), None)
    if title is None:
        return [f"{path.name}: no title cell ('# NN · ...')"]
    opening = "".join(cells[title + 1]["source"]) if title + 1 < len(cells) else ""
    if cells[title + 1]["cell_type"] != "markdown" or not all(
            re.search(r"^- " + re.escape(label), opening, re.M) for label in LABELS):
        said.append(f"{path.name}: the cell after the title does not hold the bullets {LABELS}")
    if "quick" not in opening.split("**Time:**")[-1]:
        said.append(f"{path.name}: its time does not say how long quick mode takes")
    remember = [i for i, text in markdown(path) if text.startswith("## What to remember")]
    if not remember:
        said.append(f"{path.name}: no '## What to remember' cell")
    last = cells[-1]
    text = "".join(last["source"])
    if last["cell_type"] != "markdown" or not text.startswith("**Next:**"):
        said.append(f"{path.name}: its last cell is not the '**Next:**' link")
    elif following not in LINK.findall(text):
        said.append(f"{path.name}: its Next cell does not link {following}")
    return said


@pytest.mark.parametrize("index", range(len(NOTEBOOKS)), ids=[p.stem for p in NOTEBOOKS])
def test_every_lesson_opens_with_its_plan_and_ends_with_the_next(index):
    path = NOTEBOOKS[index]
    following = (NOTEBOOKS[index + 1].name if index + 1 < len(NOTEBOOKS) else "../README.md")
    assert not problems(path, following), "\n".join(problems(path, following))


def test_the_shape_check_finds_a_lesson_without_its_plan(tmp_path):
    cells = [{"cell_type": "markdown", "source": ["# 99 · A lesson"], "metadata": {}},
             {"cell_type": "markdown", "source": ["Some text."], "metadata": {}},
             {"cell_type": "markdown", "source": ["## What to remember\n", "- x"], "metadata": {}},
             {"cell_type": "markdown", "source": ["**Next:** [00](00_x.ipynb)"], "metadata": {}}]
    path = tmp_path / "99_x.ipynb"
    path.write_text(json.dumps({"cells": cells}))
    said = problems(path, "00_x.ipynb")
    assert len(said) == 2 and "bullets" in said[0] and "quick" in said[1], said
    cells[1]["source"] = [f"- {label} x\n" for label in LABELS[:3]] + ["- **Time:** 2 min quick"]
    path.write_text(json.dumps({"cells": cells}))
    assert problems(path, "00_x.ipynb") == []
    assert "does not link 01_y.ipynb" in problems(path, "01_y.ipynb")[0]
