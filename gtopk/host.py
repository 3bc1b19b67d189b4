"""This host's primitives that every layer uses: an honest clock (in virtual time under time
dilation), this rank's GPU, intra-op thread control, process lifetime, and the heartbeat a
worker gives its launcher's watchdog. Nothing here is collective.

**Time dilation.** A worker of a dilated emulated cluster (``cluster.dilation`` D > 1,
``gtopk.run.cluster.emulated``) runs D times slower than its wall clock: its network is
shaped to 1/D of the rate, its CPU capped to 1/D of its cores, and its replayed compute
sleeps D times as long. Its clock is therefore *virtual*: ``now()`` is wall seconds / D, and
``sleep(s)`` sleeps s virtual seconds (s x D on the wall); a reading also paces the CPU work
since the previous one to D x its CPU time (``_pace``). This module is the one place
where the division happens: every time a worker records (the t_* fields of its rows, hence
its summary) is a difference of ``now()`` readings through ``Clock``. D comes from the
environment (``DILATION_ENV``, set by the cluster's placement before the worker's process
group exists); without it a process runs in real time (D = 1).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import torch

#: the environment variable that carries a worker's time dilation D (an integer >= 1)
DILATION_ENV = "GTOPK_TIME_DILATION"


@functools.lru_cache(maxsize=8)
def _parse_dilation(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ValueError(f"{DILATION_ENV}={text!r} must be an integer >= 1 (the time dilation D; 1: real time)")
    return int(text)


def dilation(environ: Mapping[str, str] | None = None) -> int:
    """The time dilation D of this process (or of ``environ``): 1 unless ``DILATION_ENV`` says."""
    text = (os.environ if environ is None else environ).get(DILATION_ENV)
    return 1 if text is None else _parse_dilation(text)


class _Pacing:
    """The process's pacing state (``_pace``), shared by its threads under ``lock``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last: tuple[float, float] | None = None  # (wall, CPU per thread) at the last dilated reading
        self.credit = 0.0  # wall seconds slept beyond what was owed (negative: owed, not yet slept)
        self.overrun = 0.0  # running mean of a pacing sleep's overrun (wall seconds)


_pacing = _Pacing()
_tight = threading.local()  # whether this thread's timer slack is already 1 ns

PR_SET_TIMERSLACK = 29  # prctl(2)


def _tight_timers() -> None:
    """This thread's timer slack to 1 ns (Linux; once per thread): a sleep of a few
    microseconds otherwise overruns by the default 50 us slack and more (70 us on the
    2-core VM against 20 us at 1 ns; docs/cluster.md)."""
    if getattr(_tight, "done", False):
        return
    _tight.done = True
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)


def now() -> float:
    """This process's clock in virtual seconds: ``time.perf_counter() / D``. Comparable
    between the processes of one host that share D (one job's workers). Under dilation
    (D > 1) a reading first *paces* the work since the previous one (``_pace``)."""
    d = dilation()
    return (time.perf_counter() if d == 1 else _pace(d)) / d


def _pace(d: int) -> float:
    """The wall clock, after making the interval since the previous reading last at least
    D x the CPU time this process spent in it (per intra-op thread): on a processor D times
    slower, which is what the rank has in virtual time, CPU work cannot go faster than that.
    The process's CPU time counts all its threads, gloo's network thread too: the rank's CPU
    cap (T / D cores) holds them all, so in virtual time they share its T cores, and gloo's
    thread does its part of a message (reading it, waking the waiting thread) on the
    message's path. A short CPU burst runs at full speed under the CPU cap
    (``gtopk.run.cluster.cpucap``: the quota is 5 ms) and would otherwise look D times too
    fast; an interval that waited (network, sleep) or was slowed by the cap already lasts
    that long and is left alone. The pause lands at the reading, not inside the work (that
    is where the step's times are taken: between two readings the rank sends nothing that is
    not already timed).

    A sleep overruns what it asks for (the wake-up: 20-30 us on the 2-core VM with the
    timer slack at 1 ns, ``_tight_timers``), and readings come a few microseconds apart in a
    traced round, so the pacing keeps a signed balance, ``credit`` (wall seconds slept
    beyond what was owed; negative: owed but not yet slept): each sleep asks for what is
    owed less the overrun expected (``overrun``, a running mean), and what is owed below
    that is carried to the next reading instead of slept. Readings are then neither late by
    an overrun each nor early by more than one overrun / D. An interval that owed nothing
    (it waited, or the cap slowed it) ends the balance: the wait absorbed it."""
    p = _pacing
    with p.lock:
        wall, cpu = time.perf_counter(), time.process_time() / max(1, torch.get_num_threads())
        if p.last is not None:
            debt = d * (cpu - p.last[1]) - (wall - p.last[0])
            owed = debt - p.credit
            if debt <= 0:
                p.credit = 0.0
            elif owed <= p.overrun:
                p.credit = -owed
            else:
                _tight_timers()
                asked = owed - p.overrun
                time.sleep(asked)
                after = time.perf_counter()
                p.overrun += 0.125 * (max(0.0, after - wall - asked) - p.overrun)
                p.credit, wall = (after - wall) - owed, after
        p.last = (wall, cpu)
        return wall


def pacing_state() -> list[float]:
    """This process's pacing state for code that paces itself (``gtopk.reducers.native``):
    [wall at the last dilated reading (-1: none yet), CPU per thread then, credit, overrun]."""
    p = _pacing
    with p.lock:
        last = p.last or (-1.0, 0.0)
        return [last[0], last[1], p.credit, p.overrun]


def set_pacing_state(state) -> None:
    """Take over the pacing state that such code leaves (``pacing_state``'s four numbers)."""
    p = _pacing
    with p.lock:
        p.last = None if state[0] < 0 else (float(state[0]), float(state[1]))
        p.credit, p.overrun = float(state[2]), float(state[3])


def sleep(seconds: float) -> None:
    """Sleep ``seconds`` of virtual time (``seconds`` x D on the wall)."""
    if seconds > 0:
        _tight_timers()
        time.sleep(seconds * dilation())


class Clock:
    """The process's clock (``now()``: virtual seconds under time dilation) that first waits
    for queued GPU work on ``device`` (honest timing)."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize(self.device)  # this clock's GPU, not whichever is current
        return now()


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


def scheduling(realtime: bool) -> None:
    """Every thread of this process under ``SCHED_FIFO`` (priority 10), or back to ``SCHED_OTHER``."""
    policy, priority = (os.SCHED_FIFO, 10) if realtime else (os.SCHED_OTHER, 0)
    for tid in os.listdir("/proc/self/task"):
        os.sched_setscheduler(int(tid), policy, os.sched_param(priority))


_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address (struct ifreq, address at byte 20)


def interface_address(ifname: str) -> str:
    """The IPv4 address of network interface ``ifname`` (Linux's ``SIOCGIFADDR``); OSError
    where it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", ifname.encode()[:15]))
    return socket.inet_ntoa(ifreq[20:24])
