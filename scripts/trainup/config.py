"""One typed configuration per run: the flags of cli.parser and of each concern a script adds
(cli.add_loading, add_blocks, add_sweep, add_group), a frozen dataclass per concern, checked here
and nowhere else, and the script's own lesson flags. cli.parse builds it once; it reads flat
(`args.batch_size`) and refuses assignment: a value chosen at run time is a new configuration.

    args = cli.parse(p)                              # checked, derived values filled in, frozen
    args.batch_size, args.section("training").batch_size   # the same value
    args = args.replace(workers=2)                   # a new configuration, checked again
"""
import dataclasses
from dataclasses import dataclass
import math
from pathlib import Path
import tempfile
import os
import types
import typing

from . import UserError, runlock

QUICK = dict(train_size=512, test_size=256, epochs=2)  # --quick: seconds on a laptop
# numpy and Lightning take 32-bit seeds, and some scripts add the epoch to the seed: room is left
SEED_MAX = 2**31 - 1
# The CNN's two 3x3 convolutions and its 2x2 pooling need images of this many pixels a side
CNN_MIN_SIDE = 6


class ConfigError(UserError):
    """A value the configuration refuses: one sentence, exit status 2 (cli.parse, main_guard)."""


def flag(name):
    return "--" + name.replace("_", "-")


def _fits(value, kind):
    """Whether value has the declared type: int | None, tuple[int, ...], float (an int is a number
    too, as argparse's defaults are)."""
    if kind is typing.Any:
        return True
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, k) for k in typing.get_args(kind))
    if kind is type(None):
        return value is None
    if origin is tuple:
        inner = typing.get_args(kind)
        if len(inner) == 2 and inner[1] is Ellipsis:  # tuple[int, ...]
            return isinstance(value, tuple) and all(_fits(v, inner[0]) for v in value)
        return (isinstance(value, tuple) and len(value) == len(inner)
                and all(_fits(v, k) for v, k in zip(value, inner)))
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _check_types(section):
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if not _fits(value, f.type):
            kind = getattr(f.type, "__name__", str(f.type))
            raise ConfigError(f"{flag(f.name)} must be of type {kind}, got {value!r}")


def _positive(section, *names):
    """The check of cli.positive, again for values that did not come through argparse."""
    for name in names:
        value = getattr(section, name)
        if value is not None and (not math.isfinite(value) or value <= 0):
            raise ConfigError(f"{flag(name)} must be a finite number greater than 0, got {value}")


@dataclass(frozen=True)
class Training:
    lesson: str
    dataset: str
    batch_size: int
    epochs: int
    lr: float
    gamma: float
    dropout: float
    seed: int
    model: str | None = None
    precision: str = "32"
    threads: int | None = None
    quick: bool = False

    def __post_init__(self):
        _check_types(self)
        _positive(self, "batch_size", "epochs", "lr", "gamma", "threads")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"--dropout must be in [0, 1), got {self.dropout}")
        if not 0 <= self.seed <= SEED_MAX:
            raise ConfigError(f"--seed must be from 0 to {SEED_MAX}, got {self.seed}")


@dataclass(frozen=True)
class Data:
    data_dir: str
    image_shape: tuple[int, ...]
    num_classes: int
    download: bool = False
    train_size: int | None = None
    test_size: int | None = None

    def __post_init__(self):
        _check_types(self)
        _positive(self, "num_classes", "train_size", "test_size")
        if len(self.image_shape) != 3 or min(self.image_shape) <= 0:
            raise ConfigError(f"--image-shape must look like 3x224x224, got "
                              f"{'x'.join(map(str, self.image_shape))!r}")


@dataclass(frozen=True)
class Output:
    run_name: str
    log_dir: str
    checkpoint_dir: str | None = None  # None: a script that keeps no checkpoint (collectives)
    run_name_default: bool = False  # then rank 0's name wins in a job of many (preempt.Stopper)
    resume: bool = False
    no_progress: bool = False
    stop_signal: str = "USR1"

    @property
    def show_progress(self):
        return not self.no_progress

    def __post_init__(self):
        """The run's name and its --log-dir, checked before any work: a plain file name, and a
        folder that can be made and written (nothing is made yet)."""
        _check_types(self)
        name = self.run_name
        if not name or "/" in name or name.startswith(".") or len(name) > 200:
            raise ConfigError(f"--run-name must be a plain file name of at most 200 characters, "
                              f"got {name[:80]!r}")
        probe = Path(self.log_dir).absolute()
        while not probe.exists():
            probe = probe.parent
        why = "is not a folder" if not probe.is_dir() else writable(probe)
        if why:
            raise ConfigError(f"--log-dir {self.log_dir} cannot be created or written ({probe} "
                              f"{why}); point it at a folder you can write")


