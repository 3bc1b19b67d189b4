"""Start P worker processes on this machine, each in a torch.distributed world.

``spawn(fn, nprocs, args)`` runs ``fn(rank, world_size, *args)`` in ``nprocs`` fresh
processes joined in one process group (gloo on loopback by default), and returns the
ranks' return values in rank order: a ``gtopk.run.group.WorkerGroup`` for one task (a
group runs many). Also the launcher's primitives: ``WorkerError``, ``listen`` (the
rendezvous port), ``join_group``, the default intra-op thread count. Nothing is left
behind, whatever happens:

* A worker that raises or dies (SIGKILL, segfault) takes the whole group down: the others
  are stopped after ``grace`` seconds and ``WorkerError`` carries every rank's traceback
  (and the Python stack of each rank that was still running, dumped by faulthandler).
* A hung rank: once every rank has joined, a collective that waits longer than
  ``collective_timeout`` raises on the waiting ranks; a watchdog stops the group when a
  rank reports no progress (``gtopk.host.heartbeat()``) for ``timeout`` seconds (P = 1, or every
  rank stuck outside a collective).
* The rendezvous port is bound by the parent before any worker starts and handed to rank
  0 already bound, so concurrent jobs never race for a port (``PortInUse`` if a fixed one
  is taken); it is free again when ``spawn`` returns.
* Workers die with their parent (PR_SET_PDEATHSIG), and SIGTERM or Ctrl-C of the parent
  stops them before it exits. Process groups are created and destroyed explicitly in
  each worker (try/finally).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from gtopk.host import heartbeat as heartbeat  # re-exported: what workers call
from gtopk.run.cluster.base import Placement

_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:: |$)")  # "pkg.mod.SomeError: message"


class WorkerError(RuntimeError):
    """One or more workers failed; ``failures`` maps rank -> traceback or reason."""

    def __init__(self, failures: dict[int, str]):
        self.failures = failures
        lines = [f"{len(failures)} worker(s) failed:"]
        for rank, text in sorted(failures.items()):
            lines.append(f"--- rank {rank} ---\n{text.rstrip()}")
        super().__init__("\n".join(lines))

    #: how the launcher's own reports start: a rank stopped because another one failed
    STOPPED = "stopped:"
    #: texts of ranks that failed because another one did (a closed connection, a stop)
    CONSEQUENCES = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", STOPPED)

    def summary(self) -> str:
        """One line: the first rank that failed on its own, and its error's last line."""
        ranks = sorted(self.failures)
        own = [r for r in ranks if not any(c in self.failures[r] for c in self.CONSEQUENCES)] or ranks
        lines = [ln.strip() for ln in self.failures[own[0]].splitlines() if ln.strip()]
        last = next((ln for ln in reversed(lines) if _EXCEPTION_LINE.match(ln)), lines[-1] if lines else "?")
        running = [r for r in ranks if self.failures[r].startswith(self.STOPPED + " still running")]
        tail = f"; rank(s) {running} still running when stopped (hung?)" if running else ""
        return f"rank {own[0]}: {last[:300]}{tail}"


def threads_per_worker(nprocs: int) -> int:
    """Intra-op threads so that nprocs workers never oversubscribe this machine's cores."""
    return max(1, (os.cpu_count() or 1) // nprocs)


class PortInUse(ValueError):
    """The fixed rendezvous port is taken; raised before any worker starts."""


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (0: a free port), kept bound until closed.
    SO_REUSEADDR, as TCPStore sets it: a port whose last job's connections linger in
    TIME_WAIT can be reused at once, while one that something listens on cannot."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(1024)
    except OSError as e:
        sock.close()
        raise PortInUse(
            f"master_port={port}: {host}:{port} is in use ({e.strerror}); pass master_port=0 "
            "to pick a free port, or another port"
        ) from None
    return sock


def join_group(backend: str, startup_timeout: float, collective_timeout: float, **init: Any) -> None:
    """Collective: ``init_process_group`` with ``startup_timeout`` (the slowest rank's
    start-up), a barrier (every rank is up), then ``collective_timeout`` for every later
    operation, so that a hung peer is noticed soon. With NCCL each rank first binds its
    GPU (LOCAL_RANK, else rank, modulo the GPU count), as the training loop will."""
    if backend == "nccl" and torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", init.get("rank", os.environ.get("RANK", 0))))
        torch.cuda.set_device(local % torch.cuda.device_count())
    dist.init_process_group(backend, timeout=timedelta(seconds=startup_timeout), **init)
    dist.barrier()
    dist.set_timeout(timedelta(seconds=collective_timeout))


def spawn(
    fn: Callable,
    nprocs: int,
    args: tuple = (),
    backend: str = "gloo",
    timeout: float = 120.0,
    grace: float = 5.0,
    placement: Placement | None = None,
    collective_timeout: float | None = None,
    port: int = 0,
) -> list[Any]:
    """Run ``fn(rank, nprocs, *args)`` on ``nprocs`` processes; return results by rank.

    ``fn`` must be importable (module level); it may call ``gtopk.host.heartbeat()`` as it makes
    progress. ``timeout``: the watchdog stops the group when a running rank has not
    called ``heartbeat()`` for this long (since its start, for functions that never
    call it), and it bounds the ranks' start-up. ``collective_timeout`` (default
    ``timeout``): once every rank has joined, a collective that waits longer raises.
    ``grace``: how long the others get to report after the first failure.
    ``placement`` (from ``gtopk.run.cluster``) says where each rank runs; default: loopback,
    where ``port`` (0: a free one) is bound here and passed to rank 0 already bound.
    """
    from gtopk.run.group import WorkerGroup  # which builds on this module

    with WorkerGroup(
        nprocs, backend, timeout, grace, placement, collective_timeout=collective_timeout, port=port
    ) as group:
        return group.run(fn, args, timeout=timeout)
