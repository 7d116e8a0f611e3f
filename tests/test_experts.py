"""_trainup_experts.py run for real: a transformer whose MLPs are mixtures of experts, the experts
spread over 2 processes (torchrun, gloo) and the tokens sent to them by all-to-all. With a capacity
that drops nothing it must end with the parameters of one process (float64); with a small one it
drops tokens and its log counts them. Bad layouts: one sentence, exit status 2, checked in this
process (no job started). The layer itself on one process: which assignments a capacity drops,
the outputs they leave, and the Switch load-balancing loss on hand-made examples."""

import math
from types import SimpleNamespace

import pytest
import torch

from conftest import assert_clean_error, finish_ok, in_process, start_run
from lessons import checks, report
from trainup.parallel import experts as moe
from trainup import transformer

SCRIPT = "_trainup_experts.py"  # under scripts/ (conftest.SCRIPTS)
LAYERS, WIDTH, HIDDEN, HEADS, EXPERTS, TOP_K = 2, 16, 32, 4, 4, 2
TRAIN, BATCH, ROWS = 256, 64, 28  # an image's rows are its tokens
SIZE = [
    "--quick",
    "--epochs",
    1,
    "--train-size",
    TRAIN,
    "--test-size",
    128,
    "--batch-size",
    BATCH,
    "--blocks",
    LAYERS,
    "--width",
    WIDTH,
    "--hidden",
    HIDDEN,
    "--heads",
    HEADS,
    "--experts",
    EXPERTS,
    "--top-k",
    TOP_K,
    *checks.PROOF,
    "--no-progress",
]
NO_DROPS = ["--capacity-factor", EXPERTS / TOP_K]  # capacity = every token: none can drop
SMALL = ["--capacity-factor", 0.5, "--top-k", 1]  # half the tokens at most: many drop
ATOL = checks.FLOAT64_ATOL


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The one-process baseline, its 2-process twin, and a 2-process run that drops tokens, side
    by side: {name: log folder}."""
    log_dir = tmp_path_factory.mktemp("experts") / "logs"
    wanted = {"moe_one": (1, NO_DROPS), "moe_ep2": (2, NO_DROPS), "moe_drops": (2, SMALL)}
    started = {
        name: start_run(SCRIPT, nproc, SIZE + flags, log_dir, name)
        for name, (nproc, flags) in wanted.items()
    }
    for name, proc in started.items():
        finish_ok(proc, name)
    return log_dir


def params(log_dir, name):
    return torch.load(log_dir / "checkpoints" / f"{name}.pt", weights_only=True)["model"]


def records(log_dir, name, kind):
    return [r for r in report.read_run(log_dir / f"{name}.jsonl")["extra"] if r["type"] == kind]


def test_two_expert_parallel_ranks_end_with_the_parameters_of_one_process(runs):
    one, two = params(runs, "moe_one"), params(runs, "moe_ep2")
    assert two.keys() == one.keys()  # every expert gathered, under the one-process names
    assert sum(".experts." in k for k in one) == LAYERS * EXPERTS * 4  # fc1, fc2: weight, bias
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=0, atol=ATOL, msg=k)
    first = report.read_run(runs / "moe_one.jsonl")["epochs"]
    run = report.read_run(runs / "moe_ep2.jsonl")
    assert run["problems"] == [] and run["summary"]["status"] == "finished"
    for e, f in zip(run["epochs"], first, strict=True):
        assert e["loss"] == pytest.approx(f["loss"], abs=ATOL)
        assert e["test_loss"] == pytest.approx(f["test_loss"], abs=ATOL)
        assert e["samples"] == f["samples"] == TRAIN  # each sample once, on one rank


def test_the_proof_trained_every_expert_far_beyond_the_tolerance(runs):
    """Each expert had tokens to learn from and moved, and nothing dropped: the proof covers every
    expert's gradient, and both choices of every token."""
    torch.manual_seed(1)  # the scripts' default --seed, as the script builds its model
    init = transformer.Classifier((1, 28, 28), 10, LAYERS, WIDTH, HEADS, HIDDEN)
    args = SimpleNamespace(
        width=WIDTH, hidden=HIDDEN, experts=EXPERTS, top_k=TOP_K, capacity_factor=EXPERTS / TOP_K
    )
    init = moe.swap_mlps(init, args).state_dict()
    one = params(runs, "moe_one")
    assert one.keys() == init.keys()
    assert min((one[k] - init[k]).abs().max().item() for k in one if ".experts." in k) > 100 * ATOL
    for name in ("moe_one", "moe_ep2"):
        (load,) = records(runs, name, "expert_load")
        assert load["dropped"] == 0 and min(load["routed"]) > 0
        assert sum(load["routed"]) == sum(load["received"]) == TRAIN * ROWS * LAYERS * TOP_K


