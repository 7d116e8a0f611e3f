"""Where a lesson's job runs: the one decision, from the GPUs this machine has.

    placement.decide(2, gpus=1)    # ('cpu', 'This job's 2 processes would need 2 GPUs ...')
    placement.placed("_trainup_ddp.py", ["--quick"], nproc=2)   # the args, with --device cpu where needed

A job of n processes uses GPUs only where there are n of them (one each, as torchrun's local ranks
pick them); with fewer it runs on n CPU processes and says so in one sentence. Every launcher in
lessons/ (report.run, launch.run and its kin, horovod.run) passes its arguments through placed().
"""
import os

from .manifest import ACCELERATOR, SCRIPTS

# The flag that says where a script runs and its GPU value (lessons/manifest.py); the scripts that
# choose no device (CPU only, DataParallel's --gpus, the collectives' --backend) are not here.
FLAG = {name: s.device_flag for name, s in SCRIPTS.items() if s.device_flag}
CHOOSES_DEVICE = set(FLAG)
LIGHTNING = tuple(name for name, flag in FLAG.items() if flag == ACCELERATOR)
# Where a script's --device defaults to cpu, a job that names none never uses a GPU.
DEFAULT = {name: s.device_default for name, s in SCRIPTS.items() if s.device_default != "auto"}


def gpu_count():
    """GPUs torch can use here (CUDA_VISIBLE_DEVICES respected); 0 without a driver or a CUDA build."""
    from trainup import devices
    return devices.gpu_count()


def decide(nproc, gpus):
    """('cuda' or 'cpu', the sentence saying why a job falls back to the CPU, or None): the
    scripts' own decision for --device auto (trainup/devices.py), made before the job starts."""
    from trainup import devices
    return devices.auto_device(nproc, gpus)


def processes(script, args, nproc=1):
    """How many processes the job starts: nproc, or Lightning's --devices (the Trainer's, Fabric's)
    when it spawns its own."""
    args = [str(a) for a in args]
    if script in LIGHTNING and "--devices" in args:
        value = args[args.index("--devices") + 1]
        return int(value) * nproc if value.isdigit() else nproc
    return nproc


def placed(script, args, nproc=1, gpus=None, say=print):
    """args with the device placement decided: a job that names GPUs it cannot have is refused in one
    sentence; one that names none (or auto) gets the CPU where the GPUs are too few, and says why."""
    args = [str(a) for a in args]
    if os.path.basename(script) not in CHOOSES_DEVICE:
        return args
    flag, gpu = FLAG[os.path.basename(script)]
    n = processes(os.path.basename(script), args, nproc)
    gpus = gpu_count() if gpus is None else gpus
    device, why = decide(n, gpus)
    value = args[args.index(flag) + 1] if flag in args else DEFAULT.get(os.path.basename(script), "auto")
    if value in ("cuda", "gpu") and device != "cuda":
        raise RuntimeError(f"{flag} {value} with {n} process(es) needs {n} GPU(s), and this machine has "
                           f"{gpus}; run this cell on a machine with {n} GPUs, or use {flag} cpu.")
    if value != "auto" or why is None:  # named, or the script's own default already decides the same
        return args
    say(why)
    if flag in args:
        i = args.index(flag)
        args = args[:i] + args[i + 2:]
    return args + [flag, "cpu"]
