"""The course's scripts, one entry each: the lesson that teaches it, the script it grows from, how far
its diff may go, and how it chooses its device. The ladder (launch.LADDER), the device placement
(placement.py) and the structure tests read this one list: a new lesson's script is one entry here.

    from lessons import manifest
    manifest.SCRIPTS["_trainup_ddp.py"].parent     # '_trainup_gpu.py'
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Script:
    """One script of scripts/. `budget`: the most changed lines (diff's < and > lines) its diff
    against `parent` may have, so that the diff teaches the lesson; a step that grows needs its
    budget raised here, in review, where the reason shows. `device_flag`: the flag that says where it
    runs and its GPU value (None: the script chooses no device); `device_default`: that flag's value
    when a job names none."""
    name: str
    notebook: str
    parent: str | None = None
    budget: int | None = None
    device_flag: tuple[str, str] | None = None
    device_default: str = "auto"


DEVICE = ("--device", "cuda")
ACCELERATOR = ("--accelerator", "gpu")  # Lightning's Trainer and Fabric

_ENTRIES = (
    # lesson 01: the baseline, and Hogwild's processes on one shared model
    Script("_trainup_cpu.py", "01_cpu_baseline.ipynb"),
    Script("_trainup_hogwild.py", "01_cpu_baseline.ipynb", "_trainup_cpu.py", 66),
    Script("_trainup_gpu.py", "02_single_gpu.ipynb", "_trainup_cpu.py", 85, DEVICE),
    # gpu -> dp shows the size every step aims at; DataParallel takes --gpus, one process
    Script("_trainup_dp.py", "03_data_parallel.ipynb", "_trainup_gpu.py", 65),
    # lesson 04's script joins and leaves in the open (init_process_group, set_device,
    # destroy_process_group): 7 lines each child replaces with its own framework's calls
    Script("_trainup_ddp.py", "04_ddp.ipynb", "_trainup_gpu.py", 87, DEVICE),
    # lesson 04a2: accumulation, the learning rate of a larger batch, SyncBatchNorm
    Script("_trainup_ddp_tuned.py", "04a2_tuning_ddp.ipynb", "_trainup_ddp.py", 78, DEVICE),
    # the collectives one by one, over the --backend it names (lesson 04a1, inside DDP)
    Script("_trainup_collectives.py", "04a1_inside_ddp.ipynb"),
    Script("_trainup_ray.py", "04c_elastic.ipynb", "_trainup_ddp.py", 97),
    # Horovod's --accumulate (backward_passes_per_step) costs 10: the step only at the K-th
    # micro-batch, zero_grad after it, the loss weighed (trainup/engines/hvd_group.Accumulation);
    # Horovod's module is one import line of its own (trainup.engines)
    Script("_trainup_horovod.py", "05_horovod.ipynb", "_trainup_ddp.py", 97, DEVICE),
    # the block-stack lessons (06, 09, 09c) grow from one parent: each diff is its lesson
    Script("_trainup_blocks.py", "06_pipeline_parallel.ipynb", "_trainup_ddp.py", 137, DEVICE,
           "cpu"),
    # the stop signal's checkpoint: each rank saves its own stages (pipeline.save_stages), at a
    # stop and at each epoch's end, where the parent's rank 0 saves the whole replica
    Script("_trainup_pipeline.py", "06_pipeline_parallel.ipynb", "_trainup_blocks.py", 127, DEVICE,
           "cpu"),
    Script("_trainup_pipeline_manual.py", "06_pipeline_parallel.ipynb"),  # CPU only
    # Fabric (lesson 07): its calls in lesson 04's loop (about 60 lines); the rest is sweeps,
    # the stop signal and GPU statistics left to the Trainer, which has its own; its own
    # DataLoader starts workers as data.loader does (data.worker_start)
    Script("_trainup_fabric.py", "07_lightning.ipynb", "_trainup_ddp.py", 134, ACCELERATOR),
    # the Trainer replaces Fabric's loop; torchmetrics' Metric for the test accuracy; the stop
    # signal is a Trainer callback's (lightning_ckpt.StopSignal), not preempt's lines of Fabric's
    Script("_trainup_lightning.py", "07_lightning.ipynb", "_trainup_fabric.py", 164, ACCELERATOR),
    # ModelParallelStrategy and configure_model's fully_shard (FSDP2, lesson 09's ZeRO-3), in
    # lesson 07c with Lightning's other options
    Script("_trainup_lightning_fsdp.py", "07c_lightning_options.ipynb", "_trainup_lightning.py",
           45, ACCELERATOR),
    # --profile (08's flag) came in with FSDP2's prefetch, whose overlap a trace shows; the stop
    # signal saves DCP shards from every rank, where the block stack's rank 0 saves the replica
    Script("_trainup_fsdp.py", "09_sharding.ipynb", "_trainup_blocks.py", 100, DEVICE),
    # each rank saves its slices (a DCP checkpoint, tensor_parallel.save) at a stop and at each
    # epoch's end, where the parent's rank 0 saves the whole replica
    Script("_trainup_tp.py", "09c_tensor_parallel.ipynb", "_trainup_blocks.py", 73, DEVICE, "cpu"),
    # the transformer (lesson 09ca): attention cut by heads, sequence parallelism, loss_parallel
    Script("_trainup_tp_sp.py", "09ca_tp_attention.ipynb", "_trainup_tp.py", 54),
    # mixture of experts: the MLP becomes routed experts, held by their ranks (expert
    # parallelism), the tokens sent to them and back by all-to-all; the rest is data parallel;
    # each rank saves its own experts (experts.save) where the parent saves slices by DCP
    Script("_trainup_experts.py", "09e_experts.ipynb", "_trainup_tp_sp.py", 93),
    # the sequence cut instead of the layers: ring or all-to-all attention, the scores and the
    # gradients summed over the ranks; every rank holds the whole model, so rank 0 alone saves
    # it (checkpoint.save), where the parent's ranks save their slices by DCP
    Script("_trainup_cp.py", "09d_context_parallel.ipynb", "_trainup_tp_sp.py", 96),
    # torch.compile on lesson 04's DDP model: the wrap after DDP, the bucket cap that sets its
    # graphs, the first step timed apart (trainup/parallel/compiled.py); 13 of _trainup_ddp.py's
    # lines
    # over 100 columns wrapped (about 30 changed lines), as tests/test_style.py asks of new code
    Script("_trainup_compile.py", "09f_compile.ipynb", "_trainup_ddp.py", 75, DEVICE),
    # the four dimensions on one mesh: 09c's transformer in pipeline stages (06), its layers cut
    # (09c), its rows cut (09d), sharded by FSDP2 (09); the layout checked once
    # (trainup/parallel/parallel_dims.py), the stage, its parallelization and the counted bytes in
    # trainup/parallel/four_d.py; loss_parallel goes; the parent's stop signal and DCP saves stay,
    # each rank saving its shards of its stage (four_d.save)
    Script("_trainup_4d.py", "09g_four_dimensions.ipynb", "_trainup_tp_sp.py", 130),
)
SCRIPTS = {s.name: s for s in _ENTRIES}
