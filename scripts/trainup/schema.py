"""The log's schema (logs/README.md): the fields of each record type and their JSON types, and the check of
one record against them. On its own: the writer (metrics) and every reader (lessons, tests) use it."""
import math


SCHEMA_VERSION = 1
# The fields each record type must have (every record also has type, run, time).
SCHEMA = {
    "config": ("schema_version", "script", "lesson", "args"),
    "env": ("torch", "python", "host", "platform", "cpu_count", "threads", "device", "gpus",
            "cuda", "world_size", "backend"),
    "epoch": ("epoch", "loss", "accuracy", "test_loss", "test_accuracy", "wall_s", "samples",
              "samples_per_s", "peak_mem_mb"),
    "summary": ("status", "epochs", "loss", "accuracy", "test_accuracy", "wall_s", "samples_per_s",
                "peak_mem_mb", "checkpoint"),
    # Lesson-specific records (logs/README.md, second table)
    "sweep": ("batch_size", "steps", "step_s", "samples_per_s", "peak_mem_mb"),
    "gpu": ("gpu", "utilization_pct", "memory_used_mb", "memory_total_mb", "sampled_at", "elapsed_s"),
    "dp_phases": ("gpus", "batch_size", "scatter_s", "replicate_s", "forward_s", "gather_s", "backward_s"),
    "ddp": ("launcher", "world_size", "local_world_size", "nnodes", "master_addr", "master_port",
            "restart_count", "backend", "timeout_s", "global_batch", "per_rank_batch", "ranks"),
    "ranks": ("epoch", "rank", "loss", "accuracy", "samples", "first_indices"),
    "gpumon": ("samples", "errors", "last_error"),
    "accumulate": ("epoch", "accumulate", "micro_batch", "micro_batches", "allreduce_calls"),
    "collective": ("op", "how", "world_size", "before", "after"),
    "allreduce_bw": ("size_bytes", "world_size", "repeats", "time_s", "algbw_gbps", "busbw_gbps", "ring_factor"),
    "collective_bw": ("op", "size_bytes", "world_size", "repeats", "time_s", "algbw_gbps", "busbw_gbps",
                      "bus_factor"),
    "ddp_broadcast": ("world_size", "params_before", "params_after", "buffers_before", "buffers_after"),
    "ddp_buckets": ("bucket_cap_mb", "buckets", "bucket_mb", "allreduce_calls", "before_backward_end",
                    "parameters", "step_s"),
    "ddp_step": ("world_size", "params_before", "params_after"),
    "bn_stats": ("world_size", "running_mean_rank_diff", "local_mean_vs_full", "allreduced_mean_vs_full"),
    "tp": ("tp", "dp", "mesh", "blocks", "width", "hidden", "plan", "placement", "param_bytes", "sharded_bytes",
           "full_param_bytes", "full_sharded_bytes"),
    "tp_comm": ("epoch", "step", "per_replica_batch", "step_s", "collectives"),
    "experts": ("experts", "top_k", "capacity_factor", "experts_per_rank", "layers", "placement",
                "expert_bytes", "dense_bytes"),
    "expert_load": ("epoch", "routed", "dropped", "received", "capacity"),
    "cp": ("cp", "attention", "causal", "tokens", "heads", "blocks", "width", "hidden", "positions",
           "visible_scores", "element_size"),
    "cp_comm": ("epoch", "step", "per_rank_batch", "sent_bytes", "expected_bytes"),
    "4d": ("layout", "mesh", "microbatches", "blocks", "heads", "width", "hidden", "placement"),
    "4d_comm": ("step", "columns", "ranks"),
    "4d_memory": ("step", "ranks"),
    "pipeline": ("schedule", "stages", "stages_per_rank", "pipeline_ranks", "data_parallel", "microbatches",
                 "microbatch_size", "blocks", "width", "stage_blocks", "placement"),
    "pipe_step": ("epoch", "step", "microbatches", "rank", "stages", "step_s", "events", "peak_activation_bytes"),
    "lightning": ("strategy", "accelerator", "precision", "world_size", "num_nodes", "devices", "sync_dist",
                  "launcher"),
    "fabric": ("strategy", "accelerator", "precision", "world_size", "num_nodes", "devices", "launcher",
               "sampler"),
    "lightning_sync": ("epoch", "sync_dist", "logged_loss", "job_loss", "rank_loss", "rank_samples", "sampler"),
    "monitor": ("callbacks", "skipped"),
    "sharding": ("shard", "zero_stage", "mesh", "precision", "parameters", "blocks", "width", "start_epoch",
                 "meta_init", "built_bytes", "replicate"),
    "shard_memory": ("shard", "world_size", "parameters", "param_bytes", "grad_bytes", "optim_bytes", "expected_bytes"),
    "shard_comm": ("shard", "world_size", "parameters", "ops"),
    "compile": ("epoch", "compiled", "mode", "bucket_cap_mb", "steps", "first_step_s", "step_s",
                "step_quartiles_s", "graphs", "compiled_graphs", "graph_breaks", "recompiles",
                "compile_s"),
}
COMMON = ("type", "run", "time")

