"""Solutions to lesson 00's exercises. Run: python notebooks/solutions/00_environment.py"""
import subprocess
import sys
import time
import uuid


def usable_backends():
    """Exercise 1: for each backend, whether it can run here and why."""
    import torch
    import torch.distributed as dist
    gpu = torch.cuda.is_available()
    return {
        "gloo": (dist.is_gloo_available(), "in this build; runs on CPUs (and carries GPU tensors through them)"),
        "nccl": (dist.is_nccl_available() and gpu,
                 "needs a build with NCCL and a GPU: " + f"build {'has' if dist.is_nccl_available() else 'lacks'} "
                 f"it, torch {'sees' if gpu else 'sees no'} GPU"),
        "mpi": (dist.is_mpi_available(), "only when torch was built against an MPI library"),
    }


def find_and_end_ghost(timeout=10):
    """Exercise 2: start a sleeping process with a marker of ours, find it by the marker, end it.
    Returns (found, gone)."""
    import psutil
    marker = f"ghost-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(600)  # {marker}"],
                            start_new_session=True)
    try:
        deadline = time.time() + timeout
        found = []
        while not found and time.time() < deadline:  # it may take a moment to appear
            found = [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
            time.sleep(0.05)
        for p in found:
            p.terminate()  # SIGTERM first: let it stop cleanly
        gone, alive = psutil.wait_procs(found, timeout=timeout)
        for p in alive:
            p.kill()  # SIGKILL if it did not stop
        psutil.wait_procs(alive, timeout=timeout)
        return [p.pid for p in found] == [proc.pid], proc.wait(timeout) is not None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main():
    for name, (ok, why) in usable_backends().items():
        print(f"{name}: {'can run' if ok else 'cannot run'} here ({why})")
    found, gone = find_and_end_ghost()
    print(f"ghost found by its marker: {found}; ended: {gone}")


if __name__ == "__main__":
    main()
