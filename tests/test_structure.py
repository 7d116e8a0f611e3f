"""The house's shape: three floors (scripts -> trainup -> nothing of the course; lessons, for notebooks and
tests, -> trainup), no import cycle inside a package, and module names that say which package they are
in (no name in both). Read from the source (ast), so it costs no import of torch."""

import ast
import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SCRIPTS


def module_of(path):
    """(package, module) of a file under scripts/: ('trainup', 'checkpoint'), ('trainup',
    'parallel.pipeline'), ('trainup', 'parallel') for a subpackage's __init__, ('trainup',
    '__init__') for the package's own."""
    parts = list(path.relative_to(SCRIPTS).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 2:
        parts = parts[:-1]
    return parts[0], ".".join(parts[1:])


def _exists(top, rest):
    folder = SCRIPTS / top / Path(*rest) if rest else SCRIPTS / top
    return bool(rest) and (folder.with_suffix(".py").exists() or (folder / "__init__.py").exists())


def _imports(path, package):
    """The course's modules that path imports: ('trainup', 'checkpoint'), ('lessons', 'report'),
    ('trainup', 'parallel.pipeline'), ... (package: path's own, None for a script)."""
    out = set()
    here = list(path.relative_to(SCRIPTS).with_suffix("").parts[:-1]) if package else []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1] + (node.module or "").split(".")
            else:
                base = (node.module or "").split(".")
            base = [b for b in base if b]
            if not base or base[0] not in ("trainup", "lessons"):
                continue
            for a in node.names:
                rest = base[1:] + [a.name]
                out.add((base[0], ".".join(rest if _exists(base[0], rest) else base[1:])))
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] in ("trainup", "lessons"):
                    out.add((parts[0], ".".join(parts[1:])))
    return {(p, m or "__init__") for p, m in out if not m or _exists(p, m.split("."))}


def graph():
    return {
        module_of(path): _imports(path, package)
        for package in ("trainup", "lessons")
        for path in sorted((SCRIPTS / package).rglob("*.py"))
    }


def cycle(edges):
    """One import cycle as a list of modules, or None."""
    state = {}

    def visit(node, trail):
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if nxt == node:
                continue
            if state.get(nxt) == "open":
                return trail[trail.index(nxt) :] + [nxt] if nxt in trail else [node, nxt]
            if nxt not in state:
                found = visit(nxt, trail + [nxt])
                if found:
                    return found
        state[node] = "done"
        return None

    for start in sorted(edges):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return None


def test_no_import_cycle_inside_a_package():
    g = graph()
    for package in ("trainup", "lessons"):
        inside = {
            m: {n for n in deps if n[0] == package and n[1] != "__init__"}
            for m, deps in g.items()
            if m[0] == package
        }
        assert cycle(inside) is None, f"an import cycle in {package}/: {cycle(inside)}"


def test_the_floors_trainup_needs_nothing_above_it_and_scripts_only_trainup():
    for (package, module), deps in graph().items():
        if package == "trainup":
            assert not [d for d in deps if d[0] == "lessons"], (
                f"trainup/{module}.py imports lessons: {deps}"
            )
    for script in sorted(SCRIPTS.glob("_trainup_*.py")):
        above = [d for d in _imports(script, None) if d[0] == "lessons"]
        assert not above, f"{script.name} imports the notebooks' lessons package: {above}"


# trainup's rooms: the plumbing every script shares at its top level, above it the parallelisms'
# mechanisms (parallel/) and the engines beside torch.distributed (engines/), apart from each other.
ROOMS = ("parallel", "engines")


def crossings(edges):
    """trainup's imports that break its floors: plumbing importing a room, or one room another."""

    def room(module):
        head = module.split(".")[0]
        return head if head in ROOMS else ""

    return sorted(
        (m, d)
        for (p, m), deps in edges.items()
        if p == "trainup"
        for q, d in deps
        if q == "trainup" and room(d) and room(d) != room(m)
    )


def test_trainup_plumbing_needs_no_parallelism_or_engine_and_those_not_each_other():
    g = graph()
    assert ("trainup", "parallel.pipeline") in g and ("trainup", "engines.ray_run") in g
    assert ("trainup", "parallel.pipeline") in g[("trainup", "parallel.pipeline_runs")]
    assert not crossings(g), f"imports across trainup's floors: {crossings(g)}"


