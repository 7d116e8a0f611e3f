"""The run log's schema, its reader, and the plots drawn from it."""

import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from conftest import DAY, ROOT
from lessons import report
from trainup import checkpoint, metrics, models


def fake_args(tmp_path, **kw):
    return SimpleNamespace(
        run_name="unit", log_dir=str(tmp_path), lesson="test", resume=False, **kw
    )


def write_run(tmp_path, losses=(2.0, 1.0), **kw):
    log = metrics.RunLog(fake_args(tmp_path, **kw), "script.py", "cpu")
    for epoch, loss in enumerate(losses, 1):
        train, test = metrics.Meter(), metrics.Meter()
        train.add(torch.tensor(loss), torch.eye(4), torch.arange(4))
        test.add(torch.tensor(loss), torch.eye(4), torch.tensor([0, 1, 0, 0]))
        log.epoch(epoch, train, test, wall_s=0.5)
    log.summary(checkpoint=None)
    return tmp_path / "unit.jsonl"


def test_every_record_follows_the_schema(tmp_path):
    path = write_run(tmp_path)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["type"] for r in records] == ["config", "env", "epoch", "epoch", "summary"]
    assert all(metrics.check_record(r) == [] for r in records)
    epoch = records[2]
    assert (
        epoch["accuracy"] == 1.0 and epoch["test_accuracy"] == 0.5 and epoch["samples_per_s"] == 8.0
    )
    assert records[1]["world_size"] == 1 and records[1]["torch"] == torch.__version__
    lines = (tmp_path / "unit.stdout").read_text().splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == [
        "epoch 1",
        "epoch 2",
    ] and "finished" in lines[2]
    assert not hasattr(sys.stdout, "streams")  # the tee is undone when the run ends


def test_a_stream_kept_past_the_run_writes_to_the_terminal(tmp_path, monkeypatch, capsys):
    """rich's live display (Lightning's progress bar where rich is installed) keeps sys.stdout as
    it found it, the run's tee, and writes to it after the run's log is closed: the terminal gets
    it, and neither that write nor the exit's flush fails (on a GPU machine with rich,
    the Lightning script exited with status 120)."""
    log = metrics.RunLog(fake_args(tmp_path), "script.py", "cpu")
    kept = sys.stdout  # what rich's Live saves when it starts
    print("during the run")
    log.summary(checkpoint=None)
    kept.write("after the run\n")
    kept.flush()
    assert "after the run" in capsys.readouterr().out
    assert "after the run" not in (tmp_path / "unit.stdout").read_text()
    assert "during the run" in (tmp_path / "unit.stdout").read_text()


