"""The README as a learner's front door (issue 60.1): short, the first command on the first screen,
every lesson linked with its Colab badge, no history, a license, and a JupyterLab command that works
as root. Each check is a small function, run on the real files and on one case it must reject."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import colab  # noqa: E402

pytestmark = pytest.mark.fast

README = (ROOT / "README.md").read_text()
DOCS = sorted((ROOT / "docs").glob("*.md"))
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
MAX_LINES = 150
FIRST_SCREEN = 40
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
# A commit hash: 7 to 40 hex digits with at least one digit and one letter (so "2.13.0" or a word
# such as "defaced" is not one); an ISO date.
HASH = re.compile(r"(?<![\w/.-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
QUICK_TIME = re.compile(r"about ([\d.]+) min(?:utes)? in quick mode")


def first_command_line(text):
    """The 1-based line of the first line inside a fenced code block that runs one of the two
    commands, or None."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced and re.search(r"\bbash run_(course|tests)\.sh\b", line):
            return number
    return None


def colab_url(notebook):
    return (
        f"https://colab.research.google.com/github/{colab.REPO_URL.split('github.com/')[1]}"
        f"/blob/{colab.BRANCH}/notebooks/{notebook}"
    )


def table_rows(text, heading="## Lessons"):
    """The rows of the first table under `heading`, each a list of its cells."""
    section = text.split(heading + "\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def lesson_problems(text, notebooks):
    """What is wrong with the lessons table: a notebook without a row linking it, or without its badge."""
    rows = table_rows(text)
    problems = []
    for name in notebooks:
        row = next((r for r in rows if f"](notebooks/{name})" in " | ".join(r)), None)
        if row is None:
            problems.append(f"{name}: no row of the lessons table links notebooks/{name}")
        elif f"[![Open In Colab]({BADGE_IMAGE})]({colab_url(name)})" not in " | ".join(row):
            problems.append(f"{name}: its row has no Colab badge opening {colab_url(name)}")
    return problems


def history(text):
    """Commit hashes and ISO dates in a text (history belongs in no learner's page)."""
    return HASH.findall(text) + DATE.findall(text)


def dead_links(path):
    """Relative links of a markdown file whose target does not exist."""
    text = path.read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [
        t.split("#", 1)[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")
    ]
    return [t for t in local if t and not (path.parent / t).exists()]


# ---- length and the first screen ------------------------------------------------------------------------


def test_the_readme_is_short():
    assert len(README.splitlines()) < MAX_LINES
    assert not len(("line\n" * MAX_LINES).splitlines()) < MAX_LINES


def test_the_first_command_is_on_the_first_screen():
    line = first_command_line(README)
    assert line is not None and line <= FIRST_SCREEN, f"the first command is on line {line}"
    late = "# t\n" + "words\n" * 50 + "```bash\nbash run_course.sh\n```\n"
    assert first_command_line(late) == 53
    assert first_command_line("run `bash run_tests.sh` in prose\n") is None  # outside a code block


def test_the_readme_gives_both_commands_the_fast_tier_and_jupyterlab():
    for text in (
        "bash run_course.sh",
        "bash run_tests.sh",
        "bash run_tests.sh -m fast",
        "tests/README.md",
        "bash tools/lab.sh",
    ):
        assert text in README, text


# ---- the lessons table ----------------------------------------------------------------------------------


def test_every_notebook_is_linked_with_its_colab_badge():
    names = [p.name for p in NOTEBOOKS]
    assert len(names) >= 10
    assert lesson_problems(README, names) == []
    # one that is missing, and one whose badge opens another notebook, are both caught
    assert lesson_problems(README, names + ["99_new.ipynb"]) == [
        "99_new.ipynb: no row of the lessons table links notebooks/99_new.ipynb"
    ]
    swapped = README.replace(colab_url(names[0]), colab_url(names[1]))
    assert len(lesson_problems(swapped, names)) == 1


def test_the_tables_time_is_the_notebooks_own():
    """A lesson's quick-mode time in the table is what its notebook's opening says ('—' where neither
    states one)."""
    rows = {re.search(r"\]\(notebooks/([^)]+)\)", r[1])[1]: r for r in table_rows(README)}
    for path in NOTEBOOKS:
        cell = rows[path.name][-1]
        stated = QUICK_TIME.search(path.read_text())
        if stated:
            assert cell == f"about {stated[1]} min", (
                f"{path.name}: the table says {cell!r}, the notebook 'about {stated[1]} min in quick mode'"
            )
        else:
            assert cell == "—" or re.fullmatch(r"about [\d.]+ min", cell), (path.name, cell)


def test_every_relative_link_of_the_readme_and_the_docs_exists():
    for path in [ROOT / "README.md", *DOCS]:
        assert dead_links(path) == [], path.name
    assert dead_links(ROOT / "LICENSE") == []  # no links there: the function reads any text file


# ---- no history -----------------------------------------------------------------------------------------


def test_no_commit_hash_and_no_date_in_the_readme_or_the_docs():
    for path in [ROOT / "README.md", *DOCS]:
        assert history(path.read_text()) == [], path.name
    assert history("took 19.7 minutes at 98f4f94 (measured 2026-11-26)") == [
        "98f4f94",
        "2026-11-26",
    ]
    assert (
        history("torch 2.13.0+cu126, 3x224x224, sha256, a defaced page, logs/<gpu>_<date>/") == []
    )


# ---- license --------------------------------------------------------------------------------------------


def test_the_license_names_mit_for_code_and_cc_by_for_prose():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "the trainup authors" in text
    assert "CC BY 4.0" in text and "https://creativecommons.org/licenses/by/4.0/" in text
    assert "MIT" in README and "CC BY 4.0" in README and "](LICENSE)" in README


# ---- JupyterLab as a user and as root -------------------------------------------------------------------


def lab(tmp_path, uid, *extra):
    """Run tools/lab.sh in a copy of the course's layout with a jupyter that prints its arguments and
    its folder, and an `id` that reports `uid`; returns what the fake jupyter printed."""
    course = tmp_path / f"course{uid}"
    (course / "tools").mkdir(parents=True, exist_ok=True)
    (course / ".venv" / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(ROOT / "tools" / "lab.sh", course / "tools" / "lab.sh")
    jupyter = course / ".venv" / "bin" / "jupyter"
    jupyter.write_text('#!/bin/sh\necho "$PWD"\necho "$@"\n')
    jupyter.chmod(0o755)
    bin_dir = tmp_path / f"bin{uid}"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "id").write_text(f'#!/bin/sh\n[ "$1" = -u ] && echo {uid}\n')
    (bin_dir / "id").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(
        ["bash", str(course / "tools" / "lab.sh"), *extra],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    folder, args = done.stdout.splitlines()
    assert folder == str(
        course
    )  # started from the course's top folder, wherever it was called from
    return args


def test_lab_adds_allow_root_only_for_root(tmp_path):
    assert os.access(ROOT / "tools" / "lab.sh", os.X_OK)
    assert lab(tmp_path, 0) == "lab notebooks/ --allow-root"
    assert lab(tmp_path, 1000) == "lab notebooks/"
    assert (
        lab(tmp_path, 1000, "--no-browser", "--port", "8889")
        == "lab notebooks/ --no-browser --port 8889"
    )


def test_lab_without_a_venv_says_what_to_run(tmp_path):
    (tmp_path / "tools").mkdir()
    shutil.copy2(ROOT / "tools" / "lab.sh", tmp_path / "tools" / "lab.sh")
    done = subprocess.run(
        ["bash", str(tmp_path / "tools" / "lab.sh")], capture_output=True, text=True, timeout=30
    )
    assert (
        done.returncode == 2 and done.stderr.startswith("error:") and "run_course.sh" in done.stderr
    )
    assert len(done.stderr.strip().splitlines()) == 1
