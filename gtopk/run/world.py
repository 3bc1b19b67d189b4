"""Joining a torch.distributed world: the rendezvous port (``listen``, ``PortInUse``), the
process group (``join_group``, collective), the intra-op thread count per worker, and the
error a failed group raises (``WorkerError``). The lowest layer of ``gtopk.run``: the worker
group (``gtopk.run.group``), ``spawn``, jobs and netbench build on it.
"""

from __future__ import annotations

import os
import re
import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

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
