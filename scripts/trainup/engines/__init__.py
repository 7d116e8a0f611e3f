"""The training engines beside torch.distributed, one module per concern: Horovod's job
(hvd_group), Lightning's flags, run, log, checkpoint and callbacks (lightning_*), Fabric's
run (fabric_run) and Ray Train's (ray_run)."""
