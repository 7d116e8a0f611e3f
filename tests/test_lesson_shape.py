"""Every lesson opens and closes the same way, and stays short enough to follow.

Opening: right after the title ("# NN · ..."), a cell with what the learner will learn, the
lessons it builds on, the hardware it uses and how long it takes. Closing: "What to remember", then
a last cell linking the next lesson (the last lesson links the course's front page).
"""

import json
import math
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
        re.search(r"^- " + re.escape(label), opening, re.M) for label in LABELS
    ):
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
    following = NOTEBOOKS[index + 1].name if index + 1 < len(NOTEBOOKS) else "../README.md"
    assert not problems(path, following), "\n".join(problems(path, following))


def test_the_shape_check_finds_a_lesson_without_its_plan(tmp_path):
    cells = [
        {"cell_type": "markdown", "source": ["# 99 · A lesson"], "metadata": {}},
        {"cell_type": "markdown", "source": ["Some text."], "metadata": {}},
        {"cell_type": "markdown", "source": ["## What to remember\n", "- x"], "metadata": {}},
        {"cell_type": "markdown", "source": ["**Next:** [00](00_x.ipynb)"], "metadata": {}},
    ]
    path = tmp_path / "99_x.ipynb"
    path.write_text(json.dumps({"cells": cells}))
    said = problems(path, "00_x.ipynb")
    assert len(said) == 2 and "bullets" in said[0] and "quick" in said[1], said
    cells[1]["source"] = [f"- {label} x\n" for label in LABELS[:3]] + ["- **Time:** 2 min quick"]
    path.write_text(json.dumps({"cells": cells}))
    assert problems(path, "00_x.ipynb") == []
    assert "does not link 01_y.ipynb" in problems(path, "01_y.ipynb")[0]


# ---- Colab's runtime: a GPU for the lessons that use one ----------------------------------------

# Each lesson's "**Hardware:**" bullet, in its own words, and what they decide: Colab opens the
# lesson on a GPU runtime (metadata.accelerator "GPU", metadata.colab.gpuType "T4": one T4) when
# the lesson uses a GPU where there is one. A lesson that needs 2 GPUs or more gains nothing from
# one T4. A bullet rewritten without its words fails below: decide again, then change the metadata.
USES_ONE_GPU = {
    "00_environment": (True, "on a machine with NVIDIA GPUs it also lists them"),
    "01_cpu_baseline": (False, "no GPU is used"),
    "02_single_gpu": (True, "where an NVIDIA GPU is present the GPU cells run on it"),
    "02b_feeding_the_gpu": (True, "where an NVIDIA GPU is present the GPU cells run on it"),
    "03_data_parallel": (True, "the runs on 1 to N GPUs and the phase timings need NVIDIA GPUs"),
    "04_ddp": (False, "no GPU is used here"),
    "04a1_inside_ddp": (False, "no GPU is used."),
    "04a2_tuning_ddp": (True, "with NVIDIA GPUs the NCCL cells run too"),
    "04a3_nodes_and_faults": (True, "with NVIDIA GPUs the NCCL_DEBUG cell runs too"),
    "04b_slurm": (False, "The GPU templates are checked, not run."),
    "04c_elastic": (False, "No GPU is used."),
    "05_horovod": (False, "GPUs are described, not used."),
    "05b_inside_horovod": (False, "GPUs are described, not used."),
    "06_pipeline_parallel": (False, "no GPU is used"),
    "06b_pipeline_schedules": (False, "no GPU is used"),
    "06c_bubble_and_memory": (False, "one cell uses 2 or more GPUs where present"),
    "07_lightning": (False, "GPUs are described, not used."),
    "07b_lightning_launch_and_log": (False, "GPUs are described, not used."),
    "07c_lightning_options": (False, "GPUs are described, not used."),
    "08_monitoring_and_profiling": (False, "no GPU is used"),
    "08a_profiling_ddp": (False, "with 2 or more NVIDIA GPUs the DDP profile runs on them"),
    "08b_tensorboard": (True, "the Lightning run uses a GPU where there is one"),
    "09_sharding": (False, "described, not run: no GPU run of this lesson is stored"),
    "09a1_sharding_costs": (False, "reading lesson 09's runs uses no GPU"),
    "09a2_fsdp_at_scale": (False, "described, not run: no GPU run of this lesson is stored"),
    "09b_activations": (False, "a laptop CPU (one process, a small layer)"),
    "09c_tensor_parallel": (False, "no GPU run of this lesson is stored"),
    "09ca_tp_attention": (False, "no GPU is used"),
    "10_scaling_report": (False, "GPU runs appear where reference logs of GPUs are committed"),
    "10a_same_model": (False, "no GPU is used"),
    "11_predict_the_cluster": (False, "no GPU is used"),
    "11a1_published_runs": (False, "no GPU is used"),
    "11a2_planner": (False, "no GPU is used"),
    "09d_context_parallel": (False, "no GPU is used"),
    "09e_experts": (False, "no GPU is used"),
    "11b_simulated_world": (False, "no GPU is used"),
    "09f_compile": (False, "no GPU is used"),
    "09g_four_dimensions": (False, "no GPU is used"),
    "09h_float8": (False, "no GPU is used"),
}