# The JSON type of each field, by name (a field of this name has this type in every record type; a field
# not listed here is not type-checked). 'ranks' records hold one value per rank: lists.
INT, NUMBER, TEXT = ("int",), ("int", "float"), ("str",)
TYPES = {
    "type": TEXT, "run": TEXT, "time": NUMBER, "schema_version": INT, "script": TEXT, "lesson": TEXT,
    "args": ("dict",), "torch": TEXT, "python": TEXT, "host": TEXT, "platform": TEXT, "cpu_count": INT,
    "threads": INT, "device": TEXT, "gpus": ("list",), "cuda": TEXT + ("None",), "world_size": INT,
    "backend": TEXT, "wall_s": NUMBER, "peak_mem_mb": NUMBER, "status": TEXT, "checkpoint": TEXT + ("None",),
    "batch_size": INT, "steps": INT, "step_s": NUMBER, "gpu": INT, "sampled_at": NUMBER, "elapsed_s": NUMBER,
    "utilization_pct": NUMBER + ("None",), "memory_used_mb": NUMBER + ("None",),
    "memory_total_mb": NUMBER + ("None",), "errors": INT, "last_error": TEXT + ("None",),
    "launcher": TEXT, "local_world_size": INT, "nnodes": INT, "master_addr": TEXT, "master_port": INT,
    "restart_count": INT, "timeout_s": NUMBER, "global_batch": INT, "per_rank_batch": INT,
    "first_indices": ("list",),
    "shard": TEXT, "param_bytes": ("list",), "grad_bytes": ("list",), "optim_bytes": ("list",),
    "expected_bytes": ("list",), "forward_param_bytes": ("list",), "ops": ("dict",),
    # optional (logs from before they existed lack them): checked where present
    "cores": INT, "load_start": NUMBER + ("None",), "load_end": NUMBER + ("None",),
    "flops_per_s": NUMBER, "mfu": NUMBER + ("None",), "lr": NUMBER,
}
OPTIONAL = {"env": ("cores", "load_start"), "summary": ("load_end",),
            "shard_memory": ("forward_param_bytes",),
            "tp": ("heads", "sequence_parallel", "tokens"),  # _trainup_tp_sp.py's transformer
            "sharding": ("prefetch", "offload"),  # FSDP2's options
            "pipeline": ("split", "recompute"),
            "epoch": ("flops_per_s", "mfu", "lr")}
# Fields whose type depends on the record: an epoch's number against a 'ranks' list of them; a summary of
# a run without epochs (a sweep) has no loss.
TYPES_IN = {
    "epoch": dict(epoch=INT, loss=NUMBER, accuracy=NUMBER, test_loss=NUMBER, test_accuracy=NUMBER,
                  samples=INT, samples_per_s=NUMBER),
    "summary": dict(epochs=INT, loss=NUMBER + ("None",), accuracy=NUMBER + ("None",),
                    test_accuracy=NUMBER + ("None",), samples_per_s=NUMBER + ("None",)),
    "ranks": dict(epoch=INT, rank=("list",), loss=("list",), accuracy=("list",), samples=("list",)),
    "sweep": dict(samples_per_s=NUMBER),
    "dp_phases": dict(gpus=INT, scatter_s=NUMBER, replicate_s=NUMBER, forward_s=NUMBER, gather_s=NUMBER,
                      backward_s=NUMBER),
    "ddp": dict(world_size=INT, ranks=("list",)),
    "gpumon": dict(samples=INT),
    "sharding": dict(zero_stage=INT, mesh=INT, parameters=INT, start_epoch=INT, meta_init=("bool",),
                     built_bytes=("list",), replicate=INT),
    "shard_memory": dict(parameters=INT),
    "tp": dict(tp=INT, dp=INT, param_bytes=("list",), sharded_bytes=("list",), full_param_bytes=INT,
               full_sharded_bytes=INT),
    "tp_comm": dict(epoch=INT, collectives=("list",)),
    "experts": dict(experts=INT, top_k=INT, capacity_factor=NUMBER, experts_per_rank=INT,
                    layers=INT, expert_bytes=("list",), dense_bytes=("list",)),
    "expert_load": dict(epoch=INT, routed=("list",), dropped=INT, received=("list",),
                        capacity=INT),
    "cp": dict(cp=INT, causal=("bool",), tokens=INT, positions=("list",), visible_scores=("list",)),
    "cp_comm": dict(epoch=INT, sent_bytes=("list",), expected_bytes=("dict",)),
    "4d": dict(layout=TEXT, mesh=("dict",), microbatches=INT, placement=("list",)),
    "4d_comm": dict(step=INT, columns=("list",), ranks=("list",)),
    "4d_memory": dict(step=INT, ranks=("list",)),
    "pipeline": dict(split=TEXT, recompute=("bool",)),
    "compile": dict(epoch=INT, compiled=("bool",), mode=TEXT, bucket_cap_mb=NUMBER, steps=INT,
                    first_step_s=NUMBER, step_s=NUMBER, step_quartiles_s=("list",), graphs=INT,
                    compiled_graphs=INT, graph_breaks=INT, recompiles=INT, compile_s=NUMBER),
}


def _json_type(value):
    """int, float, str, bool, None, list or dict: as JSON holds it (a bool is not a number here)."""
    return "None" if value is None else type(value).__name__


def check_record(record):
    """The list of what is wrong with one log record (empty when it follows the schema): an unknown type,
    a missing field, or a field whose value has the wrong type."""
    kind = record.get("type")
    if kind not in SCHEMA:
        return [f"unknown record type {kind!r} (logs/README.md lists the types)"]
    problems = [f"{kind!r} record lacks {k!r}" for k in COMMON + SCHEMA[kind] if k not in record]
    for k, value in record.items():
        want = TYPES_IN.get(kind, {}).get(k) or TYPES.get(k)
        if want and k in COMMON + SCHEMA[kind] + OPTIONAL.get(kind, ()) and _json_type(value) not in want:
            problems.append(f"{kind!r} record's {k!r} is {_json_type(value)} {value!r:.40}, not {' or '.join(want)}")
        elif isinstance(value, float) and not math.isfinite(value):  # a NaN loss is a broken run, not a number
            problems.append(f"{kind!r} record's {k!r} is {value}, not a finite number")
    return problems