def test_the_floor_check_finds_a_crossing():
    edges = {
        ("trainup", "metrics"): {("trainup", "parallel.sharding")},
        ("trainup", "engines.ray_run"): {("trainup", "parallel.pipeline"), ("trainup", "cli")},
        ("trainup", "parallel.four_d"): {("trainup", "parallel.tensor_parallel")},
    }
    assert crossings(edges) == [
        ("engines.ray_run", "parallel.pipeline"),
        ("metrics", "parallel.sharding"),
    ]


# The notebooks' toolkit is lessons/ itself: modules any lesson may use (running jobs, reading logs,
# checks, the manifest, the hardware tables and the cost formulas); lessons/bylesson/ holds one
# lesson's helpers each.
OWN = "bylesson"


def first_lesson_of_each_module():
    """{lessons/bylesson/ module: the first notebook (in course order) that imports it}: the lesson
    it belongs to."""
    import json

    owner = {}
    for path in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")):
        text = "\n".join(
            "".join(c["source"])
            for c in json.loads(path.read_text())["cells"]
            if c["cell_type"] == "code"
        )
        for line in re.findall(rf"^\s*from lessons\.{OWN} import ([^\n(]+)", text, re.M):
            for name in re.findall(r"(\w+)(?:\s+as\s+\w+)?", line.split("#")[0]):
                owner.setdefault(name, path.stem)
    modules = {p.stem for p in (SCRIPTS / "lessons" / OWN).glob("*.py")} - {"__init__"}
    return {m: o for m, o in owner.items() if m in modules}


def later_lesson_imports(edges, owner):
    """Imports of a module that belongs to a later lesson than the importer's: [(importer, imported)]."""
    return [
        (m, d)
        for m, deps in edges.items()
        for d in deps
        if m in owner and d in owner and owner[d] > owner[m]
    ]


def toolkit_imports_of_helpers(edges):
    """Imports of a lesson's own helper by a toolkit module: [(importer, imported)]."""
    return sorted(
        (m, d)
        for m, deps in edges.items()
        if not m.startswith(f"{OWN}.")
        for d in deps
        if d.startswith(f"{OWN}.")
    )


def lessons_edges():
    return {
        m: {d for p, d in deps if p == "lessons"}
        for (p, m), deps in graph().items()
        if p == "lessons"
    }


def test_every_lessons_own_helper_belongs_to_a_lesson_that_imports_it():
    """A module in lessons/bylesson/ is some notebook's; one no notebook imports is the toolkit's
    or no one's."""
    helpers = {p.stem for p in (SCRIPTS / "lessons" / OWN).glob("*.py")} - {"__init__"}
    assert "scaling_report" in helpers and "checks" not in helpers
    assert sorted(helpers - set(first_lesson_of_each_module())) == []


def test_the_toolkit_imports_no_lessons_own_helper():
    """The toolkit (lessons/) stands under every lesson: it imports none of their helpers, so a
    helper's lesson can change without moving the toolkit under another lesson."""
    edges = lessons_edges()
    assert ("perfmodel" in edges) and ("bylesson.schedules" in edges)
    assert not toolkit_imports_of_helpers(edges), toolkit_imports_of_helpers(edges)


def test_the_toolkit_check_finds_a_helper_imported():
    edges = {"perfmodel": {"bylesson.schedules", "report"}, "bylesson.ddp": {"bylesson.gpu"}}
    assert toolkit_imports_of_helpers(edges) == [("perfmodel", "bylesson.schedules")]


def test_no_lessons_module_imports_a_later_lessons_module_or_a_script():
    """A learner reads the lessons in order: lesson 10's helpers may use lesson 04's, never 11's;
    and the notebooks' helpers (the toolkit's and each lesson's) never load a script (the notebook
    runs or imports it, in view)."""
    edges = {
        m.removeprefix(f"{OWN}."): {d.removeprefix(f"{OWN}.") for d in deps if d.startswith(OWN)}
        for m, deps in lessons_edges().items()
        if m.startswith(f"{OWN}.")
    }
    owner = first_lesson_of_each_module()
    assert owner["scaling_report"] == "10_scaling_report" and "bylesson" not in owner
    assert not later_lesson_imports(edges, owner), later_lesson_imports(edges, owner)
    loading = [
        str(p.relative_to(SCRIPTS))
        for p in sorted((SCRIPTS / "lessons").rglob("*.py"))
        if re.search(r"import _trainup|spec_from_file_location\(\s*[\"']_trainup", p.read_text())
    ]
    assert not loading, f"lessons/ modules that load a script: {loading}"


