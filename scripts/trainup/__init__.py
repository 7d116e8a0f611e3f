"""trainup's shared plumbing: every lesson script imports it, nothing copies it.

- cli:        the flags every script shares, and clean one-sentence errors
- data:       data sets (offline digits, MNIST, CIFAR-10, synthetic), the shuffling sampler
- devices:    picking the device, clear errors when hardware is missing, mixed precision
- models:     the pytorch/examples MNIST CNN and torchvision ResNets
- metrics:    the JSON-lines run log (schema in logs/README.md), timing, stdout tee
- checkpoint: atomic save and resume
- gpumon:     GPU utilisation and memory sampled in the background during a run (nvitop)
- preempt, spot: stop at a step to resume later (SIGTERM, --stop-signal); on a spot cloud machine,
              the cloud's notice turned into that signal (python -m trainup.spot -- <command>)
- distributed: the plumbing of a DDP job (ranks, backends, ports, failures)
- workers (Hogwild's processes), tuning (lesson 04a2's tuned DDP), sweeps, flops, profiling:
  one module per lesson's mechanism, so that a script's diff against its parent is its lesson
- parallel/: the parallelisms' mechanisms, one module each (DataParallel's plumbing, ZeRO and FSDP
  sharding, pipeline stages and schedules, tensor, context and expert parallelism, their 4-D
  composition, torch.compile on DDP)
- engines/: the engines beside torch.distributed (Horovod's job, Lightning's flags, run, log and
  checkpoint, Fabric's run, Ray Train's run)

What only the notebooks use (running lessons, tables, plots, one module per lesson) is the package
beside this one, `lessons`.
"""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the course's top folder (scripts/ is one below it)
# Where runs write, unless told otherwise. TRAINUP_LOG_DIR lets tests keep their runs apart.
LOG_DIR = Path(os.environ.get("TRAINUP_LOG_DIR", ROOT / "logs"))
IMAGE_DIR = ROOT / "images"
DATA_DIR = ROOT / "data"
CHECKPOINT_DIR = ROOT / "checkpoints"


class UserError(Exception):
    """A mistake in what the user asked for: reported in one sentence, never as a traceback."""
