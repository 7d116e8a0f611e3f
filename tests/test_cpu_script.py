"""_trainup_cpu.py run for real on tiny data, standalone, as a learner runs it."""
from conftest import assert_clean_error, run_script
from lessons import report
from trainup import data


def test_quick_run_learns_and_writes_its_log(log_dir):
    proc = run_script("_trainup_cpu.py", "--quick", "--run-name", "q", log_dir=log_dir)
    assert "finished" in proc.stdout
    run = report.read_run(log_dir / "q.jsonl")
    assert run["problems"] == [] and run["summary"]["status"] == "finished"
    assert run["epochs"][-1]["loss"] < run["epochs"][0]["loss"]
    assert run["env"]["world_size"] == 1 and run["config"]["args"]["quick"] is True
    assert (log_dir / "q.stdout").read_text() == proc.stdout  # stdout is kept in logs/<run>.stdout
    assert (log_dir / "checkpoints" / "q.pt").exists()


def test_two_hogwild_processes_train_one_model(log_dir):
    run_script("_trainup_cpu.py", "--quick", "--num-processes", "2", "--threads", "1", "--run-name", "h",
               log_dir=log_dir)
    run = report.read_run(log_dir / "h.jsonl")
    assert run["problems"] == [] and run["env"]["world_size"] == 2 and run["env"]["backend"] == "hogwild"
    assert run["epochs"][-1]["loss"] < run["epochs"][0]["loss"]
    assert run["epochs"][0]["samples"] == 512  # the two shares make one whole epoch


def test_resume_continues_from_the_checkpoint(log_dir):
    run_script("_trainup_cpu.py", "--quick", "--epochs", "1", "--run-name", "r", log_dir=log_dir)
    run_script("_trainup_cpu.py", "--quick", "--epochs", "2", "--resume", "--run-name", "r", log_dir=log_dir)
    run = report.read_run(log_dir / "r.jsonl")
    assert [e["epoch"] for e in run["epochs"]] == [1, 2] and run["summary"]["status"] == "finished"


def test_mnist_from_idx_files_on_disk(log_dir, tmp_path):
    data.write_mnist_idx(tmp_path / "data", train_size=128, test_size=64)
    run_script("_trainup_cpu.py", "--dataset", "mnist", "--data-dir", tmp_path / "data", "--epochs", "2",
               "--run-name", "m", log_dir=log_dir)
    assert report.read_run(log_dir / "m.jsonl")["config"]["args"]["dataset"] == "mnist"


def test_bad_input_is_one_sentence_and_a_nonzero_exit(log_dir, tmp_path):
    for flags, words in [(["--batch-size", "0"], ["--batch-size", "greater than 0"]),
                         (["--dataset", "imagenet"], ["--dataset", "invalid choice"]),
                         (["--dataset", "mnist", "--data-dir", tmp_path / "missing"], ["does not exist"]),
                         (["--num-processes", "4", "--batch-size", "2"], ["cannot be split"])]:
        proc = run_script("_trainup_cpu.py", "--quick", *flags, log_dir=log_dir, check=False)
        assert proc.returncode == 2
        assert_clean_error(proc, *words)
