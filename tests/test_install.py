"""The pinned environment: pip's and conda's lists agree, and the torch/torchvision pairing works."""

import yaml

from conftest import ROOT


def pip_requirements():
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_conda_environment_lists_the_same_pinned_packages():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert sorted(pip_section) == sorted(pip_requirements())


def test_every_requirement_is_pinned_exactly():
    for req in pip_requirements():
        assert "==" in req, f"{req} is not pinned"


def test_torch_is_pinned_to_pypis_build_not_a_local_variant():
    # "===" is an exact string match: a local "2.13.0+cpu" file can never satisfy it.
    assert "torch===2.13.0" in pip_requirements()


def test_torchvision_and_lightning_work_beside_torch():
    import pytorch_lightning
    import torch
    import torchvision

    assert torch.__version__.startswith("2.13.0") and torchvision.__version__.startswith("0.28.0")
    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 10, 10], [20, 20, 30, 30]], dtype=torch.float)
    keep = torchvision.ops.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), iou_threshold=0.5)
    assert keep.tolist() == [0, 2]  # the C++ operator that a mismatched build lacks
    assert pytorch_lightning.__version__ == "2.6.6"
