"""What tools/store_outputs.sh does to a notebook once it has run: the outputs a reader of the
stored notebook (on GitHub, nbviewer, a course page) would see dead are replaced by a sentence,
and the notebook says what load its stored timings were taken under.

`%tensorboard` shows the dashboard in an iframe onto the server the cell started (tensorboard's
notebook.py): stored, the frame points at a port on the reader's own machine and shows nothing.

    python tools/stored_notebook.py NOTEBOOK LOAD_AT_START LOAD_AT_END CORES
"""

import json
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


def main(path, start, end, cores):
    with open(path) as f:
        notebook = json.load(f)
    notebook, _ = without_dead_frames(notebook)
    notebook["metadata"]["trainup"] = {
        "stored_under": f"load average {start} at the start, {end} at the end, on {cores} cores"
    }
    with open(path, "w") as f:  # as nbformat writes it
        f.write(json.dumps(notebook, sort_keys=True, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
