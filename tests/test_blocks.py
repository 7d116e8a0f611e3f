"""_trainup_blocks.py, the parent of the block-stack lessons (06, 09): DDP on the block stack, two
ranks against one process, and its bad input."""

import importlib
import os
import sys

import pytest
import torch

from conftest import SCRIPTS, Ranks, assert_clean_error, finish_job, in_process
from lessons import checks, launch, report
from trainup import models

# 4 steps of 32 an epoch; float64 (checks.PROOF): sums in another order move about 1e-16
TINY = [
    "--quick",
    "--train-size",
    "128",
    "--test-size",
    "64",
    "--batch-size",
    "32",
    "--blocks",
    "2",
    "--width",
    "32",
    "--no-progress",
    *checks.PROOF,
]


def blocks_main():
    sys.path.insert(0, str(SCRIPTS))
    return importlib.import_module("_trainup_blocks").main


def in_a_group_of_one(run):
    """run(), which joins a 1-process gloo group in this interpreter; then its environment
    (MASTER_ADDR/PORT, set by setup()) is put back and the group left, also where the run stopped
    with an error inside it (the process would have exited; this one goes on to other tests)."""
    saved = dict(os.environ)
    try:
        return run()
    finally:
        os.environ.clear()
        os.environ.update(saved)
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """two: 2 DDP ranks (started as srun starts them); one: the baseline, in this interpreter while
    they run."""
    log_dir = tmp_path_factory.mktemp("blocks") / "logs"
    out = ["--log-dir", str(log_dir), "--checkpoint-dir", str(log_dir / "checkpoints")]
    script = str(SCRIPTS / "_trainup_blocks.py")
    two = Ranks([sys.executable, script, *TINY, "--run-name", "two", *out], launch.environment())
    in_a_group_of_one(lambda: blocks_main()([*TINY, "--run-name", "one", *out]))
    done = finish_job(two)
    assert done.returncode == 0, done.stderr[-3000:]
    return log_dir


def test_two_ranks_end_with_the_parameters_of_one_process(runs):
    params = {
        n: torch.load(runs / "checkpoints" / f"{n}.pt", weights_only=True)["model"]
        for n in ("one", "two")
    }
    for k in params["one"]:
        torch.testing.assert_close(
            params["two"][k], params["one"][k], rtol=0, atol=checks.FLOAT64_ATOL, msg=k
        )
    torch.manual_seed(1)
    init = models.BlockStack((1, 28, 28), 10, 2, 32).double().state_dict()
    moved = max((params["one"][k] - init[k]).abs().max().item() for k in init)
    assert moved > 100 * checks.FLOAT64_ATOL  # it trained, far beyond the tolerance
    one, two = (report.read_run(runs / f"{n}.jsonl") for n in ("one", "two"))
    assert two["problems"] == [] and two["env"]["world_size"] == 2
    assert [e["samples"] for e in two["epochs"]] == [e["samples"] for e in one["epochs"]]
    assert [e["samples"] for e in one["epochs"]] == [128, 128]
    assert (two["config"]["args"]["blocks"], two["config"]["args"]["width"]) == (2, 32)


def test_bad_input_is_one_sentence_and_a_nonzero_exit(capsys, log_dir):
    main = blocks_main()
    flags = [*TINY, "--log-dir", log_dir, "--checkpoint-dir", log_dir]
    synthetic = in_a_group_of_one(
        lambda: in_process(main, [*flags, "--dataset", "synthetic"], capsys)
    )
    assert_clean_error(synthetic, "held in memory")
    assert not torch.distributed.is_initialized()
    ckpt = log_dir / "r.pt"  # --resume (the stop signal's checkpoint) finds a file of text
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    ckpt.write_text("not a checkpoint")
    resume = in_a_group_of_one(
        lambda: in_process(main, [*flags, "--run-name", "r", "--resume"], capsys)
    )
    assert_clean_error(resume, f"checkpoint {ckpt}", "cannot be read")
