"""The course as Colab has it: a clone whose packages are not installed.

On Colab a learner opens a notebook and runs its set-up cell, which clones the course and puts the
clone's scripts/ on sys.path (tools/colab.py); nothing of the course is pip-installed there. Here
the .venv has the course installed editable (a path in site-packages' __editable__.*.pth) and the
tests' own PYTHONPATH may name this checkout's scripts/ too: a copy run naively imports this
checkout's packages and proves nothing. So the course's tracked files are copied to a temporary
folder, and every fresh interpreter started below (the notebook's and every job's) first runs a
sitecustomize.py (GUARD) that takes away each path and editable finder that reaches a `trainup` or
`lessons` outside the copy, and notes where those two packages are imported from. Each test asserts
that every such import, in every process, came from the copy.

The notebook's cells run as Colab runs them: the set-up cell with COLAB_RELEASE_TAG set (its clone
folder given by TRAINUP_COLAB_HOME, already there, so no network), then the lesson's own cells,
read from the notebook, in quick mode, each lesson in a fresh interpreter of its own, as Colab
gives each notebook its own runtime. A first job that another lesson starts with the same helper
and script is started once, by the first of them; the other lessons still run their set-up cell
and imports.
"""

import hashlib
import json
import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

NOTEBOOKS = ROOT / "notebooks"
PACKAGES = ("trainup", "lessons")

# Put first on PYTHONPATH: Python runs it at the start of every fresh interpreter, after the .pth
# files of site-packages have put their paths on sys.path.
GUARD = '''
import json, os, sys

COPY = os.path.realpath(os.environ["TRAINUP_CLONE_ROOT"])
PACKAGES = {packages!r}


def inside(path):
    return path == COPY or path.startswith(COPY + os.sep)


def reaches_another_course(entry):
    folder = os.path.realpath(entry or os.getcwd())
    return not inside(folder) and any(
        os.path.isfile(os.path.join(folder, p, "__init__.py")) for p in PACKAGES)


# an editable install's path (the .venv's), a PYTHONPATH entry, a user site: gone
sys.path[:] = [p for p in sys.path if not reaches_another_course(p)]
# setuptools' other kind of editable install: a finder on sys.meta_path
sys.meta_path[:] = [f for f in sys.meta_path
                    if not str(getattr(f, "__module__", "")).startswith("__editable__")]


class Witness:
    """Notes where each of PACKAGES is found, in this process, at its import."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name not in PACKAGES:
            return None
        for finder in sys.meta_path:
            if finder is cls or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                # read at each import: the cells' interpreter gives each lesson a file of its own
                with open(os.environ["TRAINUP_CLONE_IMPORTS"], "a") as notes:
                    notes.write(json.dumps([os.getpid(), name, spec.origin,
                                            list(getattr(sys, "argv", []))[:2]]) + "\\n")
                return spec
        return None


sys.meta_path.insert(0, Witness)
'''.format(packages=PACKAGES)

# Runs a lesson's cells, one after another in one namespace as a kernel does, each after a marker
# line so that a cell's printed output can be read apart. A lesson that fails ends with its
# traceback and a marker.
DRIVER = """
import json, os, sys, traceback

for lesson in json.load(open(sys.argv[1])):
    os.environ["TRAINUP_CLONE_IMPORTS"] = lesson["notes"]
    namespace = {"__name__": "__main__"}
    print(f"<<lesson {lesson['name']}>>", flush=True)
    try:
        for number, source in enumerate(lesson["cells"]):
            print(f"<<cell {number}>>", flush=True)
            exec(compile(source, f"<cell {number}>", "exec"), namespace)
            sys.stdout.flush()
    except (Exception, SystemExit):
        traceback.print_exc(file=sys.stdout)
        print("<<failed>>", flush=True)
"""


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A copy of the course's tracked files (what `git clone` gives), as the set-up cell leaves it
    on Colab once it has installed requirements-colab.txt (here the .venv already has them)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if listed.returncode != 0:
        pytest.skip(f"the course is not a git checkout here: {listed.stderr.decode().strip()}")
    home = tmp_path_factory.mktemp("content") / "trainup"
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():  # a file deleted and not yet committed is not in a clone either
            (home / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, home / name)
    requirements = (home / "requirements-colab.txt").read_bytes()
    (home / ".colab-installed").write_text(hashlib.sha256(requirements).hexdigest())
    guard = home.parent / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(GUARD)
    (guard / "run_cells.py").write_text(DRIVER)
    return home


