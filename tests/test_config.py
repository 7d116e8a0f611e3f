"""trainup/config.py: the one typed configuration cli.parse builds, checked once, frozen after
parse; replace() makes a new one, checked again; it pickles (Ray sends it to its workers). Each
refusal is one sentence and exit status 2 through the real script."""

import copy
import dataclasses
import pickle

import pytest

from conftest import assert_clean_error, finish_job, start_script
from trainup import cli, config


def _parse(*flags, concerns=("loading", "sweep", "group")):
    p = cli.parser("a test", lesson="cpu")
    for concern in concerns:
        getattr(cli, f"add_{concern}")(p)
    p.add_argument("--shown", default="a,b", help="a lesson's own flag")
    return cli.parse(p, [*flags, "--log-dir", "logs"])


@pytest.mark.fast
def test_each_concern_is_a_typed_section_read_flat():
    args = _parse("--quick", "--sweep", "32,64", "--image-shape", "3x8x8", "--workers", "2")
    assert isinstance(args, config.Config)
    kinds = {
        "training": config.Training,
        "data": config.Data,
        "output": config.Output,
        "loading": config.Loading,
        "sweep": config.Sweep,
        "group": config.Group,
        "lesson": config.Lesson,
    }
    for name, kind in kinds.items():
        assert type(args.section(name)) is kind
    assert args.batch_size == args.section("training").batch_size == 64
    assert args.image_shape == (3, 8, 8) and args.sweep == (32, 64) and args.workers == 2
    assert (args.train_size, args.test_size, args.epochs) == (512, 256, 2)  # --quick's, in parse
    assert args.shown == "a,b" and args.show_progress and args.run_name_default
    assert args.run_name.startswith("cpu_")
    assert not hasattr(args, "resident_not_a_flag")
    # a concern the script did not add is not there: getattr's default answers
    assert getattr(_parse(concerns=()), "workers", "absent") == "absent"


@pytest.mark.fast
def test_a_value_of_the_wrong_type_is_refused():
    args = _parse()
    with pytest.raises(config.ConfigError, match=r"^--workers must be of type .*got '2'$"):
        args.replace(workers="2")
    with pytest.raises(config.ConfigError, match=r"^--image-shape must be of type"):
        args.replace(image_shape=[1, 28, 28])
    with pytest.raises(config.ConfigError, match=r"^--resume must be of type bool"):
        args.replace(resume=1)
    assert args.replace(timeout=5).timeout == 5  # an int is a number of seconds too


@pytest.mark.fast
def test_the_configuration_is_frozen():
    args = _parse()
    for name in args.as_dict():
        with pytest.raises(dataclasses.FrozenInstanceError, match="args.replace"):
            setattr(args, name, getattr(args, name))
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.brand_new = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        del args.epochs
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.section("training").epochs = 3  # each section is a frozen dataclass too


@pytest.mark.fast
def test_replace_makes_a_new_configuration_and_checks_it_again():
    args = _parse("--resident")
    changed = args.replace(workers=4, shown="c", resume=True)
    assert (changed.workers, changed.shown, changed.resume) == (4, "c", True)
    assert (args.workers, args.shown, args.resume) == (None, "a,b", False)  # left as it was
    refusals = {
        "--workers must be 0 or more, got -1": dict(workers=-1),
        "--batch-size must be a finite number greater than 0, got 0": dict(batch_size=0),
        "--lr must be a finite number greater than 0, got nan": dict(lr=float("nan")),
        "--dropout must be in [0, 1), got 1.0": dict(dropout=1.0),
        "--seed must be from 0 to 2147483647, got -1": dict(seed=-1),
        "--run-name must be a plain file name": dict(run_name="../x"),
        "--sweep takes batch sizes like 32,64,128, got '0'": dict(sweep=(0,)),
        "--resident needs a data set held in memory": dict(dataset="synthetic"),  # across two
        "the configuration has no --no-such-flag to change": dict(no_such_flag=1),
    }
    for words, changes in refusals.items():
        with pytest.raises(config.ConfigError) as refused:
            args.replace(**changes)
        assert str(refused.value).startswith(words), (changes, str(refused.value))
        assert isinstance(refused.value, cli.UserError)  # main_guard: one sentence, exit 2


