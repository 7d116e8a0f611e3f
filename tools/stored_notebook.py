"""What tools/store_outputs.sh does to a notebook once it has run: the outputs a reader of the
stored notebook (on GitHub, nbviewer, a course page) would see dead are replaced by a sentence,
and the notebook says what load its stored timings were taken under.

`%tensorboard` shows the dashboard in an iframe onto the server the cell started (tensorboard's
notebook.py): stored, the frame points at a port on the reader's own machine and shows nothing.

    python tools/stored_notebook.py NOTEBOOK LOAD_AT_START LOAD_AT_END CORES
    python tools/stored_notebook.py --diffs NOTEBOOK ...

A lesson's diff cell (`diff = launch.lesson_diff("<script>")`, then `launch.show_code(diff)`) shows
the scripts as they are: --diffs stores what that cell shows now (launch.code_block of the diff),
for a script edited after the notebook last ran; nothing else of the notebook changes.
"""

import json
import re
import sys

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


def main(path, start, end, cores):
    with open(path) as f:
        notebook = json.load(f)
    notebook, _ = without_dead_frames(notebook)
    notebook["metadata"]["trainup"] = {
        "stored_under": f"load average {start} at the start, {end} at the end, on {cores} cores"
    }
    write(path, notebook)


if __name__ == "__main__":
    if sys.argv[1] == "--diffs":
        diffs(sys.argv[2:])
    else:
        main(*sys.argv[1:])
