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
import os
import shutil
import tempfile
from pathlib import Path

import nbval.kernel
from jupyter_client.manager import KernelManager

_start = nbval.kernel.start_new_kernel


# IPython runs the files in its profile's startup folder as a kernel starts, before any cell: there
# the kernel's jobs are set to start from a warm interpreter (tests/warm_start.py). The folder is
# the tests' own (IPYTHONDIR), so a learner's IPython profile is neither read nor written.
STARTUP = f"""import sys
sys.path.append({str(Path(__file__).parent)!r})
import warm_start
sys.path.remove({str(Path(__file__).parent)!r})
warm_start.install_in_kernel()
"""


class _Kernels(KernelManager):
    def start_kernel(self, **kw):
        kw["env"] = {**(kw.get("env") or os.environ), "IPYTHONDIR": _ipython_dir()}
        return super().start_kernel(**kw)


def _ipython_dir():
    global _IPYTHON_DIR
    if _IPYTHON_DIR is None:
        _IPYTHON_DIR = tempfile.mkdtemp(prefix="nbval-ipython-")
        atexit.register(shutil.rmtree, _IPYTHON_DIR, ignore_errors=True)
        startup = Path(_IPYTHON_DIR, "profile_default", "startup")
        startup.mkdir(parents=True)
        (startup / "00-warm-start.py").write_text(STARTUP)
    return _IPYTHON_DIR


_IPYTHON_DIR = None


def _manager(**kwargs):
    folder = Path(tempfile.mkdtemp(prefix="nbval-kernel-"))  # short: a socket's path has <108 bytes
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return _Kernels(transport="ipc", connection_file=str(folder / "kernel.json"),
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
