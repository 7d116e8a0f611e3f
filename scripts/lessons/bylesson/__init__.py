"""One lesson's helpers each, for its notebook (and the lessons after it, never the ones before):
the notebooks' shared toolkit is the package above (lessons/). A helper imports the toolkit and
earlier lessons' helpers only (tests/test_structure.py).

- gpu:     lessons 02-03, GPU runs here and reference logs: tables, sweeps, utilisation plots
- ddp:     lessons 04 to 04a3, what each rank did, and scaling (throughput, speedup, efficiency)
- collectives: lessons 04a1 to 04a3, inside DDP: collectives, all_reduce bandwidth, buckets,
  no_sync, BatchNorm, errors
- slurm:   lesson 04b, the sbatch templates and a real SLURM on this machine
- elastic: lesson 04c, elastic torchrun: two agents as two nodes, one lost and back; spot machines'
  cost
- horovod: lessons 05 and 05b, Horovod against DDP, tensor fusion, its timeline
- schedules: lessons 06 to 06c, pipeline schedules: Gantt charts, the bubble against theory,
  activation memory
- zero_bubble: lesson 06b, the zero-bubble schedules and looped BFS, read from their order
- recompute: lesson 06c, recomputing activations, measured and counted by hand
- lightning: lessons 07 to 07c, Lightning beside the course's DDP script: what the Trainer
  chose, sync_dist, old 1.x flags
- traces:  lessons 08 to 08b, profiler traces read back (top operators; 08a: computation and
  communication overlap), TensorBoard (08b)
- zero_stages: lessons 09 to 09a2, ZeRO stages and FSDP: bytes each rank holds against the
  formulas, collectives (09a1), the largest model; later lessons read lesson 09's runs
- tp_runs: lesson 09c, tensor parallelism and the 2-D mesh: bytes per rank, collectives per
  step; tp_attention: lesson 09ca, the transformer cut by heads, sequence parallelism
- scaling_report: lesson 10, every run in one table, the registry of strategies, the figures
- equivalence: lesson 10a, the proof: float64 runs against one process, one tolerance, the
  noise floor; the equivalence table and the computed recommendation
- activations: lesson 09b, a transformer layer's activation bytes measured, and recomputation
- float8: lesson 09h, a tensor through torch's float8 dtypes: formats, scales, what is lost
- predict, predict_plots, predict_here: lessons 11 to 11a2, the fits of this machine's links and
  the predictions against published runs and this machine's own
- planner: lesson 11a2 (with 09's and 09b's formulas), the layouts that fit a GPU's memory, the
  fastest first
"""
