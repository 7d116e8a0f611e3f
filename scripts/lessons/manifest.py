"""The course's scripts, one entry each: the lesson that teaches it, the script it grows from, how
far its diff may go, how it chooses its device, its strategies in lesson 10's report (which runs are
theirs, which one-process run each must equal: lesson 10a's proof) and the deliberate breakages that
tests/test_breakages.py makes of it. Every registry reads this one list: the ladder
(launch.LADDER), the device placement (placement.py), the scaling report's strategies
(scaling_report.STRATEGIES), the equivalence proof's rows (equivalence.py), the breakages and the
structure tests. A new lesson's script is one entry here (tests/test_manifest.py).

    from lessons import manifest
    manifest.SCRIPTS["_trainup_ddp.py"].parent     # '_trainup_gpu.py'
    manifest.strategies()                          # the report's rows, in course order
"""
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Strategy:
    """One row of lesson 10's report and, with a baseline, of lesson 10a's proof."""
    name: str              # its row in both tables
    family: str            # one curve in the scaling plot (DDP with 1, 2, 4 ranks is one family)
    where: dict            # a run is this strategy's when each fact equals the value (a tuple:
                           # one of them; a function: true for it); without "script", its
                           # entry's script
    baseline: dict = None  # the one-process run it must equal (within equivalence.TOLERANCE,
                           # one for all); None: a baseline itself, or no claim
    needs: tuple = ()      # ("script", file), ("module", name), ("gpus", n): without it, skipped
    made_by: str = ""      # where the course makes such a run (said when none is in logs/)
    # Dropout's masks come from the random stream, which each rank draws from alone (and the DDP
    # script in another order than the one-device script even on 1 rank): "always" or "several
    # devices" compares only runs without dropout then. BatchNorm without --sync-bn normalises each
    # device's shard: never compared.
    dropout_off: str = ""


@dataclass(frozen=True)
class Script:
    """One script of scripts/. `budget`: the most changed lines (diff's < and > lines) its diff
    against `parent` may have, so that the diff teaches the lesson; a step that grows needs its
    budget raised here, in review, where the reason shows. `device_flag`: the flag that says
    where it runs and its GPU value (None: the script chooses no device); `device_default`: that
    flag's value when a job names none. `strategies`: its rows in lesson 10's report;
    `transformer`: it trains a transformer (another model than the block stack's, whatever its
    flags say); `breakages`: the names of tests/test_breakages.py's breakages that patch it."""
    name: str
    notebook: str
    parent: str | None = None
    budget: int | None = None
    device_flag: tuple[str, str] | None = None
    device_default: str = "auto"
    strategies: tuple[Strategy, ...] = ()
    transformer: bool = False
    breakages: tuple[str, ...] = ()


DEVICE = ("--device", "cuda")
ACCELERATOR = ("--accelerator", "gpu")  # Lightning's Trainer and Fabric

# The strategies' conditions and the one-process runs they must equal
ONE_DEVICE = dict(script="_trainup_gpu.py", devices=1)
ONE_STAGE = dict(script="_trainup_pipeline.py", stages=1)
# one device, or the DDP script alone (its own row proves it equal to one device): lesson 04c's
ONE_PROCESS = dict(script=("_trainup_gpu.py", "_trainup_ddp.py"), devices=1, elastic=False)
ABOVE_1 = lambda n: (n or 1) > 1  # noqa: E731
PIPELINES = ("naive", "gpipe", "1f1b", "interleaved1f1b", "looped_bfs", "interleaved_zb", "zbv",
             "dualpipev")
# the DDP scripts of lessons 04 and 04a2: the tuned one without --accumulate trains as plain DDP
DDP_SCRIPTS = ("_trainup_ddp.py", "_trainup_ddp_tuned.py")
ONE_SHARDING = dict(script="_trainup_fsdp.py", shard="none", devices=1)
ONE_TP = dict(script="_trainup_tp.py", devices=1)
ONE_TP_SP = dict(script="_trainup_tp_sp.py", devices=1)
ONE_CP = dict(script="_trainup_cp.py", devices=1)
ONE_MOE = dict(script="_trainup_experts.py", devices=1)
ONE_4D = dict(script="_trainup_4d.py", devices=1)
# lesson 09f's jobs, compiled or not, against one eager process: the one-device script or its own
ONE_EAGER = dict(script=("_trainup_gpu.py", "_trainup_compile.py"), devices=1,
                 compile=(None, False))


def _ddp(n):
    return Strategy(f"DDP, {n} rank{'s' * (n > 1)}", "DDP", dict(script=DDP_SCRIPTS, world_size=n,
                    accumulate=(None, 1)), ONE_DEVICE,
                    made_by="notebooks/04_ddp.ipynb (or this notebook)", dropout_off="always")


