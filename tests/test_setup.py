"""Set-up as a newcomer meets it (issue 17) and the course where learners are (issue 14): the Python range
and the pins agree, the CPU/CUDA choice, tools/setup_env.sh's messages, the Colab cell, the torch range,
and the driver and hardware sentences of trainup.devices."""

import concurrent.futures
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import colab  # noqa: E402
import colab_cell  # noqa: E402
import setup_choice  # noqa: E402
from trainup import devices  # noqa: E402

README = (ROOT / "README.md").read_text()
DATA = ROOT / "tests" / "data"
SUPPORTED = [
    (3, m) for m in range(setup_choice.PYTHON_OLDEST[1], setup_choice.PYTHON_NEWEST[1] + 1)
]


def pins(path=ROOT / "requirements.txt"):
    """{name: version} of a requirements file's exact pins."""
    found = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)\s*={2,3}\s*(\S+)$", line.strip())
        if m:
            found[m.group(1)] = m.group(2)
    return found


# ---- issue 17.1: the supported Python range is true --------------------------------------------------------


def test_readme_and_setup_state_the_python_range_the_code_checks():
    text = "Python %d.%d to %d.%d" % (*setup_choice.PYTHON_OLDEST, *setup_choice.PYTHON_NEWEST)
    assert text in README
    assert set(re.findall(r"Python 3\.\d+ to 3\.\d+", README)) == {text}
    setup = (ROOT / "tools" / "setup_env.sh").read_text()
    short = "%d.%d to %d.%d" % (*setup_choice.PYTHON_OLDEST, *setup_choice.PYTHON_NEWEST)
    assert set(re.findall(r"3\.\d+ to 3\.\d+", setup)) == {short}


@pytest.mark.parametrize("version", [(3, 9), (3, 10), (3, 15), (2, 7)])
def test_a_python_outside_the_range_gets_one_sentence_naming_what_to_install(version):
    sentence = setup_choice.python_sentence(version)
    assert sentence and "\n" not in sentence and "install Python 3.11 to 3.14" in sentence
    assert ("too old" in sentence) == (version < setup_choice.PYTHON_OLDEST)


def test_every_python_in_the_range_is_accepted():
    assert all(setup_choice.python_sentence(v) is None for v in SUPPORTED)
    assert setup_choice.main(["python", "3.12"]) == 0


def fake_python(tmp_path, version):
    """An interpreter that reports `version` to the set-up's question and is the real one otherwise."""
    path = tmp_path / "python"
    path.write_text(
        f'#!/bin/sh\ncase "$*" in *version_info*) echo {version};; '
        f'*--version*) echo "Python {version}.0";; *) exec "{sys.executable}" "$@";; esac\n'
    )
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def course_copy(tmp_path_factory):
    """What setup_env.sh reads (tools/, requirements.txt), in a folder of its own: the shared .venv is never touched."""
    copy = tmp_path_factory.mktemp("course")
    shutil.copytree(
        ROOT / "tools", copy / "tools", ignore=shutil.ignore_patterns("__pycache__", "horovod")
    )
    shutil.copy(ROOT / "requirements.txt", copy)
    return copy


