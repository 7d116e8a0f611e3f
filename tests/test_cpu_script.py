"""_trainup_cpu.py run for real on tiny data, standalone, as a learner runs it."""

import json
import os
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import assert_clean_error, finish_script, in_process, run_script, start_script
from lessons import report
from trainup import data, models

QUICK = [
    "--quick",
    "--dropout",
    "0",
]  # dropout draws from the RNG, which a checkpoint does not keep


def records(path, kind=None):
    """The raw records of a log, every one (report.read_run keeps only the last record of each epoch)."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in lines if kind is None or r["type"] == kind]


def params(log_dir, name):
    return torch.load(log_dir / "checkpoints" / f"{name}.pt", weights_only=True)["model"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two epochs straight (q); one epoch then --resume to two (r): q runs beside r's two parts."""
    log_dir = tmp_path_factory.mktemp("cpu") / "logs"
    straight = start_script("_trainup_cpu.py", *QUICK, "--run-name", "q", log_dir=log_dir)
    finish_script(
        start_script("_trainup_cpu.py", *QUICK, "--epochs", "1", "--run-name", "r", log_dir=log_dir)
    )
    resumed = start_script(
        "_trainup_cpu.py", *QUICK, "--epochs", "2", "--resume", "--run-name", "r", log_dir=log_dir
    )
    straight = finish_script(straight)
    finish_script(resumed)
    return SimpleNamespace(log_dir=log_dir, straight=straight)


def test_quick_run_learns_and_writes_its_log(runs):
    log_dir = runs.log_dir
    assert "finished" in runs.straight.stdout
    run = report.read_run(log_dir / "q.jsonl")
    assert run["problems"] == [] and run["summary"]["status"] == "finished"
    assert run["epochs"][-1]["loss"] < run["epochs"][0]["loss"]
    # Hogwild's unlocked updates race, so its accuracy varies from run to run (0.59 to 0.82 over
    # six runs here, once below 0.5 on a loaded machine): three times chance says they trained it
    assert run["epochs"][-1]["test_accuracy"] > 0.3  # chance is 0.1
    assert run["env"]["world_size"] == 1 and run["config"]["args"]["quick"] is True
    assert (
        log_dir / "q.stdout"
    ).read_text() == runs.straight.stdout  # stdout is kept in logs/<run>.stdout
    assert (log_dir / "checkpoints" / "q.pt").exists()


def test_resume_runs_only_the_missing_epochs_and_ends_like_a_straight_run(runs):
    log_dir = runs.log_dir
    logged = records(log_dir / "r.jsonl")
    assert [r["type"] for r in logged] == [
        "config",
        "env",
        "epoch",
        "summary",
    ] * 2  # appended, not rewritten
    assert [r["epoch"] for r in logged if r["type"] == "epoch"] == [
        1,
        2,
    ]  # the second run began at epoch 2
    assert logged[4]["args"]["resume"] is True
    resumed, straight = params(log_dir, "r"), params(log_dir, "q")
    for k in straight:
        assert torch.equal(resumed[k], straight[k]), k
    assert logged[6]["loss"] == records(log_dir / "q.jsonl", "epoch")[1]["loss"]


@pytest.fixture(scope="module")
def hogwild(tmp_path_factory):
    """Two Hogwild processes: one epoch, then --resume for the second."""
    log_dir = tmp_path_factory.mktemp("hogwild") / "logs"
    flags = [*QUICK, "--num-processes", "2", "--threads", "1", "--run-name", "h"]
    run_script("_trainup_hogwild.py", *flags, "--epochs", "1", log_dir=log_dir)
    run_script("_trainup_hogwild.py", *flags, "--epochs", "2", "--resume", log_dir=log_dir)
    return log_dir


