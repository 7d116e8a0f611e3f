"""Solutions to lesson 07b's exercise.

Run: python notebooks/solutions/07b_lightning_launch_and_log.py"""


def mean_of_means(rank_means):
    """Exercise 1: all_reduce(AVG) of each rank's epoch mean, as a hand-written sync often does."""
    return sum(rank_means) / len(rank_means)


def job_mean(rank_means, rank_samples):
    """Exercise 1: the whole job's mean loss: every sample weighs the same."""
    return sum(m * n for m, n in zip(rank_means, rank_samples)) / sum(rank_samples)


def lightning_synced(rank_means, rank_samples):
    """Exercise 1: what self.log(..., on_epoch=True, sync_dist=True) reports. Lightning keeps, per
    rank, the sum of value x batch size and the sum of batch sizes, and averages each of them over
    the ranks before dividing (pytorch_lightning/trainer/connectors/logger_connector/result.py,
    _ResultMetric.compute): the ranks' count cancels, and what remains is the job's
    sample-weighted mean."""
    world = len(rank_means)
    weighted = sum(m * n for m, n in zip(rank_means, rank_samples)) / world
    return weighted / (sum(rank_samples) / world)


def lightning_sync_check(records):
    """Exercise 1, on the 'lightning_sync' records of a run with sync_dist: the largest gap
    between what was logged and the job's loss (float rounding only)."""
    return max(abs(r["logged_loss"] - job_mean(r["rank_loss"], r["rank_samples"]))
               for r in records)


if __name__ == "__main__":
    means, counts = [2.0, 1.0], [256, 64]  # an uneven split: rank 1 saw fewer samples
    print(f"mean of the ranks' means {mean_of_means(means):.3f}, "
          f"job mean {job_mean(means, counts):.3f}, "
          f"Lightning's sync_dist {lightning_synced(means, counts):.3f}")