def test_the_log_names_the_gpus_without_starting_cuda(monkeypatch):
    """The env record's GPU names come from NVML until CUDA has started: a kernel that logged a CPU
    run could not fork Lightning's ddp_notebook ranks afterwards, nor could those ranks log (on an
    H100: "Cannot re-initialize CUDA in forked subprocess")."""
    import nvitop

    def no_cuda(*a):
        raise RuntimeError("Cannot re-initialize CUDA in forked subprocess")

    fake = SimpleNamespace(name=lambda: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", no_cuda)
    monkeypatch.setattr(nvitop.Device, "from_cuda_visible_devices", staticmethod(lambda: [fake]))
    assert metrics.environment("cpu")["gpus"] == ["NVIDIA H100 80GB HBM3"]
    monkeypatch.setattr(nvitop.Device, "from_cuda_visible_devices", staticmethod(no_cuda))
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    assert metrics.environment("cpu")["gpus"] == []  # no NVML, and CUDA cannot start: none named
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # started: torch names them
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 80GB HBM3")
    assert metrics.environment("cuda:0")["gpus"] == ["NVIDIA H100 80GB HBM3"]


def test_schema_check_names_what_is_missing():
    assert metrics.check_record({"type": "epoch", "run": "x", "time": 0, "epoch": 1}) != []
    assert any(
        "'loss'" in p for p in metrics.check_record({"type": "epoch", "run": "x", "time": 0})
    )


def test_schema_check_catches_wrong_types_and_unknown_records(tmp_path):
    good = [json.loads(line) for line in write_run(tmp_path).read_text().splitlines()]
    epoch = good[2]
    for field, bad in [
        ("loss", "0.5"),
        ("epoch", "1"),
        ("epoch", 1.0),
        ("samples", True),
        ("test_accuracy", None),
        ("run", 3),
        ("time", "now"),
    ]:
        problems = metrics.check_record({**epoch, field: bad})
        assert len(problems) == 1 and f"'{field}'" in problems[0], (field, bad, problems)
    assert metrics.check_record({**good[1], "world_size": "2"}) != []
    assert metrics.check_record({**good[0], "args": ["--quick"]}) != []
    assert metrics.check_record({"type": "epoc", "run": "x", "time": 0}) == [
        "unknown record type 'epoc' (logs/README.md lists the types)"
    ]
    # what may be null is null-able: a sweep's summary has no epochs, a GPU may not report a value
    assert (
        metrics.check_record(
            {
                **good[-1],
                "loss": None,
                "accuracy": None,
                "test_accuracy": None,
                "samples_per_s": None,
                "epochs": 0,
            }
        )
        == []
    )
    ranks = dict(
        type="ranks",
        run="x",
        time=0.0,
        epoch=1,
        rank=[0, 1],
        loss=[0.5, 0.6],
        accuracy=[0.1, 0.2],
        samples=[4, 4],
        first_indices=[[1], [2]],
    )
    assert metrics.check_record(ranks) == [] and metrics.check_record({**ranks, "loss": 0.5}) != []


def _readme_tables():
    """{record type: set of field names} from logs/README.md's two tables: the `names` of the fields column,
    leaving out text in parentheses and after a semicolon (values and notes)."""
    tables = {}
    for line in (ROOT / "logs" / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| `") or len(cells) != 3:
            continue
        fields = cells[2]
        while re.search(r"\([^()]*\)", fields):
            fields = re.sub(r"\([^()]*\)", "", fields)
        fields = fields.split(";")[0]  # after a semicolon: a note on when records are written
        tables[cells[0].strip("`")] = set(re.findall(r"`(\w+)`", fields))
    return tables


def test_logs_readme_names_exactly_the_schemas_records_and_fields():
    documented = _readme_tables()
    assert set(documented) == set(metrics.SCHEMA)
    for kind, fields in metrics.SCHEMA.items():
        assert documented[kind] == set(fields), kind


def test_reader_tables_and_sentence(tmp_path):
    write_run(tmp_path)
    runs = report.load_runs(["unit"], log_dir=tmp_path)
    assert (
        runs.loc[0, "status"] == "finished"
        and runs.loc[0, "epochs"] == 2
        and runs.loc[0, "problems"] == ""
    )
    epochs = report.load_epochs("unit*", log_dir=tmp_path)
    assert list(epochs["loss"]) == [2.0, 1.0]
    assert (
        report.check("unit", log_dir=tmp_path)
        == "unit: finished, 2 epochs, the training loss fell, the log follows the schema."
    )


def test_reader_reports_a_run_that_did_not_finish_or_learn(tmp_path):
    path = write_run(tmp_path, losses=(1.0, 2.0))
    path.write_text("\n".join(path.read_text().splitlines()[:-1]) + "\n")  # drop the summary
    sentence = report.check("unit", log_dir=tmp_path)
    assert (
        "DID NOT FINISH" in sentence
        and "DID NOT FALL" in sentence
        and "no 'summary' record" in sentence
    )


def test_a_resumed_run_keeps_one_record_per_epoch(tmp_path):
    path = write_run(tmp_path)
    text = path.read_text()
    path.write_text(text + text)  # the same epochs logged again after a restart
    assert len(report.read_run(path)["epochs"]) == 2


def test_plot_is_saved_under_images(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "IMAGE_DIR", tmp_path / "images")
    write_run(tmp_path)
    report.plot(report.load_epochs("unit", log_dir=tmp_path), "epoch", "loss", "unit_loss")
    assert (tmp_path / "images" / "unit_loss.png").stat().st_size > 1000


def test_every_saved_figure_has_its_legends_outside_the_data_once_each_and_plain_log_ticks(
    tmp_path, monkeypatch
):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    monkeypatch.setattr(report, "IMAGE_DIR", tmp_path / "images")
    fig, ax = plt.subplots(figsize=(4, 3))
    for name in ("a", "ideal", "b", "ideal"):  # a line named twice, as panels drawing the ideal do
        ax.plot([1, 10, 100], [1, 2, 3], label=name)
    ax.set_xscale("log")
    ax.legend()  # matplotlib's "best" place: inside the data
    path = report.save(fig, "unit_legend")
    legend = ax.get_legend()
    assert legend.get_bbox_to_anchor() != ax.bbox  # anchored outside the axes
    assert [t.get_text() for t in legend.get_texts()] == ["a", "ideal", "b"]
    assert ax.xaxis.get_major_formatter()(10, 0) == "10"  # not 10^1
    assert round(Image.open(path).info["dpi"][0]) == report.DPI


def test_a_checkpoint_being_written_never_replaces_the_last_good_one_until_it_is_whole(
    tmp_path, monkeypatch
):
    """While save() writes, the checkpoint on disk is still the previous one, whole; the new one appears at
    once (os.replace). A plain torch.save(path) would leave a half-written file if the job died meanwhile."""
    args = SimpleNamespace(model="cnn", seed=0, dropout=0.0)
    model = models.build(args, SimpleNamespace(shape=(1, 28, 28), num_classes=10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    path = checkpoint.save(tmp_path / "c.pt", model, opt, sched, epoch=1, args=args)
    real_save, seen = torch.save, []

    def save_and_look(obj, f, *a, **kw):
        real_save(obj, f, *a, **kw)
        seen.append(
            (Path(f), torch.load(path, weights_only=True)["epoch"])
        )  # the last good one, meanwhile

    monkeypatch.setattr(checkpoint.torch, "save", save_and_look)
    checkpoint.save(path, model, opt, sched, epoch=2, args=args)
    assert len(seen) == 1
    written, on_disk_meanwhile = seen[0]
    assert written != path and written.parent == path.parent and on_disk_meanwhile == 1
    assert torch.load(path, weights_only=True)["epoch"] == 2 and not written.exists()


def test_checkpoint_keeps_the_loss_scale_of_fp16(tmp_path):
    args = SimpleNamespace(model="cnn", seed=0, dropout=0.0)
    model = models.build(args, SimpleNamespace(shape=(1, 28, 28), num_classes=10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(torch.ones(()))  # the scale is made at first use
    scaler.update(256.0)  # as after a few overflows
    checkpoint.save(tmp_path / "c.pt", model, opt, sched, 1, args, scaler)
    fresh = torch.amp.GradScaler("cpu")
    assert checkpoint.load(tmp_path / "c.pt", model, opt, sched, scaler=fresh) == 2
    assert fresh.get_scale() == 256.0


def test_checkpoint_is_atomic_and_resumes(tmp_path):
    args = SimpleNamespace(model="cnn", seed=0, dropout=0.0)
    shape = SimpleNamespace(shape=(1, 28, 28), num_classes=10)
    model = models.build(args, shape)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    path = checkpoint.save(tmp_path / "c.pt", model, opt, sched, epoch=3, args=args)
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary file left behind
    other = models.build(SimpleNamespace(model="cnn", seed=1, dropout=0.0), shape)
    assert checkpoint.load(path, other, opt, sched) == 4
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values())
    )
    assert checkpoint.load(tmp_path / "none.pt", other, opt, sched) == 1


def test_cnn_takes_mnist_and_cifar_shapes():
    for shape in ((1, 28, 28), (3, 32, 32)):
        net = models.Net(shape, 10)
        assert net(torch.zeros(2, *shape)).shape == (2, 10)


def test_reference_logs_say_where_they_were_measured(tmp_path):
    assert report.measured_on(tmp_path / "cpu_t1.jsonl") == "here"
    assert (
        report.measured_on(tmp_path / "reference" / f"H100_{DAY}" / "gpu_sweep.jsonl")
        == f"H100_{DAY}"
    )
