"""Give every notebook an "Open in Colab" badge first and ONE set-up cell, after the lesson's title and
objectives (before its first code cell), from tools/colab.py's REPO_URL. Colab shows the set-up cell
folded to its #@title line (cellView "form"): the learner sees the lesson first.

    python tools/colab_cell.py                      every notebooks/[0-9]*.ipynb
    python tools/colab_cell.py notebooks/07_x.ipynb  the ones named
    python tools/colab_cell.py --check              exit 1 if any notebook's cells differ from what this writes

Idempotent: the two cells are found by their ids and rewritten in place; nothing else in the notebook changes.
The set-up cell's stored output is what it prints outside Colab, so nbval passes without re-running the notebook.
"""

import sys
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import colab  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BADGE_ID, SETUP_ID = "colab-badge", "colab-setup"
OUTSIDE_COLAB = (
    "Not on Colab: nothing to set up (this notebook runs from the course's notebooks/ folder).\n"
)

SETUP = '''#@title Set-up for Colab: run this cell first (elsewhere it does nothing)
# On Colab it fetches the course, installs what Colab lacks (keeping its torch), moves into the
# course's notebooks/ folder and chooses quick mode. Safe to run twice; no restart needed.
import os, subprocess, sys
if "COLAB_RELEASE_TAG" in os.environ:
    COURSE = os.environ.get("TRAINUP_COLAB_HOME", "{home}")
    if not os.path.isdir(COURSE):
        subprocess.run(["git", "clone", "--quiet", "--depth", "1", "--branch", "{branch}", "{url}", COURSE], check=True)
    sys.path.insert(0, os.path.join(COURSE, "tools"))
    import colab
    print("\\n".join(colab.set_up(COURSE)))
else:
    print("{outside}")
assert os.path.isfile("../scripts/trainup/__init__.py"), "run this notebook from the course's notebooks/ folder"'''


def badge_source(notebook):
    slug = colab.REPO_URL.removeprefix("https://github.com/")
    path = notebook.resolve().relative_to(ROOT).as_posix()
    return (
        f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        f"(https://colab.research.google.com/github/{slug}/blob/{colab.BRANCH}/{path})"
    )


def setup_source():
    return SETUP.format(
        home=colab.HOME, branch=colab.BRANCH, url=colab.REPO_URL, outside=OUTSIDE_COLAB.strip()
    )


def wanted_cells(notebook):
    badge = nbformat.v4.new_markdown_cell(badge_source(notebook), id=BADGE_ID)
    setup = nbformat.v4.new_code_cell(
        setup_source(), id=SETUP_ID, execution_count=1
    )  # nbval: outputs need a count
    setup.outputs = [nbformat.v4.new_output("stream", name="stdout", text=OUTSIDE_COLAB)]
    # folded on Colab; its output is the same everywhere but Colab, so nbval compares it
    setup.metadata = {"cellView": "form", "tags": ["nbval-check-output"]}
    return [badge, setup]


def apply(nb, notebook):
    """The notebook with the badge first and the set-up cell before the first code cell (replacing
    earlier versions of them); nothing else changes."""
    rest = [c for c in nb.cells if c.get("id") not in (BADGE_ID, SETUP_ID)]
    badge, setup = wanted_cells(notebook)
    first_code = next((i for i, c in enumerate(rest) if c.cell_type == "code"), len(rest))
    nb.cells = [badge, *rest[:first_code], setup, *rest[first_code:]]
    return nb


def main(argv):
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return 0
    check = "--check" in argv
    paths = [Path(a) for a in argv if a != "--check"] or sorted(
        (ROOT / "notebooks").glob("[0-9]*.ipynb")
    )
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        print(f"colab_cell: no notebook at {', '.join(missing)}", file=sys.stderr)
        return 2
    stale = []
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        before = nbformat.writes(nb)
        after = nbformat.writes(apply(nb, path))
        if before != after:
            stale.append(path)
            if not check:
                path.write_text(after + "\n" if not after.endswith("\n") else after)
    for path in stale:
        print(("out of date: " if check else "updated: ") + str(path))
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