def setup_env(copy, *args, env=None, timeout=60):
    return subprocess.run(
        ["bash", str(copy / "tools" / "setup_env.sh"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def test_setup_env_stops_on_an_unsupported_python_with_one_sentence(course_copy, tmp_path):
    done = setup_env(course_copy, "--dry-run", env={"PYTHON": str(fake_python(tmp_path, "3.10"))})
    assert done.returncode == 2, done.stdout + done.stderr
    err = done.stderr.strip()
    assert (
        len(err.splitlines()) == 1
        and "Python 3.10 is too old" in err
        and "install Python 3.11 to 3.14" in err
    )
    assert not (course_copy / ".venv").exists()


def test_setup_env_says_step_by_step_what_it_would_do(course_copy, tmp_path):
    done = setup_env(
        course_copy,
        "--dry-run",
        env={"PYTHON": str(fake_python(tmp_path, "3.12")), "TRAINUP_CPU_ONLY": "0"},
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    pins = [
        line
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    for step in (
        "step 1/4: Python",
        "step 2/4",
        f"step 3/4: install {len(pins)} pinned packages",
        "step 4/4",
    ):
        assert step in out, out
    assert "about 5.4 GB" in out and "the first time took" in out and ".venv-install.log" in out
    assert not (course_copy / ".venv").exists() and not (course_copy / ".venv-install.log").exists()
    cpu = setup_env(
        course_copy, "--dry-run", "--cpu", env={"PYTHON": str(fake_python(tmp_path, "3.12"))}
    )
    assert (
        cpu.returncode == 0
        and "CPU-only build" in cpu.stdout
        and "download.pytorch.org/whl/cpu" in cpu.stdout
    )


def test_a_disk_too_full_for_the_cuda_build_is_one_sentence_before_pip(course_copy, tmp_path):
    """A `df` (first on PATH) that reports 1 GB free: the set-up stops before making .venv, in
    one sentence naming the space it needs and the smaller build; 100 GB free goes on."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    df = bin_dir / "df"
    env = {
        "PYTHON": str(fake_python(tmp_path, "3.12")),
        "TRAINUP_CPU_ONLY": "0",
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    }
    for free_kb, code in ((1024**2, 1), (100 * 1024**2, 0)):
        df.write_text(
            "#!/bin/sh\necho 'Filesystem 1024-blocks Used Available Capacity Mounted on'\n"
            f"echo '/dev/x 200000000 1 {free_kb} 1% /'\n"
        )
        df.chmod(0o755)
        done = setup_env(course_copy, "--dry-run", env=env)
        assert done.returncode == code, done.stdout + done.stderr
        assert not (course_copy / ".venv").exists()
    df.write_text(
        "#!/bin/sh\necho 'Filesystem 1024-blocks Used Available Capacity Mounted on'\n"
        f"echo '/dev/x 200000000 1 {1024**2} 1% /'\n"
    )
    full = setup_env(course_copy, "--dry-run", env=env)
    lines = full.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs about 6 GB free" in lines[0] and "has 1 GB free" in lines[0]
    assert "tools/setup_env.sh --cpu" in lines[0] and "step 4/4" not in full.stdout


def test_setup_env_uses_the_active_conda_environment_when_asked(course_copy, tmp_path):
    """--conda: .venv becomes a link to $CONDA_PREFIX (here a stand-in whose python is this one, which holds
    the pinned packages), pip only checks the pins, and the two commands then reuse it without asking."""
    copy = tmp_path / "course"
    shutil.copytree(course_copy, copy)
    shutil.copy(ROOT / "pyproject.toml", copy)
    shutil.copytree(
        ROOT / "scripts", copy / "scripts", ignore=shutil.ignore_patterns("__pycache__")
    )
    none = setup_env(copy, "--conda", env={"CONDA_PREFIX": ""})
    assert none.returncode == 2 and "conda env create -f environment.yml" in none.stderr
    assert len(none.stderr.strip().splitlines()) == 1 and not (copy / ".venv").exists()
    # the stand-in environment: a venv of its own that sees this one's packages (a .pth), so that what the
    # set-up installs (the course, editable) goes into it and never into the shared .venv
    prefix = tmp_path / "envs" / "trainup"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True)
    import sysconfig

    (Path(sysconfig.get_path("purelib", vars={"base": str(prefix)})) / "shared.pth").write_text(
        sysconfig.get_path("purelib") + "\n"
    )
    conda = {"CONDA_PREFIX": str(prefix), "TRAINUP_SKIP_HOROVOD": "1"}
    dry = setup_env(copy, "--conda", "--dry-run", env=conda)
    assert (
        dry.returncode == 0
        and f"ln -s {prefix} .venv" in dry.stdout
        and not (copy / ".venv").exists()
    )
    (copy / ".venv").mkdir()
    taken = setup_env(copy, "--conda", env=conda)
    assert (
        taken.returncode == 2 and "mv .venv .venv.pip" in taken.stderr and (copy / ".venv").is_dir()
    )
    (copy / ".venv").rmdir()
    # pip checks every pin and installs the course: minutes on 2 busy cores
    done = setup_env(copy, "--conda", env=conda, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (copy / ".venv").resolve() == prefix.resolve() and (
        prefix / ".requirements.sha256"
    ).exists()
    assert "the course's packages (trainup, lessons) installed" in done.stdout
    where = subprocess.run(
        [str(prefix / "bin" / "python"), "-c", "import lessons; print(lessons.__file__)"],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},  # the install, not ours
        capture_output=True,
        text=True,
    )
    assert where.stdout.startswith(str(copy / "scripts" / "lessons")), where.stdout + where.stderr
    again = setup_env(
        copy, env={"TRAINUP_SKIP_HOROVOD": "1"}, timeout=600
    )  # run_tests.sh's, run_course.sh's
    assert (
        again.returncode == 0 and "step 1/4" not in again.stdout and (copy / ".venv").is_symlink()
    )
    assert "installed" not in again.stdout  # once per environment and checkout


FAILING_PIP = """#!/bin/sh
echo "Looking in indexes: https://pypi.org/simple"
echo "ERROR: Could not find a version that satisfies the requirement torch===2.13.0 (from versions: none)"
echo "ERROR: No matching distribution found for torch===2.13.0"
exit 1
"""


def test_a_failing_pip_is_named_with_its_log_and_the_failing_line(course_copy, tmp_path):
    """The set-up's real script, with an interpreter whose venv's pip fails as pip does on a missing wheel:
    one sentence with pip's first ERROR line and the log's name; pip's whole output is in the log."""
    copy = tmp_path / "course"
    shutil.copytree(course_copy, copy)
    python = tmp_path / "python"
    python.write_text(
        f'#!/bin/sh\nif [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && cat > "$3/bin/python" <<\'EOF\'\n'
        f'{FAILING_PIP}EOF\nchmod +x "$3/bin/python"; exit 0; fi\nexec "{sys.executable}" "$@"\n'
    )
    python.chmod(0o755)
    done = setup_env(copy, env={"PYTHON": str(python), "TRAINUP_CPU_ONLY": "0"})
    assert done.returncode == 1, done.stdout + done.stderr
    err = done.stderr.strip().splitlines()
    assert (
        len(err) == 1
        and "ERROR: Could not find a version" in err[0]
        and ".venv-install.log" in err[0]
    ), err
    assert "Looking in indexes" in (copy / ".venv-install.log").read_text()
    assert "step 3/4" in done.stdout and "step 4/4" not in done.stdout


def compatible_wheel(files, version, python):
    """Whether PyPI's files for one pin include a wheel that installs on CPython `python` on a Linux x86-64
    machine like this one, as pip decides it: the wheel's tags against the interpreter's, and requires-python."""
    from pip._vendor.packaging.specifiers import SpecifierSet
    from pip._vendor.packaging.tags import compatible_tags, cpython_tags
    from pip._vendor.packaging.utils import parse_wheel_filename
    from pip._vendor.packaging.version import Version

    accepted = set(cpython_tags(python)) | set(compatible_tags(python))
    for f in files:
        if not f["filename"].endswith(".whl") or f.get("yanked"):
            continue
        name, found, _, tags = parse_wheel_filename(f["filename"])
        if found != Version(version) or not tags & accepted:
            continue
        if SpecifierSet(f.get("requires-python") or "").contains(
            "%d.%d" % python, prereleases=True
        ):
            return True
    return False


def pypi_files(name):
    request = urllib.request.Request(
        f"https://pypi.org/simple/{name}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.load(answer)["files"]


def test_every_pin_has_a_wheel_on_pypi_for_exactly_the_pythons_claimed():
    """Asks PyPI itself, one request per package in parallel threads. pip's resolver (`pip install --dry-run
    --python-version 3.X --only-binary=:all:`) would be the fuller check, but the index reachable here serves no
    PEP 658 metadata, so pip downloads every wheel to read its dependencies (several GB per Python version).
    Run once by hand, that pip call resolved all 159 packages for 3.12, 3.13 and 3.14, and
    stopped at numpy==2.4.6 for 3.10 and at torch===2.13.0 for 3.15."""
    try:
        urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=15).close()
    except urllib.error.URLError as e:
        if isinstance(e, urllib.error.HTTPError):
            raise
        pytest.skip(
            f"PyPI cannot be reached from here ({e.reason}), so the pins' wheels cannot be checked"
        )
    wanted = pins()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        files = dict(zip(wanted, pool.map(pypi_files, wanted)))
    missing = {
        "%d.%d" % py: [
            f"{n}=={v}" for n, v in wanted.items() if not compatible_wheel(files[n], v, py)
        ]
        for py in [(3, 10), *SUPPORTED, (3, 15)]
    }
    assert all(not missing["%d.%d" % py] for py in SUPPORTED), missing
    # The range is also tight: just outside it, a pin has no wheel (numpy and pandas for 3.10, torch for 3.15).
    assert {"numpy==2.4.6", "pandas==3.1.1"} <= set(missing["3.10"]) and "torch==2.13.0" in missing[
        "3.15"
    ]


# ---- issue 17.2: the CUDA or the CPU-only build --------------------------------------------------------------


def test_the_default_is_pypis_cuda_build_which_runs_everywhere():
    flavour, sentence = setup_choice.choose({}, [], driver_found=True)
    assert flavour == "cuda" and "5.4 GB" in sentence and "--cpu" not in sentence


def test_without_an_nvidia_driver_the_cpu_build_is_offered_not_chosen():
    flavour, sentence = setup_choice.choose({}, [], driver_found=False)
    assert (
        flavour == "cuda"
        and "no NVIDIA driver" in sentence
        and "--cpu" in sentence
        and "TRAINUP_CPU_ONLY=1" in sentence
    )


@pytest.mark.parametrize(
    "env,args",
    [({"TRAINUP_CPU_ONLY": "1"}, []), ({}, ["--cpu"]), ({"TRAINUP_CPU_ONLY": "1"}, ["--cpu"])],
)
def test_the_cpu_build_when_asked_for(env, args):
    for driver in (True, False):
        flavour, sentence = setup_choice.choose(env, args, driver_found=driver)
        assert (
            flavour == "cpu"
            and setup_choice.CPU_INDEX in sentence
            and "not measured here" in sentence
        )
    assert setup_choice.choose({"TRAINUP_CPU_ONLY": "0"}, [], driver_found=False)[0] == "cuda"


def test_the_cuda12_build_when_asked_for(course_copy, tmp_path):
    for driver in (True, False):
        flavour, sentence = setup_choice.choose(
            {"TRAINUP_CPU_ONLY": "1"}, ["--cuda12"], driver_found=driver
        )
        assert flavour == "cu126" and setup_choice.CUDA12_INDEX in sentence and "525" in sentence
    cu = setup_choice.cpu_requirements((ROOT / "requirements.txt").read_text(), "cu126")
    assert (
        f"torch=={pins()['torch']}+cu126" in cu
        and f"torchvision=={pins()['torchvision']}+cu126" in cu
    )
    dry = setup_env(
        course_copy, "--dry-run", "--cuda12", env={"PYTHON": str(fake_python(tmp_path, "3.12"))}
    )
    assert dry.returncode == 0 and "CUDA 12.6 build" in dry.stdout and "whl/cu126" in dry.stdout, (
        dry.stderr
    )


def test_driver_detection_reads_nvidia_smi_or_the_kernel_module():
    assert setup_choice.nvidia_driver_found(
        which=lambda _: "/usr/bin/nvidia-smi", exists=lambda _: False
    )
    assert setup_choice.nvidia_driver_found(
        which=lambda _: None, exists=lambda p: p == "/proc/driver/nvidia/version"
    )
    assert not setup_choice.nvidia_driver_found(which=lambda _: None, exists=lambda _: False)


def test_the_cpu_path_pins_the_same_versions_as_a_matching_pair():
    cpu = setup_choice.cpu_requirements((ROOT / "requirements.txt").read_text())
    found = {m.group(1): m.group(2) for m in re.finditer(r"^([\w.-]+)==(\S+)$", cpu, flags=re.M)}
    base = pins()
    assert (
        found["torch"] == base["torch"] + "+cpu"
        and found["torchvision"] == base["torchvision"] + "+cpu"
    )
    assert {k: v for k, v in found.items() if k not in ("torch", "torchvision")} == {
        k: v for k, v in base.items() if k not in ("torch", "torchvision")
    }
    assert not [line for line in cpu.splitlines() if "===" in line and not line.startswith("#")]
    with pytest.raises(ValueError):
        setup_choice.cpu_requirements("numpy==2.4.6\n")


def test_readme_states_the_size_of_each_path():
    section = README.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    assert (
        setup_choice.CUDA_SIZE in section and "TRAINUP_CPU_ONLY=1" in section and "--cpu" in section
    )
    assert "not measured here" in section


def test_the_cpu_build_installs():
    pytest.skip(
        "the CPU-only path is not checked here: its torchvision 0.28.0+cpu is only on "
        "download.pytorch.org, and only PyPI is reachable from the machine the course is built on"
    )


# ---- issue 14.1: Colab -----------------------------------------------------------------------------------------

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_starts_with_the_badge_and_the_title_and_then_the_set_up_cell(path):
    """The lesson's title first (the badge above it): the set-up cell, folded on Colab to its
    #@title line, is the first code cell."""
    nb = nbformat.read(path, as_version=4)
    badge, title = nb.cells[:2]
    setup = next(c for c in nb.cells if c.cell_type == "code")
    assert badge.id == colab_cell.BADGE_ID and setup.id == colab_cell.SETUP_ID
    assert title.cell_type == "markdown" and title.source.startswith("# "), title.source[:80]
    assert setup.source.startswith("#@title ") and setup.metadata.get("cellView") == "form"
    assert (
        badge.source == colab_cell.badge_source(path)
        and colab.REPO_URL.split("github.com/")[1] in badge.source
    )
    assert setup.source == colab_cell.setup_source() and colab.REPO_URL in setup.source
    assert [c.id for c in nb.cells].count(colab_cell.SETUP_ID) == 1
    assert "".join(setup.outputs[0]["text"]) == colab_cell.OUTSIDE_COLAB


def test_the_cell_tool_is_idempotent(tmp_path):
    nb = nbformat.read(NOTEBOOKS[0], as_version=4)
    path = ROOT / "notebooks" / NOTEBOOKS[0].name
    once = nbformat.writes(colab_cell.apply(nb, path))
    assert nbformat.writes(colab_cell.apply(nbformat.reads(once, as_version=4), path)) == once
    bare = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell("# 07 · new"), nbformat.v4.new_code_cell("1 + 1")]
    )
    cells = colab_cell.apply(bare, ROOT / "notebooks" / "07_new.ipynb").cells
    assert [c.id for c in cells][0] == colab_cell.BADGE_ID and len(cells) == 4
    assert [c.source for c in cells[1:]] == ["# 07 · new", colab_cell.setup_source(), "1 + 1"]


def test_requirements_colab_never_touches_colabs_torch():
    listed = pins(ROOT / "requirements-colab.txt")
    assert listed and not set(listed) & set(colab.KEPT)
    assert all(
        pins()[name] == version for name, version in listed.items()
    )  # the same pins as requirements.txt


def colab_snapshot():
    """{name: version} of Colab's GPU runtime (tests/data/colab_pip_freeze_gpu.txt, its published pip freeze)."""
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    lines = (ROOT / "tests" / "data" / "colab_pip_freeze_gpu.txt").read_text().splitlines()
    return {
        canonicalize_name(m[1]): Version(m[2])
        for m in (re.match(r"^([A-Za-z0-9_.-]+)==(\S+)$", line) for line in lines)
        if m
    }


def test_the_colab_cell_moves_none_of_colabs_packages():
    """pip's resolution of requirements-colab.txt against Colab's snapshot, offline: what Colab has must
    satisfy every requirement that reaches it; what it lacks is installed at the course's pins, whose own
    requirements (read from this environment's installed copies) are followed the same way."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    have = colab_snapshot()
    assert have["numpy"] == Version("2.1.3") and "mlxtend" in have  # Colab's published snapshot
    python313 = {
        **default_environment(),
        "python_version": "3.13",
        "python_full_version": "3.13.5",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "extra": "",
    }
    lines = (ROOT / "requirements-colab.txt").read_text().splitlines()
    todo = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    installed, moved = {}, []
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if req.marker and not req.marker.evaluate(python313):
            continue
        if name in have:
            if not req.specifier.contains(have[name], prereleases=True):
                moved.append(f"{req} (Colab has {have[name]})")
            continue
        if name in installed:
            continue
        dist = importlib.metadata.distribution(name)  # what pip would install: the course's own pin
        assert req.specifier.contains(dist.version, prereleases=True), (
            f"{req}: the course has {dist.version}"
        )
        installed[name] = dist.version
        todo += [Requirement(r) for r in dist.requires or []]
    assert not moved, "the Colab cell would move Colab's own packages: " + "; ".join(moved)
    assert {"pytorch-lightning", "torchmetrics", "nvitop"} <= set(installed)  # what Colab lacks
    assert not set(map(canonicalize_name, colab.KEPT)) & set(installed)


@pytest.fixture
def colab_runtime(monkeypatch, tmp_path):
    """A simulated Colab: its environment marker, a clone folder, and every command recorded, none run. The
    "clone" copies what the set-up reads from this checkout."""
    home = tmp_path / "content" / "trainup"
    calls = []

    def run(cmd, **kwargs):
        calls.append(list(cmd))
        if cmd[:2] == ["git", "clone"]:
            (home / "tools").mkdir(parents=True)
            shutil.copy(ROOT / "tools" / "colab.py", home / "tools")
            shutil.copy(ROOT / "requirements-colab.txt", home)
            (home / "scripts" / "trainup").mkdir(parents=True)
            (home / "scripts" / "trainup" / "__init__.py").write_text("")
            (home / "notebooks").mkdir()
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-simulated")
    monkeypatch.setenv("TRAINUP_COLAB_HOME", str(home))
    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "elsewhere")  # set_up adds to it; put back afterwards
    monkeypatch.delenv("TRAINUP_QUICK", raising=False)  # as on Colab: set_up chooses quick mode
    monkeypatch.delitem(sys.modules, "colab")
    monkeypatch.chdir(tmp_path)
    yield home, calls
    sys.modules["colab"] = colab


def test_on_colab_the_cell_clones_installs_what_colab_lacks_and_moves_in_once(
    colab_runtime, capsys
):
    home, calls = colab_runtime
    exec(colab_cell.setup_source(), {})
    assert calls[0][:2] == ["git", "clone"] and colab.REPO_URL in calls[0]
    pip = calls[1]
    assert (
        pip[:4] == [sys.executable, "-m", "pip", "install"]
        and str(home / "requirements-colab.txt") in pip
    )
    held = (home / ".colab-constraints.txt").read_text()
    assert (
        f"torch=={importlib.metadata.version('torch')}" in held.splitlines()
    )  # Colab's torch is held where it is
    assert not any(re.match(r"^(torch|torchvision|numpy|pandas)\b", a) for a in pip)
    assert len(calls) == 2 and os.getcwd() == str(home / "notebooks")
    assert sys.path[0] == str(
        home / "scripts"
    )  # the notebooks' `from lessons import ...` finds the clone's
    # and so do the processes the notebook starts (tests/test_colab_clone.py runs them)
    assert os.environ["PYTHONPATH"] == os.pathsep.join([str(home / "scripts"), "elsewhere"])
    exec(colab_cell.setup_source(), {})  # again: no clone, no install
    assert len(calls) == 2 and os.getcwd() == str(home / "notebooks")
    assert os.environ["PYTHONPATH"] == os.pathsep.join([str(home / "scripts"), "elsewhere"])
    said = capsys.readouterr().out
    assert (
        "working folder" in said and colab.QUICK_NOTE in said
    )  # the time, said before it is spent
    assert os.environ["TRAINUP_QUICK"] == "1"


def test_outside_colab_the_cell_does_nothing(monkeypatch, capsys):
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail(f"ran {a}"))
    monkeypatch.chdir(ROOT / "notebooks")
    exec(colab_cell.setup_source(), {})
    assert capsys.readouterr().out == colab_cell.OUTSIDE_COLAB and not colab.on_colab({})


def test_readme_colab_section_matches_the_cell():
    section = README.split("**Colab**", 1)[1].split("\n- **", 1)[0]
    assert "<" not in section and colab.REPO_URL in section and "tools/colab.py" in section
    assert "requirements-colab.txt" in section


# ---- issue 14.2: the PyTorch a learner has ----------------------------------------------------------------------


def test_readme_states_the_torch_range_the_code_uses():
    m = re.search(r"torch (\d+)\.(\d+) to (\d+)\.(\d+)", README.split("**Which PyTorch**", 1)[1])
    assert (
        m
        and (int(m[1]), int(m[2])) == devices.TORCH_OLDEST
        and (int(m[3]), int(m[4])) == devices.TORCH_PINNED
    )
    assert pins()["torch"].startswith("%d.%d." % devices.TORCH_PINNED)
    assert devices.torch_sentence() is None  # the torch here is inside the range


def test_an_older_torch_gets_one_sentence():
    assert (
        devices.torch_sentence("2.11.0+cu126") is None and devices.torch_sentence("2.13.0") is None
    )
    sentence = devices.torch_sentence("2.10.1+cu126")
    assert sentence and "2.11 to 2.13" in sentence and "\n" not in sentence


def test_the_newest_api_the_scripts_use_exists_since_the_oldest_torch():
    import torch.distributed.pipelining as pp

    # ScheduleDualPipeV (torch 2.9) is the newest; a lesson needing a newer API must say so in one sentence.
    assert hasattr(pp, "ScheduleDualPipeV") and devices.TORCH_OLDEST >= (2, 9)


# ---- issue 14.3: the driver and the hardware -------------------------------------------------------------------

OLD = (DATA / "nvidia-smi_t4_driver535.txt").read_text()
NEW = (DATA / "nvidia-smi_h100_driver580.txt").read_text()


def test_nvidia_smi_is_read():
    assert devices.parse_nvidia_smi(OLD) == dict(
        driver="535.104.05", cuda="12.2", gpus=["Tesla T4"]
    )
    assert devices.parse_nvidia_smi(NEW) == dict(
        driver="580.126.09", cuda="13.0", gpus=["NVIDIA H100 80GB HBM3"]
    )


def test_an_old_driver_under_a_cuda_13_torch_gets_the_fix_in_one_sentence():
    sentence = devices.driver_sentence(OLD, torch_cuda="13.0", torch_version="2.13.0+cu130")
    assert (
        sentence
        and "\n" not in sentence
        and "535.104.05" in sentence
        and "cannot use the GPU" in sentence
    )
    assert (
        devices.CUDA12_INDEX in sentence
        and "580" in sentence
        and "tools/setup_env.sh --cuda12" in sentence
    )
    # a build that exists for torch 2.13 (CUDA 12.6: drivers from the 525 series), at the pinned versions
    assert "pip install torch==2.13.0+cu126 torchvision==0.28.0+cu126 --index-url" in sentence
    assert devices.CUDA12_INDEX.endswith("/whl/cu126")
    assert not any(
        "cu129" in f.read_text() for f in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    )
    assert devices.cuda12_install("2.11.0+cu128").startswith(
        "pip install torch==2.11.0+cu126 torchvision==0.26.0"
    )
    assert devices.driver_sentence(NEW, torch_cuda="13.0", torch_version="2.13.0") is None
    assert devices.driver_sentence(OLD, torch_cuda="12.9", torch_version="2.13.0+cu129") is None
    assert devices.driver_sentence(OLD, torch_cuda=None, torch_version="2.13.0+cpu") is None
    assert "update the NVIDIA driver" in devices.driver_sentence(
        OLD.replace("12.2", "11.8"), "13.0", "2.13.0"
    )


def test_bf16_on_a_t4_gets_one_sentence():
    sentence = devices.bf16_sentence("Tesla T4", (7, 5))
    assert (
        sentence
        and "Tesla T4" in sentence
        and "--precision 16" in sentence
        and "\n" not in sentence
    )
    assert devices.bf16_sentence("NVIDIA H100 80GB HBM3", (9, 0)) is None


def test_bf16_on_the_cpu_stays_allowed():
    with devices.autocast("cpu", "bf16"):
        pass


def test_two_gpu_lessons_on_one_gpu_say_what_they_would_show():
    sentence = devices.gpus_sentence(2, 1, "NCCL against gloo moving gradients between GPUs")
    assert (
        sentence
        and "1 GPU(s)" in sentence
        and "NCCL against gloo" in sentence
        and "\n" not in sentence
    )
    assert devices.gpus_sentence(2, 2, "x") is None and devices.gpus_sentence(2, 0, "x") is None


def test_the_checks_used_by_setup_and_notebook_00_run_here():
    lines = devices.checks()
    assert lines and all(isinstance(line, str) and line for line in lines)
    assert all("\n" not in line for line in lines)


def test_the_horovod_build_names_its_log_and_the_failing_line(course_copy, tmp_path):
    """build_horovod.sh in a copy whose .venv's pip cannot download the sdist: with Horovod required (CI), one
    sentence naming pip's ERROR line and the log; nothing is downloaded and the shared .venv is untouched."""
    copy = tmp_path / "course"
    shutil.copytree(course_copy, copy)
    shutil.copytree(ROOT / "tools" / "horovod", copy / "tools" / "horovod")
    venv_python = copy / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text(
        '#!/bin/sh\ncase "$*" in *"pip download"*) echo "Collecting horovod==0.28.1"; '
        'echo "ERROR: No matching distribution found for horovod==0.28.1"; exit 1;; '
        "*) echo 2.13.0;; esac\n"
    )
    venv_python.chmod(0o755)
    done = subprocess.run(
        ["bash", str(copy / "tools" / "build_horovod.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TRAINUP_REQUIRE_HOROVOD": "1", "CUDA_HOME": str(tmp_path)},
    )
    if "not found (install it" in done.stdout + done.stderr:
        pytest.skip(
            "a compiler, cmake, make or patch is missing here, so the build stops before downloading"
        )
    assert done.returncode == 1, done.stdout + done.stderr
    err = done.stderr.strip().splitlines()
    assert (
        len(err) == 1
        and "ERROR: No matching distribution found" in err[0]
        and "download.log" in err[0]
    ), err
    assert "building Horovod 0.28.1" in done.stdout and "a few minutes" in done.stdout


def test_a_script_asking_for_the_gpu_behind_an_old_driver_gets_the_fix(monkeypatch, capsys):
    monkeypatch.setattr(devices.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices, "nvidia_smi", lambda: OLD)
    monkeypatch.setattr(devices.torch.version, "cuda", "13.0")
    with pytest.raises(devices.UserError, match="535.104.05 runs CUDA up to 12.2.*cu126"):
        devices.pick("cuda")
    assert devices.pick("auto").type == "cpu"  # auto still runs, and says why it is on the CPU
    assert "note: running on the CPU: the NVIDIA driver 535.104.05" in capsys.readouterr().err
    monkeypatch.setattr(devices, "nvidia_smi", lambda: None)
    assert devices.pick("auto").type == "cpu" and capsys.readouterr().err == ""
