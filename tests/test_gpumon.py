"""The GPU sampler (trainup/gpumon.py) with a fake source of readings: the thread, the records, the log.

No GPU is needed or touched: a fake source stands in for nvitop, so what is tested is the sampling and
logging logic, and that a machine without a GPU gets nothing at all, quietly.
"""

import json
import threading
import time
from argparse import Namespace

import pytest

from lessons import report
from lessons.bylesson import gpu
from trainup import gpumon, metrics


class FakeGPUs:
    """Readings of two GPUs whose utilisation climbs by 10 % at each call."""

    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return [
            dict(
                gpu=i,
                utilization_pct=min(10.0 * self.calls, 100.0),
                memory_used_mb=100.0 * (i + 1),
                memory_total_mb=1000.0,
            )
            for i in (0, 1)
        ]


def wait_for(condition, timeout=30):
    end = time.time() + timeout
    while not condition():
        assert time.time() < end, "timed out"
        time.sleep(0.01)


def test_the_thread_writes_every_sample_as_it_comes_until_stopped():
    written, source = [], FakeGPUs()
    monitor = gpumon.start(
        lambda kind, **f: written.append((kind, f)), "cuda", source=source, interval=0.01
    )
    wait_for(lambda: source.calls >= 3)
    assert len(written) >= 4  # written as read, not held until stop(): a crash keeps them
    samples = monitor.stop()
    assert not monitor._thread.is_alive()
    calls = source.calls
    time.sleep(0.05)
    assert source.calls == calls  # stopped means stopped
    assert len(samples) == 2 * calls and len(written) == len(samples)
    assert {kind for kind, _ in written} == {"gpu"}
    assert all(set(f) == set(gpumon.FIELDS) for _, f in written)
    assert [f["gpu"] for _, f in written[:4]] == [0, 1, 0, 1]
    util = [f["utilization_pct"] for _, f in written if f["gpu"] == 0]
    assert util == sorted(util) and util[0] == 10.0
    elapsed = [f["elapsed_s"] for _, f in written if f["gpu"] == 1]
    assert elapsed == sorted(elapsed) and elapsed[0] >= 0
    assert monitor.stop() == [] and len(written) == len(
        samples
    )  # a second stop writes nothing more


def test_a_failing_reading_is_counted_and_skipped_not_raised():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) % 2:
            raise RuntimeError("NVML hiccup")
        return [dict(gpu=0, utilization_pct=50.0, memory_used_mb=1.0, memory_total_mb=2.0)]

    monitor = gpumon.start(lambda kind, **f: None, "cuda", source=flaky, interval=0.01)
    wait_for(lambda: len(calls) >= 4)
    samples = monitor.stop()
    assert monitor.errors >= 2 and len(samples) >= 1
    assert monitor.errors + len(samples) == len(calls)


def test_on_a_cpu_there_is_no_thread_and_nothing_is_written():
    before = threading.active_count()
    written = []
    monitor = gpumon.start(lambda kind, **f: written.append(kind), "cpu")
    assert threading.active_count() == before
    assert monitor.stop() == [] and written == []


@pytest.mark.skipif(gpu.has_gpu(), reason="this machine has a GPU, so NVML is there")
def test_without_nvml_asking_for_a_gpu_gives_nothing_quietly(capfd):
    assert gpumon.nvitop_source([0]) is None
    monitor = gpumon.start(lambda kind, **f: None, "cuda:0")
    assert monitor.stop() == []
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # nvitop's "NVML not found" banner is swallowed


def fake_nvitop(monkeypatch, visible):
    """An nvitop module whose Device.from_cuda_visible_devices() returns visible(), or raises what it raises."""
    import sys
    import types

    class NVMLError(Exception):
        pass

    module = types.ModuleType("nvitop")
    module.libnvml = types.SimpleNamespace(NVMLError=NVMLError)
    module.Device = types.SimpleNamespace(from_cuda_visible_devices=lambda: visible(NVMLError))
    monkeypatch.setitem(sys.modules, "nvitop", module)
    return NVMLError


