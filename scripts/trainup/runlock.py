"""A run's identity: its default name, and one writer per run (a lock file beside its log and
checkpoint).

The lock is the kernel's (fcntl.flock), not a pid written down and checked: the kernel lets it go
when its process ends, however it ends (a crash, SIGKILL, a node gone: on a shared file system when
the host's lease lapses), so a dead writer's lock is simply taken, on this machine or another.
"""
import errno
import fcntl
import os
import socket
import time
from pathlib import Path

from . import UserError


def default_name(lesson):
    """<lesson>_<time>_<host>-<pid>: two runs started in the same second, anywhere, differ.
    In a job of many processes rank 0's name wins (preempt.Stopper): every rank writes one run."""
    host = socket.gethostname().split(".")[0] or "host"
    return f"{lesson}_{time.strftime('%Y%m%d-%H%M%S')}_{host}-{os.getpid()}"


class Lock:
    """path, flock'ed by the writer and holding '<host> <pid>' for the sentence that refuses a
    second live writer. Released (and the file removed) by release(), or by the kernel at exit."""

    def __init__(self, path, what):
        self.path, self.fd, self.ours = Path(path), None, False
        me = f"{socket.gethostname()} {os.getpid()}"
        for _ in range(3):
            fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                owner = os.read(fd, 256).decode(errors="replace")
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
                parent = [socket.gethostname(), str(os.getppid())]
                if owner.split()[:2] in (me.split(), parent):
                    # ours already (log and checkpoint may share a folder), or the process that
                    # forked us took it for us (a Trainer in a notebook: ddp_notebook's ranks)
                    self.ours = True
                    return
                host, pid = (owner.split() + ["?", "?"])[:2]
                raise UserError(f"{what} is being written by another run (process {pid} on "
                                f"{host}, {self.path.name}); choose another --run-name, or wait "
                                f"for it to end") from None
            try:  # a writer released (and removed the file) between our open and our flock
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, me.encode())
            self.fd = fd
            return
        raise UserError(f"{what}: its lock {self.path} keeps changing hands; choose another "
                        f"--run-name")

    def release(self):
        """Removes the file while holding it (a waiting writer sees it gone), then lets go."""
        if self.fd is None and not self.ours:
            return
        try:
            owner = self.path.read_text().split()[:2]
            if self.fd is not None or owner == [socket.gethostname(), str(os.getpid())]:
                self.path.unlink()
        except FileNotFoundError:
            pass
        if self.fd is not None:
            os.close(self.fd)
        self.fd, self.ours = None, False