@dataclass(frozen=True)
class Loading:
    device: str | None = None
    workers: int | None = None
    no_pin_memory: bool = False
    resident: bool = False

    def __post_init__(self):
        _check_types(self)
        if self.workers is not None and self.workers < 0:
            raise ConfigError(f"--workers must be 0 or more, got {self.workers}")


@dataclass(frozen=True)
class Blocks:
    blocks: int
    width: int
    block_lesson: str
    device: str = "cpu"

    def __post_init__(self):
        _check_types(self)
        _positive(self, "blocks", "width")


@dataclass(frozen=True)
class Sweep:
    sweep_what: str
    sweep_example: str
    sweep_steps: int
    sweep: tuple[int, ...] | None = None

    def __post_init__(self):
        _check_types(self)
        _positive(self, "sweep_steps")
        if self.sweep is not None and (not self.sweep or min(self.sweep) <= 0):
            raise ConfigError(f"--sweep takes {self.sweep_what} like {self.sweep_example}, got "
                              f"{','.join(map(str, self.sweep))!r}")


@dataclass(frozen=True)
class Group:
    timeout: float
    backend: str | None = None
    no_set_epoch: bool = False

    def __post_init__(self):
        _check_types(self)
        _positive(self, "timeout")


@dataclass(frozen=True)
class Lesson:
    """The script's own flags, (name, value) pairs in the order argparse made them; their checks
    are the script's (its check_flags)."""
    values: tuple[tuple[str, typing.Any], ...] = ()

    def __post_init__(self):
        _check_types(self)


# Each concern's section, in the order a flag's name is looked up (--device: the block stack's
# where a script has both, else add_loading's, else the script's own)
SECTIONS = {"training": Training, "data": Data, "output": Output, "blocks": Blocks,
            "loading": Loading, "sweep": Sweep, "group": Group}
ALWAYS = ("training", "data", "output")


class Config:
    """The run's configuration: a section per concern, read flat, frozen. replace() makes a new one
    (dataclasses.replace on each section it touches), checked again."""
    __slots__ = ("_sections", "_where")

    def __init__(self, sections, where):
        object.__setattr__(self, "_sections", dict(sections))
        object.__setattr__(self, "_where", dict(where))  # each flag's section, in argparse's order
        self._check_across()

    def _check_across(self):
        """What two sections decide together."""
        get = self._get
        synthetic = get("dataset", None) == "synthetic"
        if synthetic and get("resident", False):
            raise ConfigError("--resident needs a data set held in memory (digits, mnist, "
                              "cifar10); synthetic images are made on the fly")
        if synthetic and get("block_lesson", None):
            raise ConfigError(f"--dataset synthetic: {get('block_lesson')} takes a data set "
                              f"held in memory (digits, mnist, cifar10)")
        shape = get("image_shape", None)
        if synthetic and get("model", None) in ("cnn", "cnn_bn") and min(shape[1:]) < CNN_MIN_SIDE:
            side = CNN_MIN_SIDE
            raise ConfigError(f"--image-shape {'x'.join(map(str, shape))} is too small for --model "
                              f"{get('model')}: its convolutions and pooling need at least "
                              f"{side}x{side} pixels")

    def _get(self, name, *default):
        try:
            return getattr(self, name)
        except AttributeError:
            if default:
                return default[0]
            raise

    def __getattr__(self, name):
        """A flag's value; a section's dataclass by its name where no flag has that name (--sweep
        and --lesson's marker do: section() reaches those)."""
        if name.startswith("_"):
            raise AttributeError(name)
        sections = object.__getattribute__(self, "_sections")
        section = object.__getattribute__(self, "_where").get(name)
        if section == "lesson":
            return dict(sections["lesson"].values)[name]
        if section is not None:
            return getattr(sections[section], name)
        if name in sections:
            return sections[name]
        derived = [s for s in sections.values()
                   if isinstance(getattr(type(s), name, None), property)]
        if derived:  # show_progress
            return getattr(derived[0], name)
        raise AttributeError(f"the configuration has no {name!r}")

    def section(self, name):
        """One concern's frozen dataclass: training, data, output, loading, blocks, sweep, group,
        lesson (those the script added)."""
        return self._sections[name]

    def __setattr__(self, name, value):
        raise dataclasses.FrozenInstanceError(
            f"the configuration is frozen: cannot assign {name}; make a new one with "
            f"args = args.replace({name}=...)")

    def __delattr__(self, name):
        raise dataclasses.FrozenInstanceError(f"the configuration is frozen: cannot delete {name}")

    def replace(self, **changes):
        """A new configuration with changes, each section's checks and the checks across them run
        again (dataclasses.replace semantics)."""
        unknown = [name for name in changes if name not in self._where]
        if unknown:
            raise ConfigError(f"the configuration has no {', '.join(map(flag, unknown))} to change")
        sections = dict(self._sections)
        for name, section in sections.items():
            mine = {k: v for k, v in changes.items() if self._where[k] == name}
            if not mine:
                continue
            if name == "lesson":
                values = dict(section.values) | mine
                sections[name] = Lesson(tuple(values.items()))
            else:
                sections[name] = dataclasses.replace(section, **mine)
        return Config(sections, self._where)

    def as_dict(self):
        """Every flag's value, in argparse's order, and show_progress: the run's record
        (metrics.RunLog, checkpoint.save)."""
        values = {name: getattr(self, name) for name in self._where}
        values["show_progress"] = self.show_progress
        return values

    def __reduce__(self):  # Ray sends it to its workers; copy.copy and deepcopy too
        return Config, (self._sections, self._where)

    def __eq__(self, other):
        return isinstance(other, Config) and self.as_dict() == other.as_dict()

    def __contains__(self, name):
        return name in self._where

    def __repr__(self):
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items()) + ")"