def colab_env(home, notes):
    """This process's environment as a Colab runtime's would be: none of the course's knobs or
    test switches (TRAINUP_*), no PYTHONPATH but the guard's; quick mode, as the tests run."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("TRAINUP_") and k != "PYTHONPATH"
    }
    return {
        **env,
        "COLAB_RELEASE_TAG": "release-colab-simulated",
        "TRAINUP_COLAB_HOME": str(home),
        "TRAINUP_QUICK": "1",
        "PYTHONPATH": str(home.parent / "guard"),
        "TRAINUP_CLONE_ROOT": str(home),
        "TRAINUP_CLONE_IMPORTS": str(notes),
        "PYTHONUNBUFFERED": "1",
    }


def imports(notes):
    """[(pid, package, the file it was imported from, argv[:2])] from every process of a run."""
    if not notes.exists():
        return []
    return [tuple(json.loads(line)) for line in notes.read_text().splitlines()]


def outside(home, found):
    root = home.resolve()
    return [f for f in found if not (f[2] and Path(f[2]).resolve().is_relative_to(root))]


def code_cells(notebook):
    cells = json.loads((NOTEBOOKS / f"{notebook}.ipynb").read_text())["cells"]
    return [(c.get("id"), "".join(c["source"])) for c in cells if c["cell_type"] == "code"]


def cell(notebook, line):
    """The one code cell of the notebook that holds this line, whole."""
    found = [source for _, source in code_cells(notebook) if line in source]
    assert len(found) == 1, f"{notebook}: {len(found)} code cells hold {line!r} (1 wanted)"
    return found[0]


def setup_cell(notebook):
    return next(source for cell_id, source in code_cells(notebook) if cell_id == "colab-setup")


def run_lessons(home, folder, lessons, timeout_per_lesson=900):
    """Each lesson's set-up cell, then its pieces ({notebook: pieces}), in a fresh interpreter
    started where Colab starts its kernel (the folder above the clone); the tests give it one
    lesson. Returns {notebook: (it ran to its end, what it imported from where, the text
    each cell printed, what it printed in all)}, and the interpreter's stderr."""
    cells = folder / "cells.json"
    plan = [
        {
            "name": notebook,
            "notes": str(folder / f"{notebook}.imports.jsonl"),
            "cells": [setup_cell(notebook), *pieces],
        }
        for notebook, pieces in lessons.items()
    ]
    cells.write_text(json.dumps(plan))
    driver = home.parent / "guard" / "run_cells.py"
    done = subprocess.run(
        [sys.executable, str(driver), str(cells)],
        cwd=home.parent,
        env=colab_env(home, folder / "kernel.imports.jsonl"),
        capture_output=True,
        text=True,
        timeout=timeout_per_lesson * len(lessons),
    )
    assert done.returncode == 0, (
        f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    results = {}
    for part in done.stdout.split("<<lesson ")[1:]:
        notebook, _, text = part.partition(">>\n")
        said = {}
        for piece in text.split("<<cell ")[1:]:
            number, _, printed = piece.partition(">>\n")
            said[int(number)] = printed
        ended = len(said) == len(lessons[notebook]) + 1 and not text.endswith("<<failed>>\n")
        results[notebook] = (ended, imports(folder / f"{notebook}.imports.jsonl"), said, text)
    assert results.keys() == lessons.keys(), f"lessons that never started: {done.stderr[-3000:]}"
    return results, done.stderr


def assert_only_the_copy(home, result, stderr, pieces_ran_a_job=True):
    ended, found, _, text = result
    assert ended, f"{text[-3000:]}\n{stderr[-3000:]}"
    assert found, "no process imported trainup or lessons: the witness did not run"
    assert not outside(home, found), f"imported from outside the copy: {outside(home, found)}"
    notebook = {
        name: origin
        for _, name, origin, argv in found
        if argv[:1] and argv[0].endswith("run_cells.py")
    }
    assert notebook.get("lessons") == str(home / "scripts" / "lessons" / "__init__.py"), found
    if pieces_ran_a_job:
        jobs = [f for f in found if not (f[3][:1] and f[3][0].endswith("run_cells.py"))]
        assert jobs, f"no job's process imported the copy's packages: {found}"


def test_a_naive_run_would_import_this_checkout_and_the_guard_stops_it(clone, tmp_path):
    """Why the guard: from the copy's top folder, `import trainup` reaches this checkout (through
    the .venv's editable install, or PYTHONPATH) unless the guard takes those paths away."""
    probe = ["-c", "import trainup; print(trainup.__file__)"]
    env = colab_env(clone, tmp_path / "imports.jsonl")
    bare = {k: v for k, v in env.items() if k != "PYTHONPATH"}  # no guard
    naive = [{**bare, "PYTHONPATH": str(ROOT / "scripts")}]
    if any(any(Path(folder).glob("__editable__*trainup*")) for folder in site.getsitepackages()):
        naive.append(bare)  # the .venv's editable install alone
    for naive_env in naive:
        ran = subprocess.run(
            [sys.executable, *probe], cwd=clone, capture_output=True, text=True, env=naive_env
        )
        assert ran.returncode == 0 and not Path(ran.stdout.strip()).is_relative_to(clone), ran
    guarded = subprocess.run(
        [sys.executable, *probe], cwd=clone, capture_output=True, text=True, env=env
    )
    # the copy's scripts/ is not on sys.path from its top folder
    assert "No module named 'trainup'" in guarded.stderr, guarded
    guarded = subprocess.run(
        [sys.executable, *probe], cwd=clone / "scripts", capture_output=True, text=True, env=env
    )
    assert guarded.returncode == 0 and guarded.stdout.strip() == str(
        clone / "scripts" / "trainup" / "__init__.py"
    ), guarded
    assert [f[1] for f in imports(tmp_path / "imports.jsonl")] == ["trainup"]


def test_the_spot_drill_of_lesson_04c_runs_from_a_clone_as_on_colab(clone, tmp_path):
    """Lesson 04c's spot drill (`python -m trainup.spot` around a training run, a stand-in for the
    cloud's metadata service) from the copy: it ends as the notebook's stored output says."""
    notebook = "04c_elastic"
    spot = cell(notebook, 'spot = elastic.spot_drill("spot", cloud="aws")')
    pieces = [
        cell(
            notebook,
            "from lessons import checks, launch, report\n"
            "from lessons.bylesson import elastic, ray_drill",
        ),
        spot,
    ]
    results, stderr = run_lessons(clone, tmp_path, {notebook: pieces})
    assert_only_the_copy(clone, results[notebook], stderr)
    _, found, said, _ = results[notebook]
    stored = json.loads((NOTEBOOKS / f"{notebook}.ipynb").read_text())["cells"]
    outputs = next(c["outputs"] for c in stored if "".join(c["source"]) == spot)
    assert said[len(pieces)] == "".join("".join(o["text"]) for o in outputs if "text" in o)
    # the watcher, `python -m trainup.spot` (its argv is ["-m", ...] until runpy has found it)
    assert any(name == "trainup" and argv[:1] == ["-m"] for _, name, _, argv in found), found


def whole(line):
    """The notebook's code cell that holds this line, whole."""
    return ("cell", line)


def call(text):
    """A call as it stands in one of the notebook's cells, alone (the cell starts more jobs)."""
    return ("call", text)


def glue(code):
    """Code that is not the notebook's: the value a loop of the cell gives its variable."""
    return ("glue", code)


# Each lesson: its import cell, then what starts its first job: the cell, or the call taken from
# it; a lesson whose first cell of jobs is heavy gives one job of it, or a lighter job of its own.
# 04c: the spot drill above. Each runs after the notebook's set-up cell. The flag: the pieces start
# a job that imports the course's packages. A call or glue, last, that an earlier lesson makes
# with the same helper and script is left out (planned): 04a2 and 11 (04a1's), 07b, 07c, 10 and
# 10a (02's), 08 (01's), 08a (04's), 09a2 (09's).
LESSONS = {
    "00_environment": (
        [
            whole("from lessons import checks, machine, report"),
            whole("ghost = subprocess.Popen("),
            whole("found = machine.training_processes()"),
            whole("ended = machine.end_process(ghost.pid)"),
        ],
        False,
    ),
    "01_cpu_baseline": (
        [
            whole("from lessons import checks, claims, launch, report"),
            glue("threads = 1"),
            call('report.run("_trainup_cpu.py", "--threads", threads, name=f"cpu_t{threads}")'),
        ],
        True,
    ),
    "02_single_gpu": (
        [
            whole(
                "from lessons import checks, claims, launch, report\n"
                "from lessons.bylesson import gpu"
            ),
            call('cpu_run = report.run("_trainup_gpu.py", "--device", "cpu", name="gpu_cpu")'),
        ],
        True,
    ),
    # its first job remakes lesson 02's CPU run where it is missing, as in a fresh clone
    "02b_feeding_the_gpu": (
        [
            whole(
                "from lessons import checks, claims, launch, report\n"
                "from lessons.bylesson import gpu"
            ),
            glue('cpu_run = "gpu_cpu"'),
            call('report.run("_trainup_gpu.py", "--device", "cpu", name=cpu_run)'),
        ],
        True,
    ),
    "03_data_parallel": (
        [
            whole("from trainup.parallel import dataparallel"),
            call(
                'cpu_run = report.run("_trainup_dp.py", name="dp_here_cpu", '
                'env={"CUDA_VISIBLE_DEVICES": ""})'
            ),
        ],
        True,
    ),
    "04_ddp": (
        [
            whole(
                "from lessons import checks, claims, launch, report\n"
                "from lessons.bylesson import ddp"
            ),
            glue("n = 2"),
            call(
                'launch.run("_trainup_ddp.py", "--device", "cpu", "--batch-size", 64, '
                'name=f"ddp_n{n}", nproc=n)'
            ),
        ],
        True,
    ),
    "04a1_inside_ddp": (
        [
            whole(
                "from lessons import checks, launch, report\n"
                "from lessons.bylesson import collectives"
            ),
            call('collectives.run("collectives", name="inside_collectives")'),
        ],
        True,
    ),
    # its first jobs remake lesson 04a1's runs where they are missing, as in a fresh clone
    "04a2_tuning_ddp": (
        [
            whole(
                "from lessons import checks, claims, launch, report\n"
                "from lessons.bylesson import collectives, ddp"
            ),
            call('collectives.run("ddp", name="inside_ddp")'),
        ],
        True,
    ),
    "04a3_nodes_and_faults": (
        [
            whole(
                "from lessons import checks, launch\nfrom lessons.bylesson import collectives, ddp"
            ),
            call(
                'launch.two_nodes("_trainup_ddp.py", "--device", "cpu", '
                'name="ddp_2nodes_static", rendezvous="static")'
            ),
        ],
        True,
    ),
    # no SLURM in the copy, as on Colab: the cell asks tools/local_slurm.sh and says so
    "04b_slurm": (
        [
            whole("from lessons import checks, report\nfrom lessons.bylesson import slurm"),
            whole("slurm.for_notebook()"),
        ],
        False,
    ),
    # Horovod's probe, a fresh interpreter importing horovod.torch: what Colab, without it, runs
    "05_horovod": ([whole("HOROVOD, about = horovod.available()")], False),
    "05b_inside_horovod": ([whole("HOROVOD, about = horovod.available()")], False),
    "06_pipeline_parallel": (
        [
            whole(
                "from lessons import checks, launch, report\nfrom lessons.bylesson import schedules"
            ),
            call(
                'schedules.run("_trainup_pipeline_manual.py", "--steps", 20, '
                '*SIZE, name="pp_manual")'
            ),
        ],
        True,
    ),
    # its first job remakes lesson 06's runs where they are missing, as in a fresh clone: two of
    # its schedules here (a job of one schedule names its run without the schedule)
    "06b_pipeline_schedules": (
        [
            whole("from lessons import checks, report\nfrom lessons.bylesson import schedules"),
            glue('SCHEDULES = ["gpipe", "1f1b"]'),
            call(
                'schedules.run("_trainup_pipeline.py", "--microbatches", 4, *SIZE, *checks.PROOF, '
                'name="pp",\n                  schedules=SCHEDULES)'
            ),
        ],
        True,
    ),
    # its first job remakes lesson 06's one-process run where it is missing, as in a fresh clone
    "06c_bubble_and_memory": (
        [
            whole("from lessons import checks, report\nfrom lessons.bylesson import schedules"),
            call(
                'report.run("_trainup_pipeline.py", "--stages", 1, *SIZE, *checks.PROOF, '
                'name="pp_one")'
            ),
        ],
        True,
    ),
    "07_lightning": (
        [
            whole(
                "from lessons import checks, claims, launch, report\n"
                "from lessons.bylesson import lightning"
            ),
            call(
                'launch.run("_trainup_fabric.py", "--accelerator", "cpu", *COMMON, '
                'name="l_fabric", nproc=2)'
            ),
        ],
        True,
    ),
    # its first cell of jobs remakes lesson 07's runs where they are missing, as in a fresh clone
    "07b_lightning_launch_and_log": (
        [
            whole(
                "from lessons import checks, launch, report\n"
                "from lessons.bylesson import lightning, slurm"
            ),
            call(
                'report.run("_trainup_gpu.py", "--device", "cpu", "--threads", 1, *COMMON,\n'
                '                           "--no-progress", name="l_one")'
            ),
        ],
        True,
    ),
    "07c_lightning_options": (
        [
            whole(
                "from lessons import checks, launch, report\nfrom lessons.bylesson import lightning"
            ),
            call(
                'report.run("_trainup_gpu.py", "--device", "cpu", "--threads", 1, *COMMON, '
                '"--no-progress",\n               name="l_one")'
            ),
        ],
        True,
    ),
    "08_monitoring_and_profiling": (
        [
            whole(
                "from lessons import checks, claims, launch, report\n"
                "from lessons.bylesson import traces"
            ),
            call('report.run("_trainup_cpu.py", "--profile", STEPS, name="prof_cpu")'),
        ],
        True,
    ),
    "08a_profiling_ddp": (
        [
            whole("from lessons import checks, launch\nfrom lessons.bylesson import traces"),
            call('launch.run("_trainup_ddp.py", "--profile", STEPS, name="prof_ddp", nproc=2)'),
        ],
        True,
    ),
    # its first cell of jobs remakes lessons 08 and 08a's runs where the copy lacks them (as on
    # Colab) with their calls, whose helper and script lessons 01 and 04 start (first_job); then
    # its own first job
    "08b_tensorboard": (
        [
            whole(
                "from lessons import checks, launch, report\nfrom lessons.bylesson import traces"
            ),
            call('report.run("_trainup_lightning.py", "--monitor", name="pl_monitor")'),
        ],
        True,
    ),
    "09_sharding": (
        [
            whole(
                "from lessons import checks, claims, launch\n"
                "from lessons.bylesson import zero_stages as lesson"
            ),
            glue("n = 1"),
            call('lesson.run(n, f"fsdp_n{n}")'),
        ],
        True,
    ),
    # its first job remakes lesson 09's runs where they are missing, as in a fresh clone
    "09a1_sharding_costs": (
        [
            whole("from lessons import checks\nfrom lessons.bylesson import zero_stages as lesson"),
            glue("n = 2"),
            call('lesson.made_here(n, f"fsdp_n{n}")'),
        ],
        True,
    ),
    # its own first job: lesson 09's runs it reads may be in the copy already (09's test made them)
    "09a2_fsdp_at_scale": (
        [
            whole("from lessons import checks\nfrom lessons.bylesson import zero_stages as lesson"),
            call('lesson.run(2, "fsdp_save2", modes=("parameters",), epochs=1)'),
        ],
        True,
    ),
    # no job: the layer is measured in the notebook's own process
    "09b_activations": (
        [
            whole("from lessons import checks, claims\nfrom lessons.bylesson import activations"),
            whole("diffs = activations.largest_gradient_difference()"),
        ],
        False,
    ),
    "09c_tensor_parallel": (
        [
            whole(
                "from lessons import checks, claims, launch, report\n"
                "from lessons.bylesson import tp_runs"
            ),
            call('report.run("_trainup_tp.py", "--threads", 1, *TP_SIZE, name="tp_one")'),
        ],
        True,
    ),
    # its first job, the one-process baseline, after the sizes its cell gives it
    "09ca_tp_attention": (
        [
            whole("from lessons import checks, launch, report"),
            call(
                'TPA_SIZE = [*(["--blocks", 2, "--width", 16, "--hidden", 32, "--heads", 4]'
                ' if report.QUICK\n              else ["--blocks", 2, "--width", 64, '
                '"--hidden", 256, "--heads", 4]), *checks.PROOF]'
            ),
            call('report.run("_trainup_tp_sp.py", "--threads", 1, *TPA_SIZE, name="tpa_one")'),
        ],
        True,
    ),
    # the first of the five jobs sr.ensure_pair() starts (sr.PAIR[0]): lesson 02's helper and script
    "10_scaling_report": (
        [
            whole("from lessons.bylesson import scaling_report as sr"),
            glue('report.run("_trainup_gpu.py", *sr.PAIR_FLAGS, name="report_one")'),
        ],
        True,
    ),
    # the same: it makes lesson 10's pair where the copy lacks it, as in a fresh clone
    "10a_same_model": (
        [
            whole("from lessons.bylesson import scaling_report as sr"),
            glue('report.run("_trainup_gpu.py", *sr.PAIR_FLAGS, name="report_one")'),
        ],
        True,
    ),
    "11_predict_the_cluster": (
        [
            whole("from lessons import checks, hardware\nfrom lessons.bylesson import collectives"),
            call('collectives.run("bandwidth", name="predict_bandwidth")'),
        ],
        True,
    ),
    # arithmetic over published runs: the published times read from the copy, no job
    "11a1_published_runs": (
        [
            whole(
                "from lessons import checks, hardware\n"
                "from lessons.bylesson import predict, predict_plots, slurm"
            ),
            whole("runs = slurm.published_times()"),
        ],
        False,
    ),
    # the planner's arithmetic, and a checkpoint written where the copy's lessons put them
    "11a2_planner": (
        [
            whole(
                "from lessons import checks, hardware, report\nfrom lessons.bylesson import predict"
            ),
            whole(
                'c = predict.checkpoint_seconds(facts["resnet50"]["params"], report.CHECKPOINT_DIR)'
            ),
        ],
        False,
    ),
    "09d_context_parallel": (
        [
            whole("from lessons import checks, launch, report"),
            call('report.run("_trainup_cp.py", "--threads", 1, *CP_SIZE, name="cp_one")'),
        ],
        True,
    ),
    # the simulation runs in the notebook's process: a small one starts no job
    "11b_simulated_world": (
        [
            whole(
                "from lessons import checks\n"
                "from lessons.bylesson import planner, simulated_world as sw"
            ),
            glue("sw.simulate(planner.Transformer(2, 64, 4, 16), 8)"),
        ],
        False,
    ),
    "09e_experts": (
        [
            whole("from lessons import checks, launch, report"),
            call(
                'report.run("_trainup_experts.py", "--threads", 1, *MOE, *NO_DROPS, '
                '*checks.PROOF, name="moe_one")'
            ),
        ],
        True,
    ),
    "09f_compile": (
        [
            whole("from lessons import checks, launch, report"),
            call('launch.run("_trainup_compile.py", *SAME, *CAP, name="compile_eager", nproc=2)'),
        ],
        True,
    ),
    "09g_four_dimensions": (
        [
            whole("from lessons import checks, launch, report"),
            call('report.run("_trainup_4d.py", "--threads", 1, *FOURD_SIZE, name="fourd_one")'),
        ],
        True,
    ),
    # a short run in the notebook's process: the course's model and data, imported from the copy
    "09h_float8": (
        [
            whole("from lessons.bylesson import float8"),
            whole("f8_weight, f8_input, f8_grads = float8.short_run(steps=12)"),
        ],
        False,
    ),
}


def pieces_of(notebook, wanted):
    """The code each piece stands for, checked against the notebook's cells."""
    pieces = []
    for kind, text in wanted:
        if kind == "cell":
            pieces.append(cell(notebook, text))
        elif kind == "call":
            holding = [source for _, source in code_cells(notebook) if text in source]
            assert len(holding) == 1, f"{notebook}: {len(holding)} code cells hold {text!r}"
            pieces.append(text)
        else:
            pieces.append(text)
    return pieces


def first_job(notebook):
    """What starts the lesson's first job, where a call of the notebook's starts it: the helper
    called (its module's name where the lesson's imports rename it) and the first script the call
    names (None: the helper's own). Two lessons with the same start the same command but for its
    flags and run names: the job's processes import the same way. None where a whole cell starts
    it."""
    wanted, starts_a_job = LESSONS[notebook]
    kind, text = wanted[-1]
    if not starts_a_job or kind == "cell":
        return None
    helper = re.match(r"(?:\w+ = )?([\w.]+)\(", text).group(1)  # `cpu_run = report.run(`
    renamed = dict(re.findall(r"(\w+) as (\w+)", pieces_of(notebook, wanted[:1])[0]))
    module, _, function = helper.rpartition(".")
    helper = f"{({v: k for k, v in renamed.items()}).get(module, module)}.{function}"
    scripts = re.findall(r"[\"'](\w+\.py)[\"']", text)
    return helper, scripts[0] if scripts else None


def proven_by(notebook):
    """The lesson whose test starts this lesson's first job: the first, in the tests' order, of
    those that start it the same way (first_job); None where the lesson starts no job."""
    key = first_job(notebook)
    if key is None:
        return notebook if LESSONS[notebook][1] else None
    return next(other for other in sorted(LESSONS) if first_job(other) == key)


def planned(notebook):
    """(the pieces the lesson's test runs, whether they start a job): a first job started in
    another lesson's test is left out; its set-up cell and imports still run."""
    wanted, starts_a_job = LESSONS[notebook]
    if starts_a_job and proven_by(notebook) != notebook:
        return pieces_of(notebook, wanted[:-1]), False
    return pieces_of(notebook, wanted), starts_a_job


def test_every_lesson_is_listed_once():
    listed = set(LESSONS) | {"04c_elastic"}
    assert listed == {p.stem for p in NOTEBOOKS.glob("[0-9]*.ipynb")}


def test_a_first_job_started_once_stands_for_lessons_that_start_it_the_same_way():
    """A lesson whose first job is left out names another lesson that starts it with the same
    helper and script; none is left out that only looks alike (another helper, or script)."""
    for notebook in LESSONS:
        prover = proven_by(notebook)
        if prover not in (None, notebook):
            assert LESSONS[prover][1] and first_job(prover) == first_job(notebook), notebook
            assert planned(prover)[1] and not planned(notebook)[1], notebook
    assert first_job("07b_lightning_launch_and_log") == ("report.run", "_trainup_gpu.py")
    assert proven_by("07c_lightning_options") == "02_single_gpu"  # `cpu_run = report.run(` there
    assert proven_by("11_predict_the_cluster") == "04a1_inside_ddp"
    assert first_job("09a2_fsdp_at_scale") == ("zero_stages.run", None)  # `as lesson` read back
    assert proven_by("09a2_fsdp_at_scale") == "09_sharding"
    assert proven_by("06c_bubble_and_memory") == "06c_bubble_and_memory"  # python, not torchrun
    assert proven_by("04a3_nodes_and_faults") == "04a3_nodes_and_faults"  # two launchers
    # lesson 10's glue names the run and script that ensure_pair() starts first
    from lessons.bylesson import scaling_report as sr

    assert sr.PAIR[0][:2] == ("report_one", "_trainup_gpu.py") and not sr.PAIR[0][3]
    assert proven_by("10a_same_model") == proven_by("10_scaling_report") == "02_single_gpu"


@pytest.mark.parametrize("notebook", sorted(LESSONS))
def test_each_lesson_starts_its_first_job_from_a_clone_as_on_colab(clone, tmp_path, notebook):
    pieces, starts_a_job = planned(notebook)
    results, stderr = run_lessons(clone, tmp_path, {notebook: pieces})
    assert_only_the_copy(clone, results[notebook], stderr, starts_a_job)