class FakeDevice:
    def gpu_utilization(self):
        return 42

    def memory_used(self):
        return 2**30

    def memory_total(self):
        return 2**31


def test_nvitop_source_means_no_gpu_only_for_nvml_errors_and_raises_the_rest(monkeypatch):
    def no_nvml(error):
        raise error("NVML Shared Library Not Found")

    fake_nvitop(monkeypatch, no_nvml)
    assert gpumon.nvitop_source([0]) is None
    fake_nvitop(monkeypatch, lambda error: [])
    assert gpumon.nvitop_source([0]) is None  # no visible GPU
    fake_nvitop(monkeypatch, lambda error: [FakeDevice()])
    assert gpumon.nvitop_source([1]) is None  # not that GPU
    assert gpumon.nvitop_source([0])() == [
        dict(gpu=0, utilization_pct=42, memory_used_mb=1024.0, memory_total_mb=2048.0)
    ]

    def bug(error):
        raise TypeError("a bug in the sampling code")

    fake_nvitop(monkeypatch, bug)
    with pytest.raises(TypeError, match="a bug"):  # not hidden as "no GPU"
        gpumon.nvitop_source([0])


def test_failed_readings_are_written_to_the_log(tmp_path):
    args = Namespace(run_name="flaky", log_dir=str(tmp_path), lesson="gpu", resume=False)
    log = metrics.RunLog(args, "_trainup_gpu.py", "cuda:0")
    calls = iter(
        [
            RuntimeError("NVML hiccup"),
            [dict(gpu=0, utilization_pct=5.0, memory_used_mb=1.0, memory_total_mb=2.0)],
            ValueError("odd reading"),
        ]
    )

    def source():
        value = next(calls)
        if isinstance(value, Exception):
            raise value
        return value

    monitor = gpumon.Monitor(log.write, source)
    monitor.started = 0
    for _ in range(3):
        monitor.sample()
    monitor.stop()
    monitor.stop()
    log.summary()
    run = report.read_run(tmp_path / "flaky.jsonl")
    assert run["problems"] == []
    errors = [r for r in run["extra"] if r["type"] == "gpumon"]
    assert len(errors) == 1 and errors[0]["errors"] == 2 and errors[0]["samples"] == 1
    assert errors[0]["last_error"] == "ValueError: odd reading"


def test_samples_in_a_run_log_line_up_with_the_sweep_that_ran(tmp_path, monkeypatch):
    """Samples go through a real RunLog; the lesson's table gives each batch size the samples of its window."""
    monkeypatch.setattr(report, "IMAGE_DIR", tmp_path / "images")
    args = Namespace(run_name="fake", log_dir=str(tmp_path), lesson="gpu", resume=False)
    log = metrics.RunLog(args, "_trainup_gpu.py", "cuda:0")
    clock = iter(range(100, 200)).__next__  # one Unix second per sample, from 100 on
    readings = iter([10.0, 20.0, 30.0, 80.0, 90.0, 100.0])
    monitor = gpumon.Monitor(
        log.write,
        lambda: [
            dict(gpu=0, utilization_pct=next(readings), memory_used_mb=5.0, memory_total_mb=10.0)
        ],
        clock=clock,
    )
    monitor.started = 99
    for _ in range(6):
        monitor.sample()  # at 100, 101, ..., 105
    log.write("sweep", batch_size=8, steps=2, step_s=1.0, samples_per_s=8.0, peak_mem_mb=1.0)
    log.write("sweep", batch_size=64, steps=2, step_s=1.0, samples_per_s=64.0, peak_mem_mb=2.0)
    monitor.stop()
    log.summary()
    path = tmp_path / "fake.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    first, second = [r for r in records if r["type"] == "sweep"]
    first["time"], second["time"] = 102.0, 105.0  # they ran from 100 to 102, and from 103 to 105
    path.write_text("".join(json.dumps(r) + "\n" for r in records))

    run = report.read_run(path)
    assert run["problems"] == [] and [r["type"] for r in records][-1] == "summary"
    samples = gpu.samples(path)
    assert list(samples["utilization_pct"]) == [10.0, 20.0, 30.0, 80.0, 90.0, 100.0]
    assert list(samples["elapsed_s"]) == [1, 2, 3, 4, 5, 6]
    table = gpu.sweeps([path])
    assert list(table["batch_size"]) == [8, 64]
    assert list(table["gpu_util_pct"]) == [20.0, 90.0]  # the mean of each batch size's own samples
    gpu.plot_utilisation(path, "utilisation")
    assert (tmp_path / "images" / "utilisation.png").exists()


