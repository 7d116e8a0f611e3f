"""Solutions to lesson 08b's exercises. Run: python notebooks/solutions/08b_tensorboard.py RUN
(a DDP run's name in logs/; its ranks go to logs/tensorboard_ranks/RUN/rank<R>, for
`tensorboard --logdir logs/tensorboard_ranks`)"""
import json
import sys
from pathlib import Path


def ranks_to_tensorboard(run, tb_dir, log_dir):
    """Exercise 1: each rank's own training loss (the 'ranks' records of a DDP log) as one TensorBoard run per
    rank, so that TensorBoard draws them on one chart under the same tag; returns what reads back."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter
    records = [json.loads(line) for line in (Path(log_dir) / f"{run}.jsonl").read_text().splitlines()]
    ranks = [r for r in records if r["type"] == "ranks"]
    back = {}
    for rank in ranks[0]["rank"]:
        folder = Path(tb_dir) / run / f"rank{rank}"
        with SummaryWriter(str(folder)) as w:
            for r in ranks:
                w.add_scalar("train/loss_of_this_rank", r["loss"][rank], r["epoch"])
        acc = EventAccumulator(str(folder))
        acc.Reload()
        back[rank] = [(s.step, s.value) for s in acc.Scalars("train/loss_of_this_rank")]
    return back


if __name__ == "__main__":
    for run in sys.argv[1:]:
        for rank, points in ranks_to_tensorboard(run, "logs/tensorboard_ranks", "logs").items():
            print(f"{run}, rank {rank}: " + ", ".join(f"epoch {s} loss {v:.4f}" for s, v in points))