def test_the_lesson_order_check_finds_a_later_import():
    owner = {"scaling_report": "10_scaling_report", "predict_here": "11_predict_the_cluster"}
    assert later_lesson_imports({"scaling_report": {"predict_here"}}, owner) == [
        ("scaling_report", "predict_here")
    ]
    assert later_lesson_imports({"predict_here": {"scaling_report"}}, owner) == []


def test_the_check_finds_a_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_module_names_say_their_package():
    names = {
        p: {f.stem for f in (SCRIPTS / p).rglob("*.py")} - {"__init__"}
        for p in ("trainup", "lessons")
    }
    assert not names["trainup"] & names["lessons"], (
        f"in both trainup/ and lessons/: {sorted(names['trainup'] & names['lessons'])}"
    )


def test_one_local_slurm_fixture_for_every_module():
    from conftest import ROOT

    defining = [
        f.name
        for f in sorted((ROOT / "tests").glob("*.py"))
        if "def local_slurm" + "(" in f.read_text()
    ]
    assert defining == ["conftest.py"], defining


def test_the_notebooks_run_as_three_ordered_work_units_and_each_test_file_as_its_own():
    """Under pytest-xdist: the notebooks keep run_course.sh's order in three units (lesson 10 waits
    for the others: tests/test_shared_runs.py); test files (those that start a SLURM too) spread
    out."""
    from suite_plugin import serial_group

    names = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9]*.ipynb"))
    units = [serial_group(f"notebooks/{n}::Cell 0") for n in names]
    assert len(set(units)) == 3 and units == sorted(units, key=units.index)  # each unit in one run
    assert units[0] == serial_group("notebooks/04_ddp.ipynb::Cell 2")
    slurm_test = "tests/test_slurm.py::test_cpu_template_completes_through_sbatch[a-1-2]"
    assert serial_group(slurm_test) == "tests/test_slurm.py"
    ddp, horovod = "tests/test_ddp.py::test_x", "tests/test_horovod.py::test_x"
    assert serial_group(ddp) != serial_group(horovod)


def test_a_notebook_tested_alone_gets_the_suites_units_and_kernels():
    """`bash run_tests.sh notebooks/04_ddp.ipynb` collects no test file, so tests/conftest.py is
    not loaded: the root conftest.py loads the suite's plugin (work units, nbval's kernels)
    anyway, or xdist would hand one notebook's cells to several workers, a kernel each."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "--trace-config",
            "-p",
            "no:cacheprovider",
            "notebooks/00_environment.ipynb",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    registered = [line for line in out.stdout.splitlines() if line.startswith("PLUGIN registered")]
    assert any("suite_plugin" in line for line in registered), registered
    assert not any("tests/conftest.py" in line for line in registered)  # the case this guards


def test_each_step_of_the_ladder_stays_within_its_budget():
    from lessons import launch

    over = {
        f"{a} -> {b}": (launch.changed_lines(a, b), budget)
        for a, b, budget in launch.LADDER
        if launch.changed_lines(a, b) > budget
    }
    assert not over, f"diffs above their budget (changed lines, budget): {over}"
    assert launch.changed_lines("_trainup_gpu.py", "_trainup_gpu.py") == 0


def test_each_lesson_notebook_prints_its_scripts_diff():
    """The lesson's notebook prints the diff of its script against its parent (launch.lesson_diff)."""
    import json
    from conftest import ROOT
    from lessons import launch

    shown = set()
    for path in (ROOT / "notebooks").glob("*.ipynb"):
        for cell in json.loads(path.read_text())["cells"]:
            text = "".join(cell["source"])
            if cell["cell_type"] == "code" and "launch.lesson_diff(" in text:
                shown.update(s for _, s, _ in launch.LADDER if f'lesson_diff("{s}")' in text)
    assert shown == {s for _, s, _ in launch.LADDER}, sorted(
        {s for _, s, _ in launch.LADDER} - shown
    )


def test_notebooks_and_solutions_import_the_installed_course_without_editing_sys_path():
    """pyproject.toml makes trainup and lessons a package that tools/setup_env.sh installs (pip install -e
    .): no notebook or solution reaches into sys.path (the Colab set-up cell alone adds the clone's tools/)."""
    import json

    edits = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell.get("id") != "colab-setup" and "sys.path" in "".join(cell["source"]):
                edits.append(path.name)
    edits += [
        p.name
        for p in (ROOT / "notebooks" / "solutions").glob("*.py")
        if "sys.path" in p.read_text()
    ]
    assert not edits, edits
    text = (ROOT / "pyproject.toml").read_text()
    import tomllib

    setuptools = tomllib.loads(text)["tool"]["setuptools"]
    folders = sorted(
        ".".join(init.parent.relative_to(SCRIPTS).parts)
        for init in SCRIPTS.rglob("__init__.py")
        if "__pycache__" not in init.parts
    )
    assert setuptools["package-dir"] == {"": "scripts"} and "trainup.parallel" in folders
    assert sorted(setuptools["packages"]) == folders  # a subpackage left out: not installed
    assert "--editable ." in (ROOT / "tools" / "setup_env.sh").read_text()