def test_two_hogwild_processes_train_one_shared_model(hogwild):
    run = report.read_run(hogwild / "h.jsonl")
    assert (
        run["problems"] == []
        and run["env"]["world_size"] == 2
        and run["env"]["backend"] == "hogwild"
    )
    assert [e["samples"] for e in run["epochs"]] == [
        512,
        512,
    ]  # the two shares make one whole epoch
    # The model the main process holds is the one the workers trained: its checkpoint, evaluated here,
    # scores what the run logged, and well beyond chance. Workers on private copies leave it untrained.
    args = SimpleNamespace(
        dataset="digits",
        data_dir="data",
        download=False,
        train_size=512,
        test_size=256,
        image_shape=(1, 28, 28),
        num_classes=10,
        model="cnn",
        seed=1,
        dropout=0.0,
    )
    _, test = data.load(args)
    model = models.build(args, test)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(params(hogwild, "h"))
    model.eval()
    with torch.no_grad():
        correct = sum(
            (model(x).argmax(1) == y).sum().item() for x, y in DataLoader(test, batch_size=256)
        )
    assert correct / len(test) == pytest.approx(run["epochs"][-1]["test_accuracy"])
    # Hogwild's unlocked updates race, so its accuracy varies from run to run (0.59 to 0.82 over
    # six runs here, once below 0.5 on a loaded machine): three times chance says they trained it
    assert run["epochs"][-1]["test_accuracy"] > 0.3  # chance is 0.1
    assert max((model.state_dict()[k] - init[k]).abs().max().item() for k in init) > 1e-2


def test_hogwild_resume_runs_only_the_missing_epoch(hogwild):
    logged = records(hogwild / "h.jsonl")
    assert [r["epoch"] for r in logged if r["type"] == "epoch"] == [1, 2]
    assert [r["type"] for r in logged].count("config") == 2


def test_mnist_from_idx_files_on_disk(log_dir, tmp_path):
    data.write_mnist_idx(tmp_path / "data", train_size=128, test_size=64)
    run_script(
        "_trainup_cpu.py",
        "--dataset",
        "mnist",
        "--data-dir",
        tmp_path / "data",
        "--epochs",
        "2",
        "--run-name",
        "m",
        log_dir=log_dir,
    )
    assert report.read_run(log_dir / "m.jsonl")["config"]["args"]["dataset"] == "mnist"


def test_bad_input_is_one_sentence_and_a_nonzero_exit(log_dir, tmp_path, capsys):
    """In this interpreter (each stops before training: seconds, not a new interpreter per case)."""
    import _trainup_cpu

    for flags, words in [
        (["--batch-size", "0"], ["--batch-size", "greater than 0"]),
        (["--dataset", "imagenet"], ["--dataset", "invalid choice"]),
        (["--dataset", "mnist", "--data-dir", tmp_path / "missing"], ["does not exist"]),
        (["--lr", "nan"], ["--lr", "finite"]),
        (["--gamma", "inf"], ["--gamma", "finite"]),
        (["--run-name", "r" * 300], ["--run-name", "at most 200"]),
        (["--log-dir", tmp_path / "file" / "sub"], ["--log-dir", "is not a folder"]),
    ]:
        (tmp_path / "file").write_text("")
        proc = in_process(
            _trainup_cpu.main, ["--quick", "--log-dir", log_dir, *flags, "--no-progress"], capsys
        )
        assert proc.returncode == 2
        assert_clean_error(proc, *words)
    assert not log_dir.exists()  # nothing half-written


def test_hogwild_refuses_a_batch_it_cannot_split_and_the_cpu_script_has_no_workers(log_dir, capsys):
    import _trainup_cpu
    import _trainup_hogwild

    proc = in_process(
        _trainup_hogwild.main,
        [
            "--quick",
            "--log-dir",
            log_dir,
            "--num-processes",
            "4",
            "--batch-size",
            "2",
            "--no-progress",
        ],
        capsys,
    )
    assert proc.returncode == 2
    assert_clean_error(proc, "cannot be split")
    proc = in_process(
        _trainup_cpu.main, ["--quick", "--log-dir", log_dir, "--num-processes", "2"], capsys
    )
    assert_clean_error(proc, "unrecognized arguments", "--num-processes")
    assert not log_dir.exists()