def test_rank_0_watches_every_rank_gpu_of_its_node_that_it_sees(monkeypatch):
    """distributed.node_gpus: 4 local ranks on a node whose 4 GPUs this process sees -> [0, 1, 2, 3]; a SLURM
    task bound to its own GPU sees 1 -> [0]; a CPU job -> None (no sampler)."""
    from types import SimpleNamespace

    import torch
    from trainup import distributed

    ctx = SimpleNamespace(device=torch.device("cuda", 0), local_world_size=4)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert distributed.node_gpus(ctx) == [0, 1, 2, 3]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert distributed.node_gpus(ctx) == [0]
    assert (
        distributed.node_gpus(SimpleNamespace(device=torch.device("cpu"), local_world_size=4))
        is None
    )


def test_the_first_process_of_every_node_watches_its_node_and_no_other_does(monkeypatch, tmp_path):
    """gpumon.start_on_node, with fake readings of 2 GPUs per node: rank 0 writes 'gpu' records to
    the run's log; the first process of node 1 writes its node's samples to TensorBoard scalars of
    its own (logs/tensorboard/<run>/node1), read back as TensorBoard reads them; a second process on
    a node watches nothing."""
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from trainup import distributed

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    args = Namespace(run_name="nodes", log_dir=str(tmp_path), resume=False)
    cuda0 = torch.device("cuda", 0)
    written = []

    class Log:
        def write(self, kind, **fields):
            written.append(kind)

    def place(rank, local_rank, node_rank):
        return distributed.Context(
            rank=rank,
            world_size=4,
            local_rank=local_rank,
            local_world_size=2,
            node_rank=node_rank,
            nnodes=2,
            device=cuda0,
        )

    for ctx in (place(0, 0, 0), place(2, 0, 1)):
        monitor = gpumon.start_on_node(ctx, Log(), args, source=FakeGPUs())
        time.sleep(0.6)  # a few readings, every INTERVAL_S
        assert monitor.stop()
    assert written and set(written) == {"gpu"}  # rank 0: the run's log
    acc = EventAccumulator(str(tmp_path / "tensorboard" / "nodes" / "node1")).Reload()
    assert {"gpu0/utilization_pct", "gpu1/memory_used_mb"} <= set(acc.Tags()["scalars"])
    assert acc.Scalars("gpu1/memory_used_mb")[0].value == 200.0
    for other in (place(1, 1, 0), place(3, 1, 1)):  # the second process of each node
        watcher = gpumon.start_on_node(other, Log(), args, source=FakeGPUs())
        assert isinstance(watcher, gpumon._Nothing)
    # a node without a GPU writes no folder
    cpu = distributed.Context(rank=2, local_rank=0, node_rank=1, device=torch.device("cpu"))
    watcher = gpumon.start_on_node(cpu, Log(), Namespace(run_name="cpu", log_dir=str(tmp_path)))
    assert isinstance(watcher, gpumon._Nothing)
    assert not (tmp_path / "tensorboard" / "cpu").exists()
