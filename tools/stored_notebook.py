"""What tools/store_outputs.sh does to a notebook once it has run: the outputs a reader of the
stored notebook (on GitHub, nbviewer, a course page) would see dead are replaced by a sentence,
and the notebook says, in a bullet of its opening a reader sees and in its metadata, what run its
outputs come from: full-length or quick mode, on which machine, on which day, under what load.

`%tensorboard` shows the dashboard in an iframe onto the server the cell started (tensorboard's
notebook.py): stored, the frame points at a port on the reader's own machine and shows nothing.

    python tools/stored_notebook.py NOTEBOOK LOAD_AT_START LOAD_AT_END CORES
    python tools/stored_notebook.py --diffs NOTEBOOK ...

A lesson's diff cell (`diff = launch.lesson_diff("<script>")`, then `launch.show_code(diff)`) shows
the scripts as they are: --diffs stores what that cell shows now (launch.code_block of the diff),
for a script edited after the notebook last ran; nothing else of the notebook changes.
"""

import datetime
import json
import os
import re
import subprocess
import sys
import textwrap

FRAME = "tensorboard-frame-"  # the id of the iframe tensorboard's notebook extension writes
LIVE_ONLY = (
    "[TensorBoard's live dashboard showed here while the notebook ran: a frame onto the "
    "server this cell started. A stored notebook cannot hold it; run the cell in Jupyter "
    "or Colab to see it.]"
)


def without_dead_frames(notebook):
    """The notebook with each stored TensorBoard frame replaced by LIVE_ONLY, and how many were."""
    replaced = 0
    for cell in notebook["cells"]:
        outputs = cell.get("outputs", [])
        for i, output in enumerate(outputs):
            if FRAME in "".join(output.get("data", {}).get("text/html", "")):
                outputs[i] = {
                    "output_type": "display_data",
                    "metadata": {},
                    "data": {"text/plain": [LIVE_ONLY]},
                }
                replaced += 1
    return notebook, replaced


DIFF_CELL = re.compile(r'diff = launch\.lesson_diff\("([^"]+)"\)')


def diff_cells(notebook):
    """(cell, its display output, the script) of each lesson diff cell that shows its diff."""
    for cell in notebook["cells"]:
        source = "".join(cell["source"])
        found = DIFF_CELL.search(source) if cell["cell_type"] == "code" else None
        if found and "launch.show_code(diff)" in source:
            shown = [o for o in cell.get("outputs", []) if "text/markdown" in o.get("data", {})]
            yield cell, (shown[0] if shown else None), found.group(1)


def shown_diff(script):
    """What the diff cell of `script` shows, as its stored output holds it."""
    from lessons import launch

    return launch.code_block(launch.lesson_diff(script))


def with_current_diffs(notebook):
    """The notebook with each diff cell's shown diff as the scripts give it now; how many changed."""
    changed = 0
    for _, output, script in diff_cells(notebook):
        text = shown_diff(script)
        if output is not None and "".join(output["data"]["text/markdown"]) != text:
            output["data"]["text/markdown"] = text.splitlines(keepends=True)
            changed += 1
    return notebook, changed


def write(path, notebook):
    with open(path, "w") as f:  # as nbformat writes it
        f.write(json.dumps(notebook, sort_keys=True, indent=1, ensure_ascii=False) + "\n")


def diffs(paths):
    for path in paths:
        with open(path) as f:
            notebook, changed = with_current_diffs(json.load(f))
        if changed:
            write(path, notebook)
        print(f"{path}: {changed} diff(s) stored again")


LABEL = "- **Stored outputs:** "  # the opening's bullet that says what run a reader sees
MODES = {"full": "full-length runs (TRAINUP_QUICK=0)", "quick": "quick runs (TRAINUP_QUICK=1)"}


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            found = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.M)
        return found.group(1).strip() if found else None
    except OSError:
        return None


def gpu_names():
    try:
        listed = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return (
        [line.strip() for line in listed.stdout.splitlines() if line.strip()]
        if (listed.returncode == 0)
        else []
    )


def machine(cores):
    """This machine in words: its cores, CPU model and GPUs."""
    gpus = gpu_names()
    on_gpus = f"{len(gpus)} GPU ({', '.join(sorted(set(gpus)))})" if gpus else "no GPU"
    model = cpu_model()
    return f"{cores} CPU cores{f' ({model})' if model else ''}, {on_gpus}"


def labelled(notebook, mode, where, day, start, end, cores):
    """The notebook with its metadata and its opening's Stored outputs bullet (the cell of the
    plan, after the title) saying what run its outputs come from."""
    load = (
        f"load average {start} at the start, {end} at the end"
        if start is not None
        else "load average not recorded"
    )
    notebook["metadata"]["trainup"] = {
        "mode": mode,
        "machine": where,
        "date": day,
        "stored_under": f"{load}, on {cores} cores",
    }
    cells = notebook["cells"]
    title = next(
        (
            i
            for i, c in enumerate(cells)
            if c["cell_type"] == "markdown" and re.match(r"# \w+ ·", "".join(c["source"]))
        ),
        None,
    )
    if title is None or title + 1 >= len(cells) or cells[title + 1]["cell_type"] != "markdown":
        return notebook  # not a lesson: no opening to label
    sentence = f"from {MODES[mode]} on {where}, {day}, {load}."
    text = "".join(cells[title + 1]["source"]).rstrip("\n")
    # the bullet stored before, with its wrapped lines, gives way to today's
    text = re.sub(r"\n" + re.escape(LABEL) + r".*?(?=\n- |\Z)", "", text, flags=re.S)
    bullet = textwrap.fill(LABEL + sentence, width=100, subsequent_indent="  ")
    cells[title + 1]["source"] = (text + "\n" + bullet).splitlines(keepends=True)
    return notebook


def main(path, start, end, cores):
    with open(path) as f:
        notebook = json.load(f)
    notebook, _ = without_dead_frames(notebook)
    mode = "quick" if os.environ.get("TRAINUP_QUICK", "0") == "1" else "full"
    day = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    write(path, labelled(notebook, mode, machine(cores), day, start, end, cores))


if __name__ == "__main__":
    if sys.argv[1] == "--diffs":
        diffs(sys.argv[2:])
    else:
        main(*sys.argv[1:])
