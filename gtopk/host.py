"""This host's primitives that every layer uses: an honest clock, this rank's GPU, intra-op
thread control, process lifetime, and the heartbeat a worker gives its launcher's watchdog.
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
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize(self.device)  # this clock's GPU, not whichever is current
        return time.perf_counter()


class GPUShortage(ValueError):
    """More ranks on this machine than GPUs: NCCL needs one GPU per rank."""


def local_gpu(local_rank: int) -> int:
    """The GPU of the rank with this machine-local index: ``local_rank`` itself, refused
    (``GPUShortage``, one line) when this machine has no such GPU, rather than sharing one
    between two ranks (NCCL refuses that: "Duplicate GPU detected")."""
    count = torch.cuda.device_count()
    if not 0 <= local_rank < count:
        raise GPUShortage(
            f"local rank {local_rank} needs GPU {local_rank}, but this machine has {count} GPU(s): one GPU per "
            f"rank; start at most {count} ranks per machine (nodes=, torchrun --nproc-per-node=) or use device=cpu"
        )
    return local_rank


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