def _zero(stage, shard):
    return Strategy(f"ZeRO-{stage}{' / FSDP' * (stage == 3)} (shard {shard})", f"ZeRO-{stage}",
                    dict(shard=shard, devices=ABOVE_1), ONE_SHARDING,
                    (("script", "_trainup_fsdp.py"),), "the sharding lesson (notebook 09)")


_ENTRIES = (
    # lesson 01: the baseline, and Hogwild's processes on one shared model
    Script("_trainup_cpu.py", "01_cpu_baseline.ipynb",
           strategies=(Strategy("one process (CPU script)", "CPU", dict(devices=1)),),
           breakages=("resume ignored",)),
    Script("_trainup_hogwild.py", "01_cpu_baseline.ipynb", "_trainup_cpu.py", 66,
           strategies=(Strategy("Hogwild (CPU processes, one shared model)", "Hogwild", {}),),
           breakages=("Hogwild workers on private copies",)),
    Script("_trainup_gpu.py", "02_single_gpu.ipynb", "_trainup_cpu.py", 85, DEVICE,
           strategies=(Strategy("one device", "one device", ONE_DEVICE),)),
    # gpu -> dp shows the size every step aims at; DataParallel takes --gpus, one process
    Script("_trainup_dp.py", "03_data_parallel.ipynb", "_trainup_gpu.py", 65, strategies=(
        Strategy("DataParallel", "DataParallel", {}, ONE_DEVICE,
                 made_by="notebooks/03_data_parallel.ipynb", dropout_off="several devices"),)),
    # lesson 04's script joins and leaves in the open (init_process_group, set_device,
    # destroy_process_group): 7 lines each child replaces with its own framework's calls
    Script("_trainup_ddp.py", "04_ddp.ipynb", "_trainup_gpu.py", 87, DEVICE, strategies=(
        # lesson 04c: before the DDP rows, whose script and final world size it shares
        Strategy("elastic DDP (its world size changed)", "DDP elastic", dict(elastic=True),
                 ONE_PROCESS, made_by="notebooks/04c_elastic.ipynb", dropout_off="always"),
        _ddp(1), _ddp(2), _ddp(4)),
        breakages=("all-reduce sums instead of averaging", "every rank writes the checkpoint")),
    # lesson 04a2: accumulation, the learning rate of a larger batch, SyncBatchNorm
    Script("_trainup_ddp_tuned.py", "04a2_tuning_ddp.ipynb", "_trainup_ddp.py", 78, DEVICE,
           strategies=(Strategy("DDP, no_sync accumulation", "DDP no_sync",
                                dict(accumulate=ABOVE_1), ONE_DEVICE,
                                made_by="notebooks/04a2_tuning_ddp.ipynb", dropout_off="always"),)),
    # the collectives one by one, over the --backend it names (lesson 04a1, inside DDP)
    Script("_trainup_collectives.py", "04a1_inside_ddp.ipynb",
           breakages=("the bus bandwidth without the ring factor",)),
    # Horovod's --accumulate (backward_passes_per_step) costs 10: the step only at the K-th
    # micro-batch, zero_grad after it, the loss weighed (trainup/engines/hvd_group.Accumulation);
    # Horovod's module is one import line of its own (trainup.engines)
    Script("_trainup_horovod.py", "05_horovod.ipynb", "_trainup_ddp.py", 97, DEVICE, strategies=(
        Strategy("Horovod", "Horovod", {}, ONE_DEVICE, (("module", "horovod"),),
                 "notebooks/05_horovod.ipynb", dropout_off="always"),),
        breakages=("Horovod sums the gradients instead of averaging",
                   "Horovod without the initial broadcast")),
    # lesson 04c's, after Horovod's entry: the report lists their rows in this order
    Script("_trainup_ray.py", "04c_elastic.ipynb", "_trainup_ddp.py", 97, strategies=(
        Strategy("Ray Train (a worker killed, restarted)", "Ray", {}, ONE_PROCESS,
                 (("module", "ray"),), "notebooks/04c_elastic.ipynb", dropout_off="always"),)),
    # the block-stack lessons (06, 09, 09c) grow from one parent: each diff is its lesson
    Script("_trainup_blocks.py", "06_pipeline_parallel.ipynb", "_trainup_ddp.py", 137, DEVICE,
           "cpu"),
    # the stop signal's checkpoint: each rank saves its own stages (pipeline.save_stages), at a
    # stop and at each epoch's end, where the parent's rank 0 saves the whole replica
    Script("_trainup_pipeline.py", "06_pipeline_parallel.ipynb", "_trainup_blocks.py", 127, DEVICE,
           "cpu", strategies=(
               Strategy("pipeline, one process", "pipeline", ONE_STAGE),
               *[Strategy(f"pipeline {s}", "pipeline",
                          dict(schedule=s, stages=ABOVE_1, data_parallel=1), ONE_STAGE,
                          made_by="notebooks/06_pipeline_parallel.ipynb") for s in PIPELINES],
               Strategy("pipeline 1f1b x 2 data-parallel", "pipeline x DP",
                        dict(data_parallel=2), ONE_STAGE,
                        made_by="notebooks/06_pipeline_parallel.ipynb"))),
    Script("_trainup_pipeline_manual.py", "06_pipeline_parallel.ipynb",  # CPU only
           breakages=(
               "the manual pipeline sends zeros back instead of the activations' gradient",)),
    # Fabric (lesson 07): its calls in lesson 04's loop (about 60 lines); the rest is sweeps,
    # the stop signal and GPU statistics left to the Trainer, which has its own; its own
    # DataLoader starts workers as data.loader does (data.worker_start)
    Script("_trainup_fabric.py", "07_lightning.ipynb", "_trainup_ddp.py", 134, ACCELERATOR,
           breakages=("Fabric's loader shuffles from epoch 0 (seeded without the first epoch)",)),
    # the Trainer replaces Fabric's loop; torchmetrics' Metric for the test accuracy; the stop
    # signal is a Trainer callback's (lightning_ckpt.StopSignal), not preempt's lines of Fabric's
    # (its stop after an epoch's last step among them)
    Script("_trainup_lightning.py", "07_lightning.ipynb", "_trainup_fabric.py", 165, ACCELERATOR,
           strategies=(Strategy("Lightning DDP", "Lightning", {}, ONE_DEVICE,
                                (("script", "_trainup_lightning.py"),),
                                "the Lightning lesson (notebook 07)", dropout_off="always"),),
           breakages=("Lightning seeds each rank differently",)),
    # ModelParallelStrategy and configure_model's fully_shard (FSDP2, lesson 09's ZeRO-3), in
    # lesson 07c with Lightning's other options
    Script("_trainup_lightning_fsdp.py", "07c_lightning_options.ipynb", "_trainup_lightning.py",
           45, ACCELERATOR),
    # --profile (08's flag) came in with FSDP2's prefetch, whose overlap a trace shows; the stop
    # signal saves DCP shards from every rank, where the block stack's rank 0 saves the replica
    Script("_trainup_fsdp.py", "09_sharding.ipynb", "_trainup_blocks.py", 100, DEVICE, strategies=(
        Strategy("sharding script, one process", "sharding", ONE_SHARDING),
        Strategy("DDP (sharding script, shard none)", "sharding",
                 dict(shard="none", devices=ABOVE_1), ONE_SHARDING,
                 (("script", "_trainup_fsdp.py"),), "the sharding lesson (notebook 09)"),
        _zero(1, "optimizer"), _zero(2, "gradients"), _zero(3, "parameters"),
        _zero(2, "gradients_fsdp"),
        # the sharding script's one-process runs of each stage: the baseline of that stage's
        # speedup only
        *[Strategy(f"sharding script, one process (shard {shard})", "sharding",
                   dict(shard=shard, devices=1))
          for shard in ("optimizer", "gradients", "parameters", "gradients_fsdp")])),
    # each rank saves its slices (a DCP checkpoint, tensor_parallel.save) at a stop and at each
    # epoch's end, where the parent's rank 0 saves the whole replica
    Script("_trainup_tp.py", "09c_tensor_parallel.ipynb", "_trainup_blocks.py", 73, DEVICE, "cpu",
           strategies=(
               Strategy("tensor parallel, one process", "tensor parallel", ONE_TP),
               Strategy("tensor parallel", "tensor parallel",
                        dict(devices=ABOVE_1, dp=(None, 1)), ONE_TP,
                        (("script", "_trainup_tp.py"),),
                        "the tensor-parallel lesson (notebook 09c)"),
               Strategy("data x tensor parallel (2-D)", "tensor parallel x DP",
                        dict(dp=ABOVE_1), ONE_TP, (("script", "_trainup_tp.py"),),
                        "the tensor-parallel lesson (notebook 09c)"))),
    # the transformer (lesson 09ca): attention cut by heads, sequence parallelism, loss_parallel
    Script("_trainup_tp_sp.py", "09ca_tp_attention.ipynb", "_trainup_tp.py", 54, transformer=True,
           strategies=(
               Strategy("transformer, one process", "transformer TP", ONE_TP_SP),
               *[Strategy(f"transformer tensor parallel{' + sequence parallel' * sp}",
                          "transformer TP", dict(devices=ABOVE_1, sequence_parallel=sp),
                          ONE_TP_SP, (("script", "_trainup_tp_sp.py"),),
                          "notebooks/09ca_tp_attention.ipynb")
                 for sp in (False, True)])),
    # the sequence cut instead of the layers: ring or all-to-all attention, the scores and the
    # gradients summed over the ranks; every rank holds the whole model, so rank 0 alone saves
    # it (checkpoint.save), where the parent's ranks save their slices by DCP
    # (after the experts in lesson order, before them in the report's rows)
    Script("_trainup_cp.py", "09d_context_parallel.ipynb", "_trainup_tp_sp.py", 96,
           transformer=True, strategies=(
               Strategy("context parallel, one process", "context parallel", ONE_CP),
               *[Strategy(f"context parallel ({a} attention)", "context parallel",
                          dict(devices=ABOVE_1, cp_attention=a), ONE_CP,
                          (("script", "_trainup_cp.py"),), "notebooks/09d_context_parallel.ipynb")
                 for a in ("ring", "ulysses")])),
    # mixture of experts: the MLP becomes routed experts, held by their ranks (expert
    # parallelism), the tokens sent to them and back by all-to-all; the rest is data parallel;
    # each rank saves its own experts (experts.save) where the parent saves slices by DCP
    Script("_trainup_experts.py", "09e_experts.ipynb", "_trainup_tp_sp.py", 93, transformer=True,
           strategies=(
               Strategy("experts, one process", "expert parallel", ONE_MOE),
               Strategy("expert parallel", "expert parallel", dict(devices=ABOVE_1), ONE_MOE,
                        (("script", "_trainup_experts.py"),), "notebooks/09e_experts.ipynb"))),
    # torch.compile on lesson 04's DDP model: the wrap after DDP, the bucket cap that sets its
    # graphs, the first step timed apart (trainup/parallel/compiled.py); 13 of _trainup_ddp.py's
    # lines
    # over 100 columns wrapped (about 30 changed lines), as tests/test_style.py asks of new code
    # Inductor draws its own dropout masks, not eager's: compared without dropout
    Script("_trainup_compile.py", "09f_compile.ipynb", "_trainup_ddp.py", 75, DEVICE, strategies=(
        Strategy("compile script, one process (eager)", "compile script, eager",
                 dict(devices=1, compile=False)),
        Strategy("torch.compile, one process", "torch.compile", dict(devices=1, compile=True),
                 ONE_EAGER, (("script", "_trainup_compile.py"),), "notebooks/09f_compile.ipynb",
                 "always"),
        *[Strategy(name, family, dict(devices=ABOVE_1, compile=c), ONE_EAGER,
                   (("script", "_trainup_compile.py"),), "notebooks/09f_compile.ipynb", "always")
          for name, family, c in (("DDP (compile script, eager)", "compile script, eager", False),
                                  ("DDP + torch.compile", "torch.compile", True))])),
    # the four dimensions on one mesh: 09c's transformer in pipeline stages (06), its layers cut
    # (09c), its rows cut (09d), sharded by FSDP2 (09); the layout checked once
    # (trainup/parallel/parallel_dims.py), the stage, its parallelization and the counted bytes in
    # trainup/parallel/four_d.py; loss_parallel goes; the parent's stop signal and DCP saves stay,
    # each rank saving its shards of its stage (four_d.save)
    Script("_trainup_4d.py", "09g_four_dimensions.ipynb", "_trainup_tp_sp.py", 130,
           transformer=True, strategies=(
               Strategy("4-D, one process", "4-D", ONE_4D),
               Strategy("4-D (pipeline x data x context x tensor parallel)", "4-D",
                        dict(devices=ABOVE_1), ONE_4D, (("script", "_trainup_4d.py"),),
                        "notebooks/09g_four_dimensions.ipynb"))),
)
SCRIPTS = {s.name: s for s in _ENTRIES}
# the transformers: a causal mask, or experts in place of the MLPs, is another model
TRANSFORMERS = tuple(s.name for s in _ENTRIES if s.transformer)


def strategies():
    """The report's rows, entry by entry in this order: a row whose conditions name no script is
    its entry's script's (classify takes the first row that holds, so the order is kept)."""
    return [s if "script" in s.where else replace(s, where=dict(script=e.name, **s.where))
            for e in _ENTRIES for s in e.strategies]
