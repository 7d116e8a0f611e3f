"""Worker processes paced epoch by epoch by the main process (Hogwild's plumbing).

The main process starts the workers (each with a Link), waits until every one is ready, then tells
them each epoch to train and adds up what they measured; between epochs it evaluates, logs, saves.
A worker that dies is noticed (an error, not a hang), and the workers are told to end when the
epochs are over, also at exit after a stop.
"""
import atexit
import os
import queue
import time

from . import UserError, preempt
from .meter import Meter


class Link:
    """The queues between the main process and its workers; each worker gets it at its start."""

    def __init__(self, ctx):
        self.results, self.go, self.parent = ctx.Queue(), ctx.Queue(), os.getpid()

    def epochs(self, first, last):
        """In a worker: epochs first..last, each once the main process says so (it evaluates and
        logs between them); they end early when it says so, or dies."""
        self.results.put(None)  # ready: the epoch's clock starts once every worker is
        for epoch in range(first, last + 1):
            if preempt.next_epoch(self.go, self.parent) is None:
                return
            yield epoch

    def done(self, meter):
        """In a worker: the epoch's Meter, to the main process."""
        self.results.put(meter)


def _gather(procs, link):
    """One result from each worker; a worker that exited with an error: a UserError, not a hang."""
    results = []
    while len(results) < len(procs):
        try:
            results.append(link.results.get(timeout=1))
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise UserError(f"a worker process exited with status {dead[0].exitcode}")
    return results


def _end(procs, link):
    """The workers ignore SIGTERM (a stop is the main process's), so they are told to end."""
    if not any(p.is_alive() for p in procs):
        return
    for _ in procs:
        link.go.put(None)
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()


def epochs(procs, link, first, last):
    """Pace the started workers through epochs first..last; yield (epoch, the workers' Meters added
    up, seconds) as all of them finish one."""
    def end():
        _end(procs, link)
    # also at exit after a stop: before multiprocessing's own exit handler, which would wait
    atexit.register(end)
    try:
        _gather(procs, link)  # every worker has started
        for epoch in range(first, last + 1):
            tick = time.perf_counter()
            for _ in procs:
                link.go.put(epoch)
            total = sum(m.as_tensor() for m in _gather(procs, link))
            yield epoch, Meter.from_tensor(total), time.perf_counter() - tick
    finally:
        atexit.unregister(end)
        end()
