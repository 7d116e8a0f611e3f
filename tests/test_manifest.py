"""The manifest (lessons/manifest.py) names every script once, and what reads it agrees with it:
adding a lesson is one entry there, and no other module keeps a list of the scripts."""

import ast
import importlib.util
import json
import re

from conftest import ROOT
from lessons import launch, manifest, placement
from lessons.bylesson import scaling_report
from test_breakages import BREAKAGES

SCRIPTS = sorted(p.name for p in (ROOT / "scripts").glob("_trainup_*.py"))


def test_every_script_has_one_entry_and_every_entry_a_script():
    assert sorted(manifest.SCRIPTS) == SCRIPTS
    assert len(manifest._ENTRIES) == len(manifest.SCRIPTS), "a script named twice"


def test_each_script_is_named_by_the_notebook_that_teaches_it():
    for name, entry in manifest.SCRIPTS.items():
        notebook = ROOT / "notebooks" / entry.notebook
        assert notebook.exists(), f"{name}: no {entry.notebook}"
        text = "".join("".join(c["source"]) for c in json.loads(notebook.read_text())["cells"])
        assert name in text, f"{entry.notebook} never names {name}"


def test_every_step_climbs_from_the_baseline_within_a_budget():
    for name, entry in manifest.SCRIPTS.items():
        seen = [name]
        while manifest.SCRIPTS[seen[-1]].parent:
            parent = manifest.SCRIPTS[seen[-1]].parent
            assert parent in manifest.SCRIPTS and parent not in seen, (name, seen, parent)
            seen.append(parent)
        assert seen[-1] == "_trainup_cpu.py" or entry.parent is None, seen
        assert (entry.parent is None) == (entry.budget is None), name
    assert set(launch.LADDER) == {
        (s.parent, s.name, s.budget) for s in manifest.SCRIPTS.values() if s.parent
    }