def hardware_bullet(nb):
    """The opening's "**Hardware:**" bullet, its lines joined."""
    for c in nb["cells"]:
        found = re.search(
            r"^- \*\*Hardware:\*\*(.*?)(?=^- \*\*|\Z)", "".join(c["source"]), re.M | re.S
        )
        if c["cell_type"] == "markdown" and found:
            return " ".join(found.group(1).split())
    return ""


def gpu_problems(path, uses_gpu, words):
    """Where the notebook's Colab metadata, its Hardware bullet and the verdict disagree."""
    nb = json.loads(path.read_text())
    said = []
    if words not in hardware_bullet(nb):
        said.append(f"{path.name}: its Hardware bullet no longer says {words!r}: decide again")
    meta = nb.get("metadata", {})
    asks = (meta.get("accelerator"), meta.get("colab", {}).get("gpuType"))
    if uses_gpu and asks != ("GPU", "T4"):
        said.append(f"{path.name}: uses a GPU, but Colab's metadata asks for {asks}")
    if not uses_gpu and asks != (None, None):
        said.append(f"{path.name}: uses no GPU, but Colab's metadata asks for {asks}")
    return said


def test_every_lesson_is_decided_for_colab():
    assert sorted(USES_ONE_GPU) == [p.stem for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_colab_opens_on_a_gpu_the_lessons_that_use_one(path):
    uses_gpu, words = USES_ONE_GPU[path.stem]
    assert not gpu_problems(path, uses_gpu, words), "\n".join(gpu_problems(path, uses_gpu, words))


def test_the_gpu_check_finds_metadata_that_disagrees(tmp_path):
    opening = {
        "cell_type": "markdown",
        "metadata": {},
        "source": [
            "- **Hardware:** a laptop CPU; the GPU cells run\n",
            "  on a GPU.\n",
            "- **Time:** 1 min in quick mode",
        ],
    }
    path = tmp_path / "99_x.ipynb"
    path.write_text(json.dumps({"cells": [opening], "metadata": {}}))
    assert gpu_problems(path, False, "the GPU cells run on a GPU") == []
    assert "uses a GPU, but" in gpu_problems(path, True, "the GPU cells run on a GPU")[0]
    assert "no longer says" in gpu_problems(path, False, "no GPU is used")[0]
    path.write_text(
        json.dumps(
            {"cells": [opening], "metadata": {"accelerator": "GPU", "colab": {"gpuType": "T4"}}}
        )
    )
    assert gpu_problems(path, True, "the GPU cells run on a GPU") == []
    assert "uses no GPU, but" in gpu_problems(path, False, "the GPU cells run on a GPU")[0]


# ---- how long a lesson is ----------------------------------------------------------------------

WIDTH = 100  # characters of prose in one rendered line
SCREEN = 45  # rendered lines in one screen
IMAGE = 24  # lines a plot takes (a figure about 480 pixels high, at 20 pixels a line)
AUTO_SCROLL, SCROLL_BOX = 100, 20  # a cell's text output longer than this shows in a box of that
MOST_SCREENS = 10
# Lessons already longer than MOST_SCREENS, each held to its own length until it is split.
LONGER = {}


# a link whose text is a small badge image (Colab's "Open In Colab"), alone on its line
BADGE = re.compile(r"\[!\[[^\]]*\]\([^)\s]*badge[^)\s]*\.svg\)\]\([^)\s]+\)")


def markdown_lines(text):
    lines = 1  # the space between cells
    for line in text.splitlines():
        if BADGE.fullmatch(line.strip()):
            lines += 1  # a badge is one line of type tall, not a figure
        elif re.search(r"!\[[^\]]*\]\(|<img\b", line):
            lines += IMAGE
        elif line.startswith("#"):
            lines += 2  # a heading: larger type, space above
        else:
            lines += max(1, math.ceil(len(line) / WIDTH))  # prose wraps
    return lines


def output_lines(outputs):
    text = images = 0
    for out in outputs:
        data = out.get("data", {})
        if out["output_type"] == "stream":
            text += len("".join(out["text"]).splitlines())
        elif out["output_type"] == "error":
            text += sum(len(frame.splitlines()) for frame in out["traceback"])
        elif any(kind.startswith("image/") for kind in data):
            images += IMAGE
        elif "text/markdown" in data:  # a diff or code shown as a Markdown code block
            text += len("".join(data["text/markdown"]).splitlines())
        elif "text/plain" in data:  # a table: about a line a row, as its text shows it
            text += len("".join(data["text/plain"]).splitlines())
    return (SCROLL_BOX if text > AUTO_SCROLL else text) + images


def screens(path):
    """A notebook's rendered height in screens, estimated: rendered lines over SCREEN.

    The assumptions: GitHub shows a notebook about WIDTH characters of prose wide and SCREEN lines
    high on a laptop. Markdown wraps at WIDTH; a heading takes 2 lines; an image IMAGE lines. A
    code cell takes its lines (code does not wrap: it scrolls sideways) and one for the space
    around it. Its stored outputs add their text lines, and IMAGE lines for each plot; text of more
    than AUTO_SCROLL lines counts as a box of SCROLL_BOX lines, as the classic Jupyter Notebook
    scrolls such an output (its OutputArea.auto_scroll_threshold, 100 lines by default; JupyterLab
    and GitHub show it whole, so there a long output makes the lesson longer than counted here).
    """
    lines = 0
    for c in json.loads(path.read_text())["cells"]:
        source = "".join(c["source"])
        if c["cell_type"] == "markdown":
            lines += markdown_lines(source)
        elif c["cell_type"] == "code":
            lines += len(source.splitlines()) + 1 + output_lines(c.get("outputs", []))
    return lines / SCREEN


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_lesson_fits_in_ten_screens_or_does_not_grow(path):
    most = LONGER.get(path.stem, MOST_SCREENS)
    measured = screens(path)
    assert measured <= most, (
        f"{path.name}: {measured:.1f} screens, more than {most}: split it or shorten it"
    )
    if path.stem in LONGER:
        assert measured > MOST_SCREENS, (
            f"{path.name}: {measured:.1f} screens now: take it "
            f"out of LONGER, so that {MOST_SCREENS} holds it"
        )


def test_the_screen_count_adds_what_a_reader_scrolls_past(tmp_path):
    prose = {
        "cell_type": "markdown",
        "metadata": {},
        "source": ["# A heading\n", "x" * 250 + "\n", "\n", "![plot](p.png)"],
    }
    badge = {
        "cell_type": "markdown",
        "metadata": {},
        "source": [
            "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            "(https://colab.research.google.com/github/o/r/blob/main/notebooks/99_x.ipynb)"
        ],
    }
    code = {
        "cell_type": "code",
        "metadata": {},
        "source": ["a = 1\n", "print(a)"],
        "outputs": [
            {"output_type": "stream", "name": "stdout", "text": ["1\n"] * 150},
            {
                "output_type": "display_data",
                "data": {"image/png": "", "text/plain": ["<Figure>"]},
                "metadata": {},
            },
        ],
    }
    path = tmp_path / "99_x.ipynb"
    path.write_text(json.dumps({"cells": [badge, prose, code]}))
    expected = (1 + 1) + (1 + 2 + 3 + 1 + IMAGE) + (2 + 1 + SCROLL_BOX + IMAGE)
    assert screens(path) == expected / SCREEN
    cells = math.floor(MOST_SCREENS * SCREEN / (2 + 1 + SCROLL_BOX + IMAGE)) + 1
    path.write_text(json.dumps({"cells": [code] * cells}))
    assert screens(path) > MOST_SCREENS  # a notebook this long fails the test above
