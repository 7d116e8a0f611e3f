"""nbval's kernels talk over Unix sockets in a folder of their own, and one that dies while starting
is started once more.

jupyter_client picks a kernel's five TCP ports by binding port 0 and letting go; the kernel binds
them a moment later. At the suite's start three workers start kernels while the tests' jobs open
gloo connections, whose local ports come from the same range. One fresh-clone run (2026-11-25)
lost notebook 00's kernel at its start ("Kernel died before replying to kernel_info"; nbval sends
a kernel's stderr to /dev/null), every cell an error, before any of them ran. Over ipc no port can
be taken in between. What a notebook's cells do is tested as before: only the start is retried.
"""
import atexit
import logging
import shutil
import tempfile
from pathlib import Path

import nbval.kernel
from jupyter_client.manager import KernelManager

_start = nbval.kernel.start_new_kernel


def _manager(**kwargs):
    folder = Path(tempfile.mkdtemp(prefix="nbval-kernel-"))  # short: a socket's path has <108 bytes
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return KernelManager(transport="ipc", connection_file=str(folder / "kernel.json"),
                         ip=str(folder / "kernel-ipc"), **kwargs)


def _start_new_kernel(*args, **kwargs):
    try:
        return _start(*args, **kwargs)
    except RuntimeError:  # nbval has shut the dead kernel down and logged why
        logging.getLogger(__name__).warning("a notebook's kernel died while starting; once more")
        return _start(*args, **kwargs)


def install():
    nbval.kernel.KernelManager = _manager
    nbval.kernel.start_new_kernel = _start_new_kernel