def replaced(args, **changes):
    """args.replace(**changes) for a Config; for an argparse or types namespace (tests, notebooks
    that build one) a new namespace of its type, the given one left as it was."""
    if isinstance(args, Config):
        return args.replace(**changes)
    return type(args)(**{**vars(args), **changes})


def as_dict(args):
    """A Config's values, or an argparse.Namespace's (tests, notebooks that build one)."""
    return args.as_dict() if isinstance(args, Config) else dict(vars(args))


def build(values, concerns=ALWAYS, epochs_given=True):
    """The Config of argparse's values (a dict): the text of --image-shape and --sweep read,
    --quick's sizes and the default run name filled in, then every section checked."""
    values = dict(values)
    if values.get("quick") and "data" in concerns:
        values["train_size"] = values.get("train_size") or QUICK["train_size"]
        values["test_size"] = values.get("test_size") or QUICK["test_size"]
        if not epochs_given:
            values["epochs"] = QUICK["epochs"]
    text = values.get("image_shape")
    if isinstance(text, str):
        try:
            values["image_shape"] = tuple(int(n) for n in text.lower().split("x"))
        except ValueError:
            raise ConfigError(f"--image-shape must look like 3x224x224, got {text!r}")
    text = values.get("sweep")
    if isinstance(text, str):
        try:
            values["sweep"] = tuple(int(b) for b in text.split(","))
        except ValueError:
            raise ConfigError(f"--sweep takes {values.get('sweep_what')} like "
                              f"{values.get('sweep_example')}, got {text!r}")
    values["run_name_default"] = values.get("run_name") is None
    if values["run_name_default"]:
        values["run_name"] = runlock.default_name(values["lesson"])
    where = {}
    for name in values:
        where[name] = next((s for s in SECTIONS if s in concerns and name in _names(SECTIONS[s])),
                           "lesson")
    sections = {}
    for s in concerns:
        sections[s] = SECTIONS[s](**{k: v for k, v in values.items() if where[k] == s})
    sections["lesson"] = Lesson(tuple((k, v) for k, v in values.items() if where[k] == "lesson"))
    return Config(sections, where)


def _names(section):
    return {f.name for f in dataclasses.fields(section)}


def writable(folder):
    """None where a folder can be made in folder (made and removed again); else why not. os.access
    answers yes to root everywhere, also under /proc and on a read-only file system."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".trainup-probe-", dir=folder))
    except OSError as e:
        return f"cannot be written: {e.strerror or e}"
    return None