def script(name):
    """The script as a module (its main() not run): its parse_args reads the flags it takes."""
    spec = importlib.util.spec_from_file_location(name[:-3], ROOT / "scripts" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_script_placed_on_a_device_takes_the_flag_that_places_it_with_its_default():
    """placement.placed() sets a script's device flag: the script's own parser has it, and its
    default is the manifest's (where the default is cpu, a job that names none never uses a GPU)."""
    for name, entry in manifest.SCRIPTS.items():
        if not entry.device_flag:
            assert name not in placement.CHOOSES_DEVICE
            continue
        flag = entry.device_flag[0]
        args = script(name).parse_args([])
        assert getattr(args, flag[2:]) == entry.device_default, (name, flag)
        assert placement.FLAG[name] == entry.device_flag
    assert placement.DEFAULT == {
        "_trainup_blocks.py": "cpu",
        "_trainup_pipeline.py": "cpu",
        "_trainup_tp.py": "cpu",
    }


def test_the_check_finds_a_script_the_manifest_lacks(monkeypatch):
    missing = dict(manifest.SCRIPTS)
    missing.pop("_trainup_ray.py")
    monkeypatch.setattr(manifest, "SCRIPTS", missing)
    try:
        test_every_script_has_one_entry_and_every_entry_a_script()
    except AssertionError:
        return
    raise AssertionError("a script without an entry passed")


def scripts_named(conditions):
    """The scripts a strategy's conditions (where, baseline) or needs name."""
    if isinstance(conditions, tuple):  # needs: (("script", file), ("module", name), ...)
        return {v for k, v in conditions if k == "script"}
    value = (conditions or {}).get("script", ())
    return set(value if isinstance(value, tuple) else (value,))


def test_every_registry_reads_the_manifest_and_names_only_its_scripts():
    """The report's rows (lesson 10a's proof takes those with a baseline), the breakages and the
    placement: each names only the manifest's scripts, and each is what the manifest declares."""
    rows = manifest.strategies()
    assert scaling_report.STRATEGIES == rows and len(rows) > 40
    assert {r.name for r in rows} >= {"DDP, 2 ranks", "Lightning DDP", "expert parallel"}
    named = set().union(
        *(scripts_named(r.where) | scripts_named(r.baseline) | scripts_named(r.needs) for r in rows)
    )
    assert named <= set(manifest.SCRIPTS), sorted(named - set(manifest.SCRIPTS))
    for entry in manifest.SCRIPTS.values():  # an entry's rows are found by its script's runs
        for row in entry.strategies:
            assert entry.name in scripts_named(row.where) or not scripts_named(row.where)
    assert scaling_report.TRANSFORMERS == tuple(
        s.name for s in manifest.SCRIPTS.values() if s.transformer
    )
    patched = {name: f for name, (f, *_) in BREAKAGES.items() if f.startswith("_trainup_")}
    assert set(patched.values()) <= set(manifest.SCRIPTS), patched
    declared = {b: s.name for s in manifest.SCRIPTS.values() for b in s.breakages}
    assert declared == patched, (declared, patched)  # each breakage of a script is in its entry
    assert set(placement.FLAG) <= set(manifest.SCRIPTS)


SCRIPT_NAME = re.compile(r"^_trainup_\w+\.py$")


def _names(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} if SCRIPT_NAME.match(node.value) else set()
    if isinstance(node, ast.Tuple):
        return set().union(*map(_names, node.elts)) if node.elts else set()
    return set()


def registries(source):
    """Where a module lists scripts as a registry: [(line, names)] for a collection of two or
    more scripts' names (a tuple, list or set of them, a dict keyed by them), or a run's
    conditions that name its script (`script=...`, {"script": ...}). Prose (strings, docstrings)
    and commands (a job names its one script) are not registries."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):  # two names or more
            names = set().union(*(_names(e) for e in node.elts if isinstance(e, ast.Constant)))
            names = names if len(names) > 1 else set()
        elif isinstance(node, ast.Dict):  # keyed by two names or more, or a run's conditions
            keys = set().union(*(_names(k) for k in node.keys if k is not None))
            conditions = set().union(
                *(
                    _names(v)
                    for k, v in zip(node.keys, node.values)
                    if isinstance(k, ast.Constant) and k.value == "script"
                )
            )
            names = (keys if len(keys) > 1 else set()) | conditions
        elif isinstance(node, ast.keyword) and node.arg == "script":
            names = _names(node.value)
        else:
            continue
        if names:
            found.append(
                (node.lineno if hasattr(node, "lineno") else node.value.lineno, sorted(names))
            )
    return sorted(found)


def course_modules():
    """The course's code outside the scripts themselves: trainup, lessons, the tools."""
    return sorted(
        [
            *(ROOT / "scripts" / "trainup").rglob("*.py"),
            *(ROOT / "scripts" / "lessons").rglob("*.py"),
            *(ROOT / "tools").glob("*.py"),
        ]
    )


def test_no_module_but_the_manifest_lists_the_scripts():
    listing = {
        str(path.relative_to(ROOT)): found
        for path in course_modules()
        if path.name != "manifest.py" and (found := registries(path.read_text()))
    }
    assert not listing, f"lists of scripts outside lessons/manifest.py: {listing}"


def test_the_registry_check_finds_a_private_list_and_passes_prose_and_commands():
    private = """
DDP_SCRIPTS = ("_trainup_ddp.py", "_trainup_ddp_tuned.py")
ROW = Strategy("one device", "one device", dict(script="_trainup_gpu.py", devices=1))
WARM = {"_trainup_gpu.py": 2, "_trainup_cpu.py": 1}
BASE = {"script": "_trainup_tp.py", "devices": 1}
"""
    assert [line for line, _ in registries(private)] == [2, 3, 4, 5]
    prose_and_commands = '''
"""Runs _trainup_ddp.py and _trainup_gpu.py: ("_trainup_ddp.py", "_trainup_gpu.py")."""
launch.run("_trainup_ddp.py", name="ddp_n2", nproc=2)
PAIR = (("report_one", "_trainup_gpu.py", 1, ()), ("report_ddp_n2", "_trainup_ddp.py", 2, ()))
if script == "_trainup_dp.py" or script.startswith("_trainup_pipeline"):
    pass
'''
    assert registries(prose_and_commands) == []
