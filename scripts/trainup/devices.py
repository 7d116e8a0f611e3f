"""Choosing the device, and saying clearly when the hardware asked for is not there: the one place for the
driver and hardware checks that the set-up (tools/setup_env.sh) and notebook 00 use."""
import re
import shutil
import subprocess
import sys

import torch

from . import UserError

PRECISIONS = {"32": torch.float32, "64": torch.float64, "16": torch.float16, "bf16": torch.bfloat16}


# PyTorch's CUDA 12.6 builds: drivers from the 525 series, and GPUs from Maxwell on, which PyPI's
# CUDA 13 build (Turing on, drivers of the 580 series) leaves out. PyTorch also builds torch 2.13
# for CUDA 12.9 (its release note to Colab, googlecolab/colabtools#6053); the course takes 12.6.
CUDA12_INDEX = OLDER_CUDA_INDEX = "https://download.pytorch.org/whl/cu126"


def cuda12_install(version=None):
    """The pip line for the CUDA 12.6 build of this torch and its torchvision (0.(minor+15)), pinned, so
    that it replaces the build and never the version; tools/setup_env.sh --cuda12 does the same."""
    version = (torch.__version__ if version is None else version).split("+")[0]
    major, minor, patch = (int(p) for p in re.match(r"(\d+)\.(\d+)\.(\d+)", version).groups())
    return (f"pip install torch=={version}+cu126 torchvision==0.{minor + 15}.{patch}+cu126 "
            f"--index-url {CUDA12_INDEX}")

# The torch versions the scripts run on (README "Which PyTorch"; tests/test_setup.py checks the two agree). The oldest
# is what the course's GPU machines ship; the newest API the scripts use is pipelining's ScheduleDualPipeV (2.9).
TORCH_OLDEST = (2, 11)
TORCH_PINNED = (2, 13)


def torch_release(version=None):
    """(major, minor) of this torch, or of `version`."""
    text = torch.__version__ if version is None else version
    return tuple(int(p) for p in re.match(r"(\d+)\.(\d+)", text).groups())


def torch_sentence(version=None):
    """One sentence when this torch is older than the course supports, else None."""
    text = torch.__version__ if version is None else version
    found = tuple(int(p) for p in re.match(r"(\d+)\.(\d+)", text).groups())
    if found >= TORCH_OLDEST:
        return None
    return (f"torch {text} is older than this course supports ({TORCH_OLDEST[0]}.{TORCH_OLDEST[1]} to "
            f"{TORCH_PINNED[0]}.{TORCH_PINNED[1]}): upgrade it, e.g. pip install 'torch>={TORCH_OLDEST[0]}.{TORCH_OLDEST[1]}' "
            f"torchvision, or use the course's pinned set-up (tools/setup_env.sh)")


def nvidia_smi(run=subprocess.run):
    """nvidia-smi's output, or None where there is no NVIDIA driver (no nvidia-smi, or it fails)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def parse_nvidia_smi(text):
    """The driver version, the newest CUDA it runs ("12.2") and the GPU names, from nvidia-smi's table."""
    driver = re.search(r"Driver Version:\s*([\d.]+)", text)
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", text)
    names = re.findall(r"^\|\s+\d+\s+(.+?)\s{2,}(?:On|Off)\s+\|", text, flags=re.M)
    return dict(driver=driver and driver.group(1), cuda=cuda and cuda.group(1), gpus=names)


HERE = "this torch"  # default of the checks below: the torch installed here


def driver_sentence(smi_text, torch_cuda=HERE, torch_version=HERE):
    """One sentence when the NVIDIA driver is too old for this torch's CUDA, naming the fix, else None.
    A CUDA 13 build needs a driver that runs CUDA 13 (the 580 series on); within one major CUDA version,
    NVIDIA's minor version compatibility lets an older driver run a newer build."""
    torch_cuda = torch.version.cuda if torch_cuda is HERE else torch_cuda  # None: a CPU-only build
    version = (torch.__version__ if torch_version is HERE else torch_version).split("+")[0]
    found = parse_nvidia_smi(smi_text or "")
    if not torch_cuda or not found["cuda"]:
        return None
    major = lambda v: int(v.split(".")[0])
    if major(found["cuda"]) >= major(torch_cuda):
        return None
    fix = (f"install PyTorch's CUDA 12.6 build of the same version (tools/setup_env.sh --cuda12, or "
           f"{cuda12_install(version)})" if major(found["cuda"]) >= 12 else
           "update the NVIDIA driver (the 525 series runs PyTorch's CUDA 12.6 builds)")
    return (f"the NVIDIA driver {found['driver']} runs CUDA up to {found['cuda']}, but this torch {version} is a "
            f"CUDA {torch_cuda} build, so torch cannot use the GPU: {fix}, or update the driver to the 580 series "
            f"or newer")


def bf16_sentence(name, capability):
    """One sentence when a GPU has no bf16 (it needs compute capability 8.0: A100, RTX 30xx and newer), else None."""
    if tuple(capability) >= (8, 0):
        return None
    return (f"GPU {name} (compute capability {capability[0]}.{capability[1]}) has no bf16 arithmetic (it needs 8.0, "
            f"an A100 or RTX 30xx and newer): use --precision 16, float16 with a gradient scaler, or 32")


def gpus_sentence(needed, found, shows):
    """One sentence when a lesson needs `needed` GPUs and this machine has `found` (1 or more), else None:
    what the lesson would show, so that a run on too few GPUs is not read as a comparison."""
    if found >= needed or found == 0:
        return None
    return (f"this machine has {found} GPU(s) and this part needs {needed}: with {needed} it would show {shows}; "
            f"on {found} it would compare nothing, so it is skipped here (the reference logs show it, where committed)")


