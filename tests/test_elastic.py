"""Lesson 04c: an elastic torchrun job loses a node, goes on alone, takes the node back, and ends
with the parameters of one process (float64, the same global batch at every size)."""

import pytest

from conftest import ROOT, drill_beside_its_baseline, notebook_or_own
from lessons import checks
from lessons.bylesson import elastic
from lessons.log_reader import read_run

# Notebook 04c makes this very drill and its one-process run (elastic.FLAGS): in a session that
# runs the notebook, these tests check the notebook's (conftest runs this file after the others).
READS_NOTEBOOK = "notebooks/04c_elastic.ipynb"


@pytest.fixture(scope="module")
def drill(tmp_path_factory, request):
    """The drill and the name of its one-process run: the notebook's where this session ran it."""

    def load():
        d = elastic.load("elastic", ROOT / "logs", ROOT / "checkpoints")
        return d and (d, "elastic_one")

    return notebook_or_own(request, READS_NOTEBOOK, load, lambda: own(tmp_path_factory))


def own(tmp_path_factory):
    """The drill and its one-process run, made here."""
    return drill_beside_its_baseline(
        tmp_path_factory.mktemp("elastic"),
        elastic.FLAGS,
        elastic.environment(),
        lambda logs, ckpt: elastic.drill("elastic", logs, ckpt, show=lambda *_: None),
    )


def test_the_job_loses_a_node_goes_on_alone_and_takes_it_back(drill):
    drill, _ = drill
    starts = elastic.membership(drill.log)
    killed = elastic.kill_s(drill)  # on the clock of membership's start_s
    before, after = starts[starts.start_s < killed], starts[starts.start_s > killed]
    assert before.world_size.iloc[-1] == 2  # the kill hit a job of 2 nodes
    assert after.world_size.tolist() == [1, 2]  # alone, then both again
    assert (
        after.restart_count.iloc[0] >= 1
    )  # the loss was a failure: torchrun restarted the survivor
    assert (
        starts.per_rank_batch * starts.world_size == starts.global_batch
    ).all()  # the global batch kept
    assert drill.returncodes == {"node A": 0, "node B again": 0}
    # the whole node went: its agent and its worker (in a session of its own) by the same kill
    assert len(drill.killed) >= 2 and not elastic.alive(drill.killed)
    gone = drill.events["node B gone"] - drill.events["node B killed"]
    assert gone < 10, f"node B's processes took {gone:.0f} s to end after the kill"


def test_the_survivor_resumed_from_a_checkpoint_and_the_return_stopped_at_a_step(drill):
    drill, _ = drill
    out = drill.outputs["node A"]
    assert (
        "another rank of this job is gone" in out
        and "torchrun restart 1: resuming at epoch 2" in out
    )
    assert (
        "SIGTERM: stopped in epoch" in out
    )  # the node's return: the run saved where it was, at a step
    costs = elastic.costs(drill)
    assert (
        costs["restart_after_loss_s"] > 0 and costs["rejoin_s"] > 0 and costs["training_lost_s"] > 0
    )


def test_the_elastic_job_ends_like_one_process(drill):
    drill, one = drill
    worst = checks.same_parameters("elastic", one, checkpoint_dir=drill.checkpoint_dir)
    assert worst <= checks.FLOAT64_ATOL
    run = read_run(drill.log)
    assert run["problems"] == [] and run["summary"]["status"] == "finished"
    assert [e["epoch"] for e in run["epochs"]] == list(range(1, 7))
    assert all(
        e["samples"] == 1024 for e in run["epochs"]
    )  # every epoch's samples, whatever the size


def test_a_finished_drill_reads_back_from_its_files(drill):
    """What notebook_passed's sharing reads: the drill as drill() returned it."""
    drill, _ = drill
    assert elastic.load("elastic", drill.log.parent, drill.checkpoint_dir) == drill
    assert elastic.load("no_such_drill", drill.log.parent, drill.checkpoint_dir) is None


def test_the_membership_picture_draws_the_logs_starts_over_time(drill):
    d, _ = drill
    starts, lives, marks = elastic.spans(d)
    assert [s["world_size"] for s in starts] == elastic.membership(d.log).world_size.tolist()
    assert [s["nodes"] for s in starts] == [["node A", "node B"], ["node A"], ["node A", "node B"]]
    assert all(
        a["end_s"] <= b["start_s"] for a, b in zip(starts, starts[1:])
    )  # nobody trains between
    assert starts[0]["end_s"] == marks["killed"] and starts[1]["start_s"] <= marks["back"]
    ax = elastic.plot_membership(d, "test_elastic_membership").axes[0]
    assert len(ax.patches) == 5  # a bar per node per start: 2 + 1 + 2
    assert [t.get_text() for t in ax.get_yticklabels()] == ["node A", "node B"]
    assert "seconds" in ax.get_xlabel() and "membership" in ax.get_title()
