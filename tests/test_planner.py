"""lessons/bylesson/planner.py: its parameter count against the course's transformer, its activation
term against MemTracker's measurement, its time terms against hand computations, and its choices
(what fits, the fastest first). Its model-state term is checked against a real two-process run in
tests/test_fsdp.py."""

import pytest

from lessons import hardware, perfmodel as pm
from lessons.bylesson import activations, planner
from trainup import transformer

SMALL = planner.Transformer(layers=2, hidden=64, heads=4, seq=32)
NODE = hardware.NODES["dgx_h100"]


def test_the_parameter_count_is_the_course_transformers():
    stack = transformer.stack(SMALL.layers, SMALL.hidden, SMALL.heads)
    assert SMALL.params() == sum(p.numel() for p in stack.parameters())


@pytest.mark.parametrize("mode", planner.RECOMPUTE)
def test_the_activation_term_is_what_memtracker_measures(mode):
    batch = 4
    # the course's Layer computes its attention by hand: its scores are kept (unfused)
    lay = planner.Layout(dp=1, recompute=mode, micro=batch, attention="unfused")
    planned = planner.memory(SMALL, lay, global_batch=batch, precision="32")["activations"]
    measured = activations.held(mode, SMALL.layers, SMALL.hidden, SMALL.heads, SMALL.seq, batch)
    assert planned == pytest.approx(measured, rel=0.10), (mode, planned, measured)


def test_memory_by_hand():
    m = planner.Transformer(layers=8, hidden=1024, heads=8, seq=512)
    psi = m.params()
    # ZeRO-1 over dp 4, the ZeRO paper's fp16 with Adam (2+2+12): weights and gradients whole,
    # the 12 bytes split
    lay = planner.Layout(dp=4, tp=2, pp=2, stage="optimizer", micro=2, attention="unfused")
    owned = psi / 4
    paper = planner.memory(m, lay, global_batch=64, precision="16")
    assert (paper["param"], paper["grad"], paper["optim"]) == pytest.approx(
        (2 * owned, 2 * owned, 12 * owned / 4)
    )
    # bf16 as FSDP2's MixedPrecisionPolicy keeps it: fp32 weights and gradients, Adam's 8 split
    mem = planner.memory(m, lay, global_batch=64, precision="bf16")
    assert (mem["param"], mem["grad"], mem["optim"]) == pytest.approx(
        (4 * owned, 4 * owned, 8 * owned / 4)
    )
    assert mem["activations"] == paper["activations"]  # both compute in 16 bits
    # 1F1B: 8 micro-batches of 2, 2 in flight on the first stage, 4 layers each, split over tp 2
    one_layer = 2 * (16 * 512 * 2 * 1024 + 8 * 512 * 512 * 2)
    assert mem["activations"] == pytest.approx(4 * 2 * one_layer / 2)
    # ZeRO-1 runs over DDP: its buckets, a second copy of the gradients (fp32 reductions; the
    # fp16 recipe's in 2 bytes), unless .grad is a view of them
    assert mem["buckets"] == pytest.approx(4 * owned) and paper["buckets"] == pytest.approx(
        2 * owned
    )
    assert planner.memory(m, lay, 64, "bf16", bucket_view=True)["buckets"] == 0
    assert mem["total"] == pytest.approx(sum(v for k, v in mem.items() if k != "total"))


def test_the_step_by_hand():
    m = planner.Transformer(layers=4, hidden=512, heads=8, seq=256)
    lay = planner.Layout(dp=2, tp=2, pp=2, micro=1, attention="unfused")
    t = planner.step(m, lay, global_batch=16, node=NODE, precision="bf16", mfu=0.5)
    peak = 989e12
    assert t["compute"] == pytest.approx(16 * m.flops_per_sample() / (8 * peak * 0.5))
    # 8 micro-batches a replica; tp inside the node: 4 all-reduces a layer, 2 layers a stage
    ar = pm.ring_all_reduce(256 * 512 * 2, 2, *NODE.intra_link())
    assert t["tp"] == pytest.approx(4 * 2 * 8 * ar)
    # the gradients reduced in fp32 (FSDP2's reduce_dtype, DDP's fp32 gradients under autocast)
    assert t["dp"] == pytest.approx(pm.ring_all_reduce(m.params() / 4 * 4, 2, *NODE.intra_link()))
    assert t["bubble"] == pytest.approx(1 / 9)  # (p-1)/(m+p-1)
    assert t["total"] == pytest.approx(
        pm.step_time(t["compute"] + t["tp"], t["dp"], buckets=8, bubble=1 / 9)
    )


