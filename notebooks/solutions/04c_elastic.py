"""Solutions to lesson 04c's exercises. Run: python notebooks/solutions/04c_elastic.py

Exercise 1 (kill node A, the agent that holds the rendezvous store): node B's worker loses its peer
as before, but its agent's next rendezvous needs the store that died with node A: it cannot reach
it, waits out its timeout and the whole job fails. Elastic training survives any node but the one
holding the rendezvous, so production puts the store where nothing is taken away: an etcd server
(--rdzv-backend etcd-v2), or the first node of a SLURM allocation that lives as long as the job.

Exercise 4 (Ray with --max-failures 0): the run ends with "error: Ray Train gave up on the run after
0 restart(s) (--max-failures): rank 0: another rank is gone (...); rank 1: its process died". The
killed worker's health check failed; the survivor's next all-reduce lost its peer. With no restart
allowed, Ray stops the group and hands the failure to the driver (trainup/engines/ray_run.py,
why)."""

import torch

from lessons.bylesson import elastic
from trainup import UserError, preempt


def break_even(on_demand_per_h, spot_per_h, lost_h_per_interruption):
    """Exercise 2: the interruptions per hour at which spot costs what on-demand does:
    spot * hours / (1 - r * lost) = on_demand * hours, so r = (1 - spot / on_demand) / lost."""
    return (1 - spot_per_h / on_demand_per_h) / lost_h_per_interruption


def padded_return(samples=1001, step=3):
    """Exercise 3: the sentence a return gets when the data does not split evenly over both sizes:
    with 1001 samples a job of 2 pads its shares (one sample twice), so its steps did not take the
    samples a job of 1 would, and the epoch cannot go on from the step."""
    position = dict(
        epoch=2, step=step, world_size=1, ranks=[dict(rng=None, meter=[0.0, 0.0, 0.0])], extra={}
    )
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.zeros(samples)), batch_size=32
    )
    try:
        preempt.resized(position, 2, loader, "checkpoints/elastic.pt")
    except UserError as e:
        return str(e)
    return None


if __name__ == "__main__":
    rate = break_even(4.0, 1.2, 0.25)
    print(f"spot stops paying at {rate:.1f} interruptions an hour")
    print(elastic.spot_cost(100, 4.0, 1.2, rate * 0.99, 0.25))
    print(padded_return())
