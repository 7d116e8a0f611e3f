"""Choosing the device, and saying clearly when the hardware asked for is not there."""
import torch

from . import UserError

PRECISIONS = {"32": torch.float32, "16": torch.float16, "bf16": torch.bfloat16}


OLDER_CUDA_INDEX = "https://download.pytorch.org/whl/cu126"  # CUDA 12.6 builds still run Maxwell to Volta GPUs


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
                    f"a CUDA 12.6 build instead, pip install torch torchvision --index-url {OLDER_CUDA_INDEX}")
    return None


def pick(requested="auto", local_rank=0):
    """torch.device for --device auto|cuda|cpu; on GPUs, this process's GPU is number local_rank."""
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise UserError("--device cuda needs an NVIDIA GPU, and torch sees none on this machine "
                        "(no GPU, no driver, or a CPU-only torch); use --device cpu or --device auto")
    sentence = too_old()
    if sentence:
        raise UserError(f"{sentence}; or use --device cpu")
    if local_rank >= count:
        raise UserError(f"this process wants GPU {local_rank}, but this machine has only {count} GPU(s); "
                        f"start at most {count} processes per node")
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
    """Mixed precision for --precision 16|bf16; a context that does nothing for 32."""
    return torch.autocast(torch.device(device).type, dtype=PRECISIONS[precision], enabled=precision != "32")


if __name__ == "__main__":  # set-up's check: python -m trainup.devices (from scripts/)
    print(too_old() or f"torch {torch.__version__}: no GPU here is too old for it")
