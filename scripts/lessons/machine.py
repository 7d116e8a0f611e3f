"""What this machine has (CPUs, GPUs, backends) and finding training processes left behind.

GPUs are read through nvitop's Python API (NVML, the library behind nvidia-smi). Without an
NVIDIA driver NVML is missing: then this says "no GPU" instead of printing NVML's error.
"""
import contextlib
import importlib.util
import io
import os
import platform
from pathlib import Path

import psutil


def gpus():
    """One dict per NVIDIA GPU (index, name, memory, utilisation); [] where there is none."""
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            from nvitop import Device
            devices = Device.all()
        except Exception:  # NVML missing or broken: no usable GPU for this course
            return []
    return [dict(index=d.index, name=d.name(), memory_total_mb=d.memory_total() / 2**20,
                 memory_used_mb=d.memory_used() / 2**20, utilization_pct=d.gpu_utilization())
            for d in devices]


def installed(module):
    return importlib.util.find_spec(module) is not None


def backends():
    """Which torch.distributed backends can run here, and whether Horovod is installed.

    is_nccl_available() says only that the build includes NCCL; NCCL moves GPU memory, so it works
    only where torch sees a GPU."""
    import torch
    import torch.distributed as dist
    return dict(gloo=dist.is_gloo_available(), nccl=dist.is_nccl_available() and torch.cuda.is_available(),
                mpi=dist.is_mpi_available(), horovod=installed("horovod"))


def nccl_sentence():
    """Whether NCCL can run here, and why: the build and a GPU are both needed."""
    import torch
    import torch.distributed as dist
    built, gpu = dist.is_nccl_available(), torch.cuda.is_available()
    if built and gpu:
        return "NCCL: in this build, and torch sees a GPU, so it can run here."
    if built:
        return "NCCL: in this build, but torch sees no GPU, so it cannot run here (it only moves GPU memory)."
    return "NCCL: not in this build of torch (a CPU-only build), so it cannot run here."


def describe():
    """The machine in a few lines of text."""
    import torch
    found = gpus()
    lines = [f"CPU: {platform.processor() or platform.machine()}, {psutil.cpu_count(logical=False)} cores, "
             f"{os.cpu_count()} logical CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB memory",
             f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}), "
             f"{torch.get_num_threads()} CPU threads by default"]
    lines += [f"GPU {g['index']}: {g['name']}, {g['memory_total_mb'] / 1024:.0f} GiB" for g in found] or \
        ["GPU: none found (nvitop sees no NVIDIA driver); the GPU lessons run on the CPU or show reference logs"]
    b = backends()
    lines.append("torch.distributed backends that can run here: " + ", ".join(
        f"{k} {'yes' if v else 'no'}" for k, v in b.items() if k != "horovod"))
    lines.append(nccl_sentence())
    lines.append("Horovod: " + ("installed" if b["horovod"] else
                                "not installed (the Horovod lesson says how to build it)"))
    return lines


def training_processes(marker="_trainup_", root=None):
    """This user's processes running a script of this checkout (scripts/_trainup_*.py): candidates
    for ghost runs. Another checkout's runs (a second clone, a test run beside it) are not this
    one's to end."""
    from trainup import ROOT
    scripts = (Path(root or ROOT) / "scripts").resolve()
    me, user = os.getpid(), psutil.Process().username()
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "username", "cwd"]):
        cmd, cwd = p.info["cmdline"] or [], p.info["cwd"]
        if p.info["pid"] == me or p.info["username"] != user or not cwd or not any("python" in a for a in cmd):
            continue
        script = next((a for a in cmd if marker in Path(a).name and a.endswith(".py")), None)
        if script and (Path(cwd) / script).resolve().parent == scripts:
            found.append(p)
    return found


def end_process(pid, timeout=10):
    """Ask a process to stop (SIGTERM), then kill it (SIGKILL) if it has not stopped in time."""
    p = psutil.Process(pid)
    p.terminate()
    try:
        p.wait(timeout)
    except psutil.TimeoutExpired:
        p.kill()
        p.wait(timeout)
    return not p.is_running()