@pytest.mark.fast
def test_the_configuration_pickles_and_copies():
    args = _parse("--sweep", "8,16").replace(shown=("x", "y"))
    for again in (pickle.loads(pickle.dumps(args)), copy.deepcopy(args), copy.copy(args)):
        assert again == args and again.as_dict() == args.as_dict()
        assert again.sweep == (8, 16) and again.shown == ("x", "y")
        with pytest.raises(dataclasses.FrozenInstanceError):
            again.epochs = 1


@pytest.mark.fast
def test_a_namespace_is_replaced_by_a_new_one():
    """Tests and notebooks hand trainup namespaces of their own: config.replaced leaves them as
    they were too."""
    from types import SimpleNamespace

    ns = SimpleNamespace(run_name="a", resume=False)
    new = config.replaced(ns, resume=True)
    assert (ns.resume, new.resume, new.run_name) == (False, True, "a")
    assert config.as_dict(new) == {"run_name": "a", "resume": True}


# Each check of trainup/config.py, refused by the real script in a fresh interpreter
REFUSED = [
    ("_trainup_cpu.py", ["--dropout", "1"], "--dropout must be in [0, 1), got 1.0"),
    ("_trainup_cpu.py", ["--image-shape", "1x28"], "--image-shape must look like 3x224x224"),
    ("_trainup_cpu.py", ["--image-shape", "1xax28"], "--image-shape must look like 3x224x224"),
    (
        "_trainup_cpu.py",
        ["--dataset", "synthetic", "--image-shape", "3x4x4"],
        "is too small for --model cnn",
    ),
    ("_trainup_cpu.py", ["--run-name", ".hidden"], "--run-name must be a plain file name"),
    ("_trainup_gpu.py", ["--workers", "-1"], "--workers must be 0 or more, got -1"),
    (
        "_trainup_gpu.py",
        ["--resident", "--dataset", "synthetic"],
        "--resident needs a data set held in memory",
    ),
    ("_trainup_gpu.py", ["--sweep", "32,x"], "--sweep takes batch sizes like 32,64,128"),
    ("_trainup_gpu.py", ["--sweep", "0,32"], "--sweep takes batch sizes like 32,64,128"),
    ("_trainup_blocks.py", ["--dataset", "synthetic"], "takes a data set held in memory"),
]


def test_every_check_refuses_in_one_sentence_with_exit_status_2(tmp_path):
    jobs = [start_script(script, *flags, log_dir=tmp_path / "logs") for script, flags, _ in REFUSED]
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    jobs.append(start_script("_trainup_cpu.py", log_dir=not_a_folder / "logs"))
    words = [w for *_, w in REFUSED] + ["cannot be created or written"]
    for job, (script, *_), w in zip(jobs, [*REFUSED, ("_trainup_cpu.py",)], words):
        proc = finish_job(job)
        assert proc.returncode == 2, (script, w, proc.stderr)
        assert_clean_error(proc, w)
    assert not (tmp_path / "logs").exists()  # refused before any work


@pytest.mark.fast
def test_every_script_that_sweeps_hands_over_a_declared_train_epoch():
    """sweeps.run calls train_epoch by the keywords sweeps.TrainEpoch declares: each script that
    sweeps has one that binds them, and one that does not is refused before any work."""
    import importlib

    from conftest import SCRIPTS
    from trainup import sweeps

    sweeping = [p.stem for p in SCRIPTS.glob("_trainup_*.py") if "sweeps.run(" in p.read_text()]
    assert len(sweeping) >= 6, sweeping
    for name in sweeping:
        sweeps.check_step(importlib.import_module(name).train_epoch)

    def positional(model, loader, optimizer, epoch, show_progress):
        pass

    with pytest.raises(TypeError, match="positional is no sweeps.TrainEpoch"):
        sweeps.check_step(positional)