def test_each_rank_holds_half_the_experts_and_all_the_rest(runs):
    (one,) = records(runs, "moe_one", "experts")
    (two,) = records(runs, "moe_ep2", "experts")
    assert two["placement"] == [[0, 1], [2, 3]] and two["experts_per_rank"] == 2
    assert one["placement"] == [[0, 1, 2, 3]]
    assert two["expert_bytes"] == [one["expert_bytes"][0] // 2] * 2
    assert two["dense_bytes"] == one["dense_bytes"] * 2  # attention, norms, router: whole on each
    per_expert = (WIDTH * HIDDEN + HIDDEN + HIDDEN * WIDTH + WIDTH) * 8  # float64
    assert one["expert_bytes"] == [LAYERS * EXPERTS * per_expert]


def test_a_small_capacity_drops_tokens_and_the_log_counts_them(runs):
    run = report.read_run(runs / "moe_drops.jsonl")
    assert run["problems"] == [] and run["summary"]["status"] == "finished"
    (load,) = records(runs, "moe_drops", "expert_load")
    assignments = TRAIN * ROWS * LAYERS  # top-k 1: one per token and layer
    steps, per_rank_tokens = TRAIN // BATCH, BATCH // 2 * ROWS
    assert load["capacity"] == math.ceil(0.5 * per_rank_tokens / EXPERTS)
    assert sum(load["routed"]) == assignments
    assert sum(load["received"]) + load["dropped"] == assignments
    # an expert takes at most `capacity` from each rank, in each layer and step
    most = load["capacity"] * 2 * LAYERS * steps  # from 2 ranks
    assert all(r <= 2 * most for r in load["received"])  # 2 experts a rank
    assert load["dropped"] >= assignments - EXPERTS * most > 0  # at least half of them


@pytest.mark.parametrize(
    "world, flags, words",
    [
        (2, ["--experts", 3], ["--experts 3 cannot be shared by 2 processes"]),
        (
            1,
            ["--experts", 4, "--top-k", 5],
            ["--top-k 5 asks each token for more experts than the 4"],
        ),
        (1, ["--width", 16, "--heads", 5], ["--width 16 cannot be split into --heads 5"]),
        (1, ["--aux-loss-weight", -1], ["--aux-loss-weight -1.0 would reward piling"]),
        (4, ["--experts", 4, "--batch-size", 66], ["--batch-size 66", "over 4 processes"]),
    ],
)
def test_bad_layouts_are_one_sentence_and_a_nonzero_exit(
    monkeypatch, capsys, log_dir, world, flags, words
):
    import _trainup_experts

    for k, v in (("RANK", "0"), ("WORLD_SIZE", str(world)), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(k, v)
    proc = in_process(
        _trainup_experts.main,
        ["--quick", *map(str, flags), "--log-dir", log_dir, "--checkpoint-dir", log_dir],
        capsys,
    )
    assert proc.returncode == 2
    assert_clean_error(proc, *words)
    assert not log_dir.exists()  # nothing half-written, and no process group was joined


# ------------------------------------------------------------------ the layer on one process


def layer(router, experts=2, top_k=1, factor=1.0):
    """An MoE layer over 2 features whose router's weight is `router` (experts x 2), float64."""
    torch.manual_seed(0)
    m = moe.MoE(2, 3, experts, top_k, factor).double()
    with torch.no_grad():
        m.router.weight.copy_(torch.tensor(router, dtype=torch.float64))
    return m


def test_assignments_over_capacity_are_dropped_counted_and_leave_nothing():
    m = layer([[1.0, 0.0], [0.0, 0.0]])  # every token below prefers expert 0
    x = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [4.0, 0.0]], dtype=torch.float64)
    assert moe.capacity(4, 2, 1, 1.0) == 2  # 1 x 4 tokens x 1 / 2 experts
    out = m(x)
    assert m.routed.tolist() == [4, 0] and m.dropped == 2 and m.received == 2
    probs = torch.softmax(m.router(x), -1)[:, 0]
    want = probs[:2, None] * m.experts["0"](x[:2])  # the earlier tokens keep their places
    torch.testing.assert_close(out[:2], want, rtol=0, atol=1e-15)
    assert out[2:].abs().max() == 0  # dropped: the layer adds nothing, the residual carries it
    with torch.no_grad():  # a test pass counts nothing
        m.eval()(x)
    assert m.dropped == 2


def test_first_choices_take_their_places_before_any_second_choice():
    choices = torch.tensor([[0, 1], [1, 0], [0, 1]])  # (tokens, k): each row a token's choices
    fits = moe.kept(choices, experts=2, limit=2)
    # expert 0: tokens 0 and 2 chose it first, so token 1's second choice drops; expert 1:
    # token 1 chose it first, token 0 second, so token 2's second choice drops
    assert fits.tolist() == [[True, True], [True, False], [True, False]]


def test_outputs_are_the_chosen_experts_weighed_by_their_probabilities_not_renormalised():
    m = layer([[1.0, -1.0], [0.5, 2.0], [0.0, 0.3]], experts=3, top_k=2, factor=1.5)
    x = torch.tensor([[1.0, 2.0], [-1.0, 0.5], [0.3, -0.7]], dtype=torch.float64)
    out = m(x)
    assert m.dropped == 0  # factor E / k: room for every token
    probs = torch.softmax(m.router(x), -1)
    want = torch.zeros_like(x)
    for t in range(len(x)):
        for e in probs[t].topk(2).indices.tolist():
            want[t] += probs[t, e] * m.experts[str(e)](x[t])
    torch.testing.assert_close(out, want, rtol=0, atol=1e-15)


def test_the_switch_balance_loss_on_hand_examples():
    """E * sum_i f_i * P_i with E = 2: token (1, 0) gets logits (ln 3, 0) from the first router,
    so probabilities (3/4, 1/4)."""
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    piled = layer([[math.log(3), math.log(3)], [0.0, 0.0]])  # both tokens: (3/4, 1/4), expert 0
    piled.train()(x)
    # f = (1, 0), P = (3/4, 1/4): 2 x (1 x 3/4) = 1.5
    assert piled.aux.item() == pytest.approx(1.5, abs=1e-15)
    piled.aux.backward()  # P passes a gradient to the router; f, a count, does not
    assert piled.router.weight.grad.abs().max() > 0
    spread = layer([[math.log(3), 0.0], [0.0, math.log(3)]])  # one token to each expert
    spread.train()(x)
    # f = (1/2, 1/2), P = (1/2, 1/2): 2 x (1/4 + 1/4) = 1, as for any even spread
    assert spread.aux.item() == pytest.approx(1.0, abs=1e-15)
