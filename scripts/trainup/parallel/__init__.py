"""The parallelisms' mechanisms, one module each, as the lessons teach them: DataParallel's
plumbing, ZeRO/FSDP sharding, pipeline stages and schedules, tensor, context and expert
parallelism, their 4-D composition (parallel_dims: one validated layout), torch.compile."""
