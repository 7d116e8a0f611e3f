"""Faults, round three: bad input that is one sentence and a non-zero exit, through the scripts
as a learner starts them (a fresh interpreter each). Each class of fault is tried on two or three
scripts, not on all of them: its check sits in one place (cli.py, checkpoint.py, sweeps.py) that
every script goes through.
"""

import pytest
import torch

from conftest import assert_clean_error, run_script

TINY = ["--quick", "--train-size", "64", "--test-size", "64", "--epochs", "1"]


@pytest.mark.parametrize("script", ["_trainup_cpu.py", "_trainup_ddp.py"])
def test_a_seed_beyond_64_bits_is_one_sentence(script, log_dir):
    proc = run_script(script, *TINY, "--seed", 2**64 + 1, log_dir=log_dir, check=False)
    assert_clean_error(proc, "--seed", "must be from 0 to")
    assert proc.returncode == 2 and not log_dir.exists()


@pytest.mark.parametrize("script", ["_trainup_cpu.py", "_trainup_gpu.py"])
def test_an_image_shape_too_small_for_the_cnn_is_one_sentence(script, log_dir):
    proc = run_script(
        script,
        *TINY,
        "--dataset",
        "synthetic",
        "--image-shape",
        "1x2x2",
        log_dir=log_dir,
        check=False,
    )
    assert_clean_error(proc, "--image-shape 1x2x2 is too small for --model cnn")
    assert proc.returncode == 2 and not log_dir.exists()


def _lightning_ckpt(path):
    """What a Lightning Trainer's .ckpt holds at its top (weights under state_dict, no model)."""
    torch.save(
        {
            "epoch": 0,
            "global_step": 32,
            "pytorch-lightning_version": "2.6.0",
            "state_dict": {"model.fc.weight": torch.zeros(2, 2)},
            "loops": {},
        },
        path,
    )


FOREIGN = {
    "text": lambda p: p.write_text("epoch: 3\n"),  # torch's unpickler: IndexError
    "lightning": _lightning_ckpt,
    "a list": lambda p: torch.save([1, 2], p),
}
SAID = {
    "text": "cannot be read",
    "lightning": "is a Lightning checkpoint",
    "a list": "holds no trainup checkpoint",
}


@pytest.mark.parametrize(
    "what, script",
    [*((w, "_trainup_cpu.py") for w in FOREIGN), ("text", "_trainup_ray.py")],
)
def test_a_foreign_file_given_as_a_course_checkpoint_is_one_sentence(what, script, log_dir):
    """--resume finds the run's checkpoint holding text (torch's unpickler raises IndexError,
    KeyError, UnpicklingError by its first bytes), a Lightning .ckpt or another pickle: one
    sentence, the file left as it was. Ray's driver reads it before Ray starts: refused in its
    workers, Ray would start them again, --max-failures times."""
    ckpt = log_dir / "checkpoints" / "r.pt"
    ckpt.parent.mkdir(parents=True)
    FOREIGN[what](ckpt)
    before = ckpt.read_bytes()
    proc = run_script(script, *TINY, "--run-name", "r", "--resume", log_dir=log_dir, check=False)
    assert_clean_error(proc, f"checkpoint {ckpt}", SAID[what])
    assert ckpt.read_bytes() == before


@pytest.mark.parametrize("script", ["_trainup_gpu.py", "_trainup_ddp.py"])
def test_a_sweep_larger_than_the_data_is_one_sentence_not_a_run_of_nothing(script, log_dir):
    proc = run_script(
        script, *TINY, "--device", "cpu", "--sweep", "100000", log_dir=log_dir, check=False
    )
    assert_clean_error(
        proc, "--sweep 100000: every batch size is larger than the 64 training samples"
    )
    assert proc.returncode == 2 and "finished" not in proc.stdout
    assert not list(log_dir.glob("*.lock"))


@pytest.mark.parametrize("script", ["_trainup_cpu.py", "_trainup_ddp.py"])
def test_a_log_dir_that_cannot_be_made_is_one_sentence_also_for_root(script, tmp_path):
    """Under /proc nothing can be made, yet os.access tells root it can write there."""
    proc = run_script(
        script, *TINY, log_dir="/proc/trainup/logs", checkpoint_dir=tmp_path / "ck", check=False
    )
    assert_clean_error(proc, "--log-dir /proc/trainup/logs cannot be created or written")
    assert proc.returncode == 2 and not (tmp_path / "ck").exists()


def test_ray_asked_for_cuda_on_a_machine_without_a_gpu_refuses_in_one_sentence(log_dir):
    """Ray's workers would otherwise train on the CPU, and the run end with exit 0."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = run_script("_trainup_ray.py", *TINY, "--device", "cuda", log_dir=log_dir, check=False)
    assert_clean_error(proc, "--device cuda asks for a GPU for each Ray worker")
    assert proc.returncode == 2
