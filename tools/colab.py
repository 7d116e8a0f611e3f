"""The course on Colab: where it lives, and the set-up that each notebook's first cell runs there.

tools/colab_cell.py writes that cell (and the "Open in Colab" badge) into every notebook. On Colab the cell
clones REPO_URL into HOME, then calls set_up(): install what Colab lacks (requirements-colab.txt)
while holding Colab's own torch, torchvision, numpy, pandas, scikit-learn and matplotlib where they
are, move into the notebooks folder, and put the clone's scripts/ on sys.path and PYTHONPATH (the
course is not pip-installed there).
Outside Colab the cell does nothing. Safe to run twice, and no runtime restart is needed (nothing Colab had
already imported is replaced).
"""

import hashlib
import importlib.metadata
import os
import subprocess
import sys

# The course's home on GitHub. To run a fork on Colab, change it here and run `python tools/colab_cell.py`,
# which rewrites every notebook's badge and set-up cell from it.
REPO_URL = "https://github.com/trainup-course/trainup"
BRANCH = "main"
HOME = "/content/trainup"  # where the cell clones the course on Colab (/content is Colab's working folder)
QUICK_NOTE = (
    "quick mode (TRAINUP_QUICK=1): every run shortened, so the lesson ends in minutes "
    "(its Time line gives both modes); for full runs, put `%env TRAINUP_QUICK=0` "
    "above this cell and run both"
)
KEPT = (
    "torch",
    "torchvision",
    "numpy",
    "pandas",
    "scikit-learn",
    "matplotlib",
)  # Colab's own, never replaced


def on_colab(env=None):
    """Colab sets COLAB_RELEASE_TAG in every runtime (and only there)."""
    return "COLAB_RELEASE_TAG" in (os.environ if env is None else env)


def constraints(version=importlib.metadata.version):
    """pip constraints that hold each package of KEPT at the version installed now."""
    lines = []
    for name in KEPT:
        try:
            lines.append(f"{name}=={version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return "\n".join(lines) + "\n"


def set_up(home=HOME, run=subprocess.run):
    """Install what Colab lacks (once per runtime), then move into home/notebooks. Returns what it did."""
    requirements = os.path.join(home, "requirements-colab.txt")
    with open(requirements, "rb") as f:
        want = hashlib.sha256(f.read()).hexdigest()
    marker = os.path.join(home, ".colab-installed")
    done = []
    if not os.path.exists(marker) or open(marker).read() != want:
        held = os.path.join(home, ".colab-constraints.txt")
        with open(held, "w") as f:
            f.write(constraints())
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--requirement",
                requirements,
                "--constraint",
                held,
            ],
            check=True,
        )
        with open(marker, "w") as f:
            f.write(want)
        done.append("installed requirements-colab.txt, keeping " + ", ".join(constraints().split()))
    os.chdir(os.path.join(home, "notebooks"))
    done.append("working folder: " + os.getcwd())
    # Colab's runtime has 2 CPUs: the lessons' shortened runs unless the learner asked for full ones
    if os.environ.setdefault("TRAINUP_QUICK", "1") == "1":
        done.append(QUICK_NOTE)
    else:
        done.append(
            "full mode (TRAINUP_QUICK is not 1): the lesson's full runs; its Time line "
            "says how long"
        )
    # What pip install -e . gives elsewhere: `import trainup, lessons` in this kernel, and in every
    # process it starts (the jobs' `python -m trainup.spot` finds trainup only through PYTHONPATH).
    scripts = os.path.join(home, "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if scripts not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([scripts, *paths])
    return done