def test_recomputation_costs_time_and_saves_memory():
    m = planner.llama_shaped(2048, seq=2048)
    by = {
        r: (
            planner.memory(m, planner.Layout(8, recompute=r, attention="unfused"), 64)[
                "activations"
            ],
            planner.step(m, planner.Layout(8, recompute=r, attention="unfused"), 64, NODE)[
                "compute"
            ],
        )
        for r in planner.RECOMPUTE
    }
    assert by["none"][0] > by["selective"][0] > by["full"][0]
    assert by["none"][1] < by["selective"][1] < by["full"][1]
    # full recomputation runs the forward again: about 4/3 of the step's FLOPs
    assert by["full"][1] / by["none"][1] == pytest.approx(4 / 3, rel=0.05)


def test_the_plan_puts_what_fits_first_and_the_fastest_of_it_first():
    m = planner.llama_shaped(4096)  # about 6.4 billion parameters
    df = planner.plan(m, global_batch=64, gpus=8, node=NODE)
    assert df["fits"].iloc[0] and not df["fits"].iloc[-1]
    fits = df[df["fits"]]
    assert list(fits["step_s"]) == sorted(fits["step_s"])
    limit = 80 * (1 - planner.MARGIN)  # the margin kept for the context and the allocator
    assert (fits["total_gb"] <= limit).all() and (df[~df["fits"]]["total_gb"] > limit).all()
    # FSDP with tensor parallelism (lesson 09c's 2-D layout) is a layout; ZeRO-2/3 with pp is not
    assert ((df["zero"] == "ZeRO-3") & (df["tp"] == 2)).any()
    assert not (df["zero"].isin(["ZeRO-2", "ZeRO-3"]) & (df["pp"] > 1)).any()
    # with fused attention (the default) selective recomputation is no layout of its own
    assert set(df["recompute"]) == {"none", "full"}
    # plain DDP holds 16 bytes a parameter (bf16 as FSDP2 keeps it: fp32 states): over 80 GB
    ddp = df[(df["tp"] == 1) & (df["pp"] == 1) & (df["zero"] == "DDP")]
    assert (ddp["states_gb"] > 100).all() and not ddp["fits"].any()
    # every layout uses all 8 GPUs, tp within one node and dividing the heads
    assert ((df["dp"] * df["tp"] * df["pp"]) == 8).all() and (m.heads % df["tp"] == 0).all()


def test_a_model_too_large_for_the_gpus_fits_nowhere():
    df = planner.plan(planner.llama_shaped(16384), global_batch=8, gpus=8, node=NODE)
    assert not df["fits"].any()


def test_more_memory_holds_a_larger_model():
    t = planner.fits_table(NODE, gpus=8, memory_gbs=(24, 80, 141))
    assert list(t["params_b"]) == sorted(t["params_b"]) and t["params_b"].iloc[0] > 0
    assert len(set(t["params_b"])) == 3
    for _, r in t.iterrows():  # the largest that fits: one 1024 wider does not
        wider = planner.llama_shaped(r["hidden"] + 1024)
        assert not planner.plan(wider, 64, 8, NODE, r["memory_gb"])["fits"].any()
    assert t["step_s"].notna().all()