def too_old(capabilities=None, arch_list=None, cuda=None):
    """One sentence when a GPU here is older than every architecture this torch was built for (CUDA 13
    builds start at Turing, compute capability 7.5: a V100 or P100 cannot run them), else None."""
    if capabilities is None:
        if not torch.cuda.is_available():
            return None
        capabilities = [(torch.cuda.get_device_name(i), torch.cuda.get_device_capability(i))
                        for i in range(torch.cuda.device_count())]
    arch_list = torch.cuda.get_arch_list() if arch_list is None else arch_list
    cuda = torch.version.cuda if cuda is None else cuda
    built = [int(a.split("_")[1]) for a in arch_list if a.startswith("sm_") and a.split("_")[1].isdigit()]
    if not built:
        return None
    oldest = min(built)
    for name, (major, minor) in capabilities:
        if 10 * major + minor < oldest:
            return (f"GPU {name} (compute capability {major}.{minor}) is too old for this torch {torch.__version__} "
                    f"(a CUDA {cuda} build, for compute capability {oldest // 10}.{oldest % 10} and newer): install "
                    f"a CUDA 12.6 build instead: tools/setup_env.sh --cuda12, or {cuda12_install()}")
    return None


def gpu_count():
    """GPUs torch can use here (CUDA_VISIBLE_DEVICES respected); 0 without a driver or a CUDA
    build."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def auto_device(nproc, gpus=None):
    """What auto means for a node's nproc processes: ('cuda', None) where it has a GPU for each, as
    torchrun's local ranks pick them; else ('cpu', the sentence why, or None on a machine without
    GPUs, where every lesson runs on the CPU). Two processes on one GPU would not share it: NCCL
    refuses them ("Duplicate GPU detected"). The one decision: the scripts' --device auto, the
    Lightning scripts' --accelerator auto and the lessons' launchers (lessons/placement.py)."""
    gpus = gpu_count() if gpus is None else gpus
    if gpus and gpus >= nproc:
        return "cuda", None
    if not gpus:
        return "cpu", None
    return "cpu", (f"This job's {nproc} processes would need {nproc} GPUs, one each, and this "
                   f"machine has {gpus}: it runs on {nproc} CPU processes instead.")


def pick(requested="auto", local_rank=0, set_device=True):
    """torch.device for --device auto|cuda|cpu; on GPUs, this process's GPU is number local_rank,
    made current unless set_device=False (the caller then calls torch.cuda.set_device itself)."""
    if requested == "cpu":
        return torch.device("cpu")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    blind = driver_sentence(nvidia_smi()) if count == 0 else None  # a GPU is there, but torch cannot use it
    if requested == "auto" and count == 0:
        if blind:  # say why the run is on the CPU rather than let a GPU lesson quietly run there
            print(f"note: running on the CPU: {blind}", file=sys.stderr)
        return torch.device("cpu")
    if blind:
        raise UserError(f"{blind}; or use --device cpu")
    if count == 0:
        raise UserError("--device cuda needs an NVIDIA GPU, and torch sees none on this machine "
                        "(no GPU, no driver, or a CPU-only torch); use --device cpu or --device auto")
    sentence = too_old()
    if sentence:
        raise UserError(f"{sentence}; or use --device cpu")
    if local_rank >= count:
        raise UserError(f"this process wants GPU {local_rank}, but this machine has only {count} GPU(s); "
                        f"start at most {count} processes per node")
    if set_device:
        torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def require_gpus(n):
    """Check that n GPUs exist; a clear sentence if not."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n > count:
        raise UserError(f"--gpus {n} asks for {n} GPU(s), but this machine has {count}"
                        + ("" if count else "; run the CPU lessons, or on a machine with GPUs"))
    return list(range(n))


def synchronize(device):
    """Wait for queued GPU work, so that a clock read afterwards measures it (a no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device, precision):
    """Mixed precision for --precision 16|bf16; a context that does nothing for 32 and 64. bf16 on a GPU without
    it is a clear error (torch would emulate it slowly or fail inside a kernel)."""
    device = torch.device(device)
    if precision == "bf16" and device.type == "cuda":
        sentence = bf16_sentence(torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device))
        if sentence:
            raise UserError(sentence)
    return torch.autocast(torch.device(device).type, dtype=PRECISIONS[precision],
                          enabled=precision in ("16", "bf16"))


def checks():
    """The set-up's and notebook 00's sentences about this machine's torch, driver and GPUs (one a line)."""
    smi = nvidia_smi()
    lines = [torch_sentence(), driver_sentence(smi) if smi else None, too_old()]
    if torch.cuda.is_available():
        lines += [bf16_sentence(torch.cuda.get_device_name(i), torch.cuda.get_device_capability(i))
                  for i in range(torch.cuda.device_count())]
    lines = [line for line in lines if line]
    found = parse_nvidia_smi(smi)["driver"] if smi else None
    where = (f"NVIDIA driver {found}, torch sees {torch.cuda.device_count()} GPU(s)" if found and torch.cuda.is_available()
             else f"NVIDIA driver {found}, torch sees no GPU" if found else "no NVIDIA driver")
    return lines or [f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}), {where}: nothing to fix"]


if __name__ == "__main__":  # set-up's check: python -m trainup.devices (from scripts/)
    print("\n".join(checks()))
