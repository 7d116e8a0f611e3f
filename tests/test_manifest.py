"""The manifest (lessons/manifest.py) names every script once, and what reads it agrees with it."""

import importlib.util
import json

from conftest import ROOT
from lessons import launch, manifest, placement

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