def test_a_loss_that_becomes_nan_ends_the_run_non_zero_saying_where(log_dir, capsys):
    import _trainup_cpu

    proc = in_process(
        _trainup_cpu.main,
        [
            "--quick",
            "--epochs",
            "1",
            "--lr",
            "1e30",
            "--log-dir",
            log_dir,
            "--run-name",
            "nan",
            "--no-progress",
        ],
        capsys,
    )
    assert proc.returncode == 2
    assert_clean_error(proc, "training loss became nan in epoch 1", "--lr")
    assert report.read_run(log_dir / "nan.jsonl")["summary"]["status"] == "failed"


def test_bad_files_are_one_sentence_and_leave_nothing_half_written(runs, tmp_path, capsys):
    """Issue 8's new-user inputs: a damaged checkpoint, another model's checkpoint, a checkpoint folder that
    cannot be made, damaged MNIST files. Each stops before training, with one sentence and no log."""
    import _trainup_cpu

    log_dir, ckpts = tmp_path / "logs", tmp_path / "logs" / "checkpoints"
    ckpts.mkdir(parents=True)
    good = (runs.log_dir / "checkpoints" / "q.pt").read_bytes()
    (ckpts / "garbage.pt").write_bytes(b"not a checkpoint at all")
    (ckpts / "cut.pt").write_bytes(good[: len(good) // 2])
    (ckpts / "cnn.pt").write_bytes(good)
    (tmp_path / "a_file").write_text("")
    raw = data.write_mnist_idx(tmp_path / "data", train_size=32, test_size=16)
    images = raw / "train-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:1000])  # truncated
    labels = raw / "t10k-labels-idx1-ubyte"
    labels.write_bytes(b"\x00\x00\x09\x09" + labels.read_bytes()[4:])  # wrong magic number
    cases = [
        (["--resume", "--run-name", "garbage"], ["garbage.pt", "cannot be read"]),
        (["--resume", "--run-name", "cut"], ["cut.pt", "cannot be read"]),
        (
            ["--resume", "--run-name", "cnn", "--model", "resnet18"],
            ["cnn.pt", "holds a cnn", "do not fit"],
        ),
        (
            ["--run-name", "nodir", "--checkpoint-dir", tmp_path / "a_file" / "sub"],
            ["--checkpoint-dir", "cannot be created"],
        ),
        (
            ["--run-name", "idx", "--dataset", "mnist", "--data-dir", tmp_path / "data"],
            ["mnist", "damaged or truncated"],
        ),
    ]
    for flags, words in cases:
        proc = in_process(
            _trainup_cpu.main,
            ["--quick", "--no-progress", "--log-dir", log_dir, "--checkpoint-dir", ckpts, *flags],
            capsys,
        )
        assert proc.returncode == 2, flags
        assert_clean_error(proc, *words)
    fresh = data.write_mnist_idx(tmp_path / "fresh", train_size=32, test_size=16)
    labels.write_bytes(
        (fresh / "t10k-labels-idx1-ubyte").read_bytes()
    )  # the labels mended: the images alone
    proc = in_process(
        _trainup_cpu.main,
        [
            "--quick",
            "--log-dir",
            log_dir,
            "--checkpoint-dir",
            ckpts,
            "--run-name",
            "idx",
            "--dataset",
            "mnist",
            "--data-dir",
            tmp_path / "data",
        ],
        capsys,
    )
    assert_clean_error(proc, "mnist", "damaged or truncated")
    assert not list(log_dir.glob("*.jsonl")) and not list(log_dir.glob("*.stdout"))  # no log begun
    assert (ckpts / "cnn.pt").read_bytes() == good  # the checkpoint it refused is untouched
    assert sorted(p.name for p in ckpts.iterdir()) == ["cnn.pt", "cut.pt", "garbage.pt"]


@pytest.mark.parametrize("name", ["../escape", "/tmp/absolute", "."])
def test_the_collectives_script_keeps_its_log_inside_log_dir(name, tmp_path, capsys):
    import _trainup_collectives

    proc = in_process(
        _trainup_collectives.main, ["--run-name", name, "--log-dir", tmp_path / "logs"], capsys
    )
    assert proc.returncode == 2
    assert_clean_error(proc, "--run-name must be a plain file name")
    args = _trainup_collectives.parse_args(["--log-dir", str(tmp_path / "logs")])
    assert args.run_name.startswith("collectives_") and args.run_name.endswith(f"-{os.getpid()}")