def test_the_test_command_lets_waiting_openmp_threads_sleep():
    """run_tests.sh runs two workers on the cores: spinning OpenMP threads would burn the CPU that
    the other worker's jobs need (the learner's own runs keep libgomp's default)."""
    text = (ROOT / "run_tests.sh").read_text()
    assert "export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}" in text
    assert "OMP_WAIT_POLICY" not in (ROOT / "run_course.sh").read_text()


MMAPPED_BLOCKS = r"""
import ctypes
libc = ctypes.CDLL(None)
class Info(ctypes.Structure):  # glibc's struct mallinfo2: hblks is the count of mmapped blocks
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                               "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
block = bytearray(64 * 2**20)  # a float64 step's size: 64 MB
print(libc.mallinfo2().hblks)
"""


def test_the_test_command_keeps_freed_blocks_for_reuse():
    """run_tests.sh's MALLOC_* settings reach glibc: a 64 MB block comes from the heap, which keeps
    it when freed, instead of a mapping the kernel zeroes again every step (the learner's own runs
    keep glibc's default)."""
    if not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("not glibc 2.33 or later: its malloc settings do not apply")
    text = (ROOT / "run_tests.sh").read_text()
    found = dict(re.findall(r"export (MALLOC_\w+)=\$\{\1:-(\d+)\}", text))
    assert sorted(found) == ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"], found
    assert "MALLOC_" not in (ROOT / "run_course.sh").read_text()

    def mapped(env):
        clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        return int(
            subprocess.run(
                [sys.executable, "-c", MMAPPED_BLOCKS],
                env={**clean, **env},
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )

    assert mapped({}) >= 1  # glibc's default: a block this large is mapped, and unmapped on free
    assert mapped(found) == 0


def config_mutations(source):
    """The lines of source that change a run's configuration in place: an assignment to an
    attribute of `args` (or `run`, one of a job's runs), or setattr/vars() on it. A value chosen at
    run time is a new configuration: args = args.replace(...) (trainup/config.py)."""
    found = []

    def is_config(node):
        return isinstance(node, ast.Name) and node.id in ("args", "run")

    for node in ast.walk(ast.parse(source)):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        while any(isinstance(t, (ast.Tuple, ast.List, ast.Starred)) for t in targets):
            targets = [
                e
                for t in targets
                for e in (
                    t.elts if isinstance(t, (ast.Tuple, ast.List)) else [getattr(t, "value", t)]
                )
            ]
        for t in targets:
            if isinstance(t, ast.Attribute) and is_config(t.value):
                found.append(node.lineno)
            call = t.value if isinstance(t, ast.Subscript) else None
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "vars":
                if call.args and is_config(call.args[0]):
                    found.append(node.lineno)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("setattr", "delattr"):
            if node.args and is_config(node.args[0]):
                found.append(node.lineno)
    return sorted(set(found))


def test_no_script_or_trainup_module_changes_its_configuration_in_place():
    """cli.parse's Config is frozen; a script that changed it in place would fail only when that
    line runs (a GPU's worker count, a torchrun restart): this finds such a line in the source."""
    paths = [*SCRIPTS.glob("_trainup_*.py"), *(SCRIPTS / "trainup").rglob("*.py")]
    found = {
        str(p.relative_to(SCRIPTS)): lines
        for p in paths
        if (lines := config_mutations(p.read_text()))
    }
    assert not found, f"in-place changes of args (use args = args.replace(...)): {found}"


def test_the_in_place_check_finds_each_kind_of_change():
    assert config_mutations("args.workers = 2\n") == [1]
    assert config_mutations("x = 1\nargs.epochs += 1\n") == [2]
    assert config_mutations("setattr(args, 'resume', True)\n") == [1]
    assert config_mutations("vars(run)['shard'] = 'x'\n") == [1]
    assert config_mutations("a, args.x = 1, 2\n") == [1]
    assert config_mutations("a, *args.x = 1, 2\n") == [1]
    assert config_mutations("kept[args.run_name] = args\n") == []
    assert config_mutations("args = args.replace(workers=2)\nprint(args.workers)\n") == []
