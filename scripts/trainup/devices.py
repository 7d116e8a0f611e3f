"""Choosing the device, and saying clearly when the hardware asked for is not there."""
import torch

from . import UserError

PRECISIONS = {"32": torch.float32, "16": torch.float16, "bf16": torch.bfloat16}


def pick(requested="auto", local_rank=0):
    """torch.device for --device auto|cuda|cpu; on GPUs, this process's GPU is number local_rank."""
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise UserError("--device cuda needs an NVIDIA GPU, and torch sees none on this machine "
                        "(no GPU, no driver, or a CPU-only torch); use --device cpu or --device auto")
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
