"""FLOPs and MFU (trainup/flops.py): PyTorch's count of the course's CNN against a hand count, the
datasheet peaks by GPU name, and every script's epoch logging its achieved FLOP/s."""

import pytest

from conftest import run_script
from lessons import report
from trainup import flops, models

# pytorch/examples' MNIST CNN, multiply-adds of one 28x28 sample: conv1 1->32 3x3 on 26x26, conv2
# 32->64
# 3x3 on 24x24, fc1 9216->128, fc2 128->10
CONV1, CONV2, FC1, FC2 = 26 * 26 * 32 * 9, 24 * 24 * 64 * 32 * 9, 9216 * 128, 128 * 10
FORWARD = 2 * (CONV1 + CONV2 + FC1 + FC2)  # 2 FLOPs a multiply-add


def test_the_cnns_flops_are_the_hand_count():
    """Forward 2*MACs; backward twice that, less conv1's gradient for its input (the data needs
    none)."""
    assert FORWARD == 23_984_896
    assert flops.per_sample(models.Net(), (1, 28, 28)) == 3 * FORWARD - 2 * CONV1
    # BatchNorm: no FLOPs counted
    assert flops.per_sample(models.NetBN(), (1, 28, 28)) >= 3 * FORWARD - 2 * CONV1


def test_the_model_itself_is_untouched():
    net = models.Net()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    flops.per_sample(net, (1, 28, 28))
    assert all(p.grad is None for p in net.parameters())
    assert all((net.state_dict()[k] == v).all() for k, v in before.items())


@pytest.mark.parametrize(
    "name, precision, peak",
    [
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA H100 80GB HBM3", "16", 989.0),
        ("Tesla T4", "32", 8.1),
        ("NVIDIA H200", "bf16", 989.0),
        ("NVIDIA GeForce RTX 4090", "32", None),
        ("cpu", "32", None),
    ],
)
def test_mfu_from_the_datasheet_peak_where_it_is_known(name, precision, peak):
    assert flops.peak_tflops(name, precision) == peak
    got = flops.mfu(peak * 1e12 if peak else 1e12, name, precision, devices=2)
    assert got == (0.5 if peak else None)


def test_every_epoch_logs_its_flops_per_second(tmp_path):
    log_dir = tmp_path / "logs"
    run_script("_trainup_cpu.py", "--quick", "--epochs", "1", "--run-name", "f", log_dir=log_dir)
    run = report.read_run(log_dir / "f.jsonl")
    assert run["problems"] == []
    epoch = run["epochs"][0]
    per_sample = 3 * FORWARD - 2 * CONV1
    assert epoch["flops_per_s"] == pytest.approx(
        per_sample * epoch["samples"] / epoch["wall_s"], rel=1e-9
    )
    assert epoch["mfu"] is None  # a CPU: no datasheet peak


def test_the_report_shows_the_flops_a_run_logged(tmp_path):
    from lessons.bylesson import scaling_report as sr

    log_dir = tmp_path / "logs"
    run_script("_trainup_cpu.py", "--quick", "--epochs", "1", "--run-name", "one", log_dir=log_dir)
    row = sr.performance(sr.load(log_dir)[0]).set_index("run").loc["one"]
    epoch = report.read_run(log_dir / "one.jsonl")["epochs"][0]
    assert row["gflops_per_s"] == pytest.approx(epoch["flops_per_s"] / 1e9) and row["mfu"] is None