def test_a_llama_shaped_layout_counted_by_hand():
    """Every term of the planner for the course's transformer at Llama 2 7B's width and depth
    (h 4096, 32 layers of 32 heads, s 4096), bf16 (FSDP2's recipe), global batch 64 on one DGX
    H100, micro-batches of 1, fused attention: written out from the formulas, term by term."""
    h, L, a, s, batch, mfu = 4096, 32, 32, 4096, 64, 0.4
    m = planner.llama_shaped(h)
    psi = L * (12 * h * h + 13 * h)  # qkv, proj, a 4h MLP, two LayerNorms, biases
    assert m.params() == psi
    alpha, beta = NODE.intra_link()

    def ring(n, p):  # ring all-reduce: 2(p-1) latencies, 2(p-1)/p of the bytes each way
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / beta

    # forward and backward 6 FLOPs a weight and token, attention's 12 L h s a token (PaLM);
    # fused attention's backward recomputes the scores q k^T: 2 s^2 h a layer and sample
    flops = batch * (s * (6 * psi + 12 * L * h * s) + 2 * L * h * s * s)
    peak = 989e12  # H100 SXM, dense bf16
    # fused attention keeps per layer and token 16 h values in bf16 and one fp32 log-sum-exp a
    # head; no a s^2 scores
    layer = 2 * 16 * s * h + 4 * a * s

    # dp 8, ZeRO-3 (FSDP): states 4+4+8 bytes a parameter, all of them over 8
    lay = planner.Layout(dp=8, stage="parameters")
    mem = planner.memory(m, lay, batch)
    assert mem["param"] == pytest.approx(4 * psi / 8) and mem["grad"] == pytest.approx(4 * psi / 8)
    assert mem["optim"] == pytest.approx(8 * psi / 8) and mem["buckets"] == 0  # no DDP
    assert mem["activations"] == pytest.approx(L * layer)  # one micro-batch in flight
    assert mem["total"] == pytest.approx(16 * psi / 8 + L * layer)
    t = planner.step(m, lay, batch, NODE)
    assert t["compute"] == pytest.approx(flops / (8 * peak * mfu))
    # 8 micro-batches a replica (64 / 8 / 1), each: the parameters all-gathered in bf16 in forward
    # and again in backward, the gradients reduce-scattered in fp32; a gather or a scatter is half
    # a ring all-reduce of its bytes
    per_micro = 2 * ring(2 * psi, 8) / 2 + ring(4 * psi, 8) / 2
    assert t["dp"] == pytest.approx(8 * per_micro)
    assert t["tp"] == 0 and t["bubble"] == 0

    # dp 4 x tp 2, DDP: a GPU owns half of each layer; DDP's buckets copy its fp32 gradients
    lay = planner.Layout(dp=4, tp=2, stage="none")
    mem = planner.memory(m, lay, batch)
    owned = psi / 2
    assert (mem["param"], mem["grad"], mem["optim"], mem["buckets"]) == pytest.approx(
        (4 * owned, 4 * owned, 8 * owned, 4 * owned)
    )
    assert mem["activations"] == pytest.approx(L * layer / 2)  # tp 2 with sequence parallelism
    t = planner.step(m, lay, batch, NODE)
    assert t["dp"] == pytest.approx(ring(4 * owned, 4))  # once a step: no_sync in between
    # 16 micro-batches a replica, 4 all-reduces of s h bf16 values a layer each
    assert t["tp"] == pytest.approx(16 * 4 * L * ring(2 * s * h, 2))
    assert t["compute"] == pytest.approx(flops / (8 * peak * mfu))

    # unfused attention, as an option: the a s^2 scores in bf16 are kept too
    lay = planner.Layout(dp=8, stage="parameters", attention="unfused")
    assert planner.memory(m, lay, batch)["activations"] == pytest.approx(
        L * 2 * (16 * s * h + a * s * s)
    )
    assert planner.step(m, lay, batch, NODE)["compute"] == pytest.approx(
        batch * s * (6 * psi + 12 * L * h * s) / (8 * peak * mfu)
    )


def test_context_parallel_shards_the_states_over_dp_x_cp_and_cuts_the_tokens():
    """Layout.cp (lesson 09g's 4-D job): the cp ranks of a replica hold the same parameters, so
    ZeRO-3 shards them over dp x cp (torchtitan's dp_shard_cp), and each GPU keeps the
    activations of its seq / cp tokens; the step's time has no term for the ring and refuses."""
    m = planner.Transformer(layers=8, hidden=1024, heads=8, seq=512)
    psi = m.params()
    flat = planner.Layout(dp=2, tp=2, pp=2, stage="parameters", micro=2)
    cut = planner.Layout(dp=2, tp=2, pp=2, stage="parameters", micro=2, cp=2)
    assert cut.gpus == 16 and cut.label() == "dp2 x cp2 x tp2 x pp2, ZeRO-3"
    owned = psi / (2 * 2)  # tp 2, pp 2: a GPU owns a quarter of the layers' parameters
    assert planner.states(psi, cut, (8, 8, 16)) == pytest.approx(
        (8 * owned / 4, 8 * owned / 4, 16 * owned / 4)  # over dp 2 x cp 2
    )
    whole, halved = planner.memory(m, flat, 64), planner.memory(m, cut, 64)
    assert halved["activations"] == pytest.approx(whole["activations"] / 2)
    assert halved["param"] == pytest.approx(whole["param"] / 2)
    with pytest.raises(ValueError, match="no term for context parallelism's ring"):
        planner.step(m, cut, 64, NODE)
