"""This host's primitives that every layer uses: an honest clock, intra-op thread
control, process lifetime, and the heartbeat a worker gives its launcher's watchdog.
Nothing here is collective."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import time
from collections.abc import Iterator
from typing import Any

import torch


class Clock:
    """Wall clock that first waits for queued GPU work on ``device`` (honest timing)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


@contextlib.contextmanager
def one_thread(enabled: bool = True) -> Iterator[None]:
    """Run the enclosed torch CPU ops on one intra-op thread (restored afterwards).

    For many short memory-bound ops: each multi-threaded op waits at a barrier for all
    its threads, and on a busy machine a descheduled one stalls it for milliseconds.
    """
    threads = torch.get_num_threads()
    switch = enabled and threads > 1
    if switch:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if switch:
            torch.set_num_threads(threads)


def die_with_parent(*_: Any) -> None:
    """Linux: SIGKILL this process when its parent dies (even by SIGKILL). Ranks call it
    first thing; DataLoader workers through ``worker_init_fn`` (hence the ignored args)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return


_beats: Any = None  # this worker's launcher's heartbeat array (None outside a worker group)
_rank = 0


def watch(beats: Any, rank: int) -> None:
    """Called once by the launcher (``gtopk.run``) in each worker: ``heartbeat()`` writes
    the time into ``beats[rank]``, which the parent's watchdog reads."""
    global _beats, _rank
    _beats, _rank = beats, rank


def heartbeat() -> None:
    """Tell the launcher's watchdog that this rank made progress (no-op outside a worker)."""
    if _beats is not None:
        _beats[_rank] = time.monotonic()
