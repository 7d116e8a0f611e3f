"""Lightning's own callbacks that a learner asks for by flag, on top of the course's (its log and
checkpoint: trainup/engines/lightning_log.py):

    --keep-best K           ModelCheckpoint(monitor="test_loss", save_top_k=K): the K best
                            epochs' checkpoints in checkpoints/<run>-best/ (named by Lightning's
                            epoch, from 0), a kept one deleted when a better epoch comes
    --early-stop PATIENCE   EarlyStopping(monitor="test_loss"): stop once the test loss has not
                            fallen by --early-stop-delta for PATIENCE epochs in a row
    (always)                LearningRateMonitor: the optimizer's rate, each epoch, in TensorBoard

Each monitors test_loss, which the LightningModule logs (self.log) after every epoch's test pass,
averaged over the ranks (sync_dist), so that the callbacks watch the whole job's test loss, not one
rank's shard. Lightning itself makes the ranks agree on each decision (the strategy's
reduce_boolean_decision), so every rank stops together.
"""
import argparse
from pathlib import Path

from .. import cli

MONITOR = "test_loss"  # logged by validation_step, once an epoch


def add_flags(t):
    """On the parser's group of the Trainer's flags."""
    t.add_argument("--keep-best", type=cli.positive(int), default=None, metavar="K",
                   help="keep the K epochs of lowest test loss (ModelCheckpoint's save_top_k)")
    t.add_argument("--early-stop", type=patience, default=None, metavar="PATIENCE",
                   help="stop after PATIENCE epochs without the test loss falling (EarlyStopping)")
    t.add_argument("--early-stop-delta", type=cli.positive(float), default=None, metavar="D",
                   help="--early-stop: a fall smaller than D counts as none (min_delta)")


def patience(text):
    """--early-stop's: a whole number of epochs, 0 or more."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(
            f"must be a whole number of epochs, 0 or more, got {text!r}")
    return int(text)


def best_dir(args):
    """Where --keep-best keeps its checkpoints: one folder per run."""
    return Path(args.checkpoint_dir) / f"{args.run_name}-best"


def callbacks(args):
    """The callbacks the flags ask for, and the learning-rate monitor."""
    from pytorch_lightning.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
    out = [LearningRateMonitor(logging_interval="epoch")]
    if args.keep_best:
        out.append(ModelCheckpoint(dirpath=best_dir(args), monitor=MONITOR, mode="min",
                                   save_top_k=args.keep_best, auto_insert_metric_name=False,
                                   filename="epoch{epoch}-test_loss{test_loss:.4f}",
                                   enable_version_counter=False))
    if args.early_stop is not None:
        out.append(EarlyStopping(monitor=MONITOR, mode="min", patience=args.early_stop,
                                 min_delta=args.early_stop_delta or 0.0))
    return out
