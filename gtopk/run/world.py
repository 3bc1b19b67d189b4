"""Joining a torch.distributed world: the rendezvous port (``listen``, ``PortInUse``), the
process group (``join_group``, collective), the loopback device a world on this machine
alone binds its sockets to (``loopback_env``), the intra-op thread count per worker, and the
error a failed group raises (``WorkerError``). The lowest layer of ``gtopk.run``: the worker
group (``gtopk.run.pool``), ``spawn``, jobs and netbench build on it.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from gtopk.host import interface_address, local_gpu
from gtopk.reducers import transport

_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:: |$)")  # "pkg.mod.SomeError: message"
#: a collective that waited past its timeout: gloo ("Timed out waiting ... for recv"), NCCL's
#: blocking wait ("... timed out", "Timeout"), the store ("wait timeout")
_TIMEOUT = re.compile(r"(?i)timed out|timeout")


#: what a hung rank's report puts before its Python stack (``gtopk.run.pool``)
STACK_HEADER = "\nits Python stack then:\n"


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
        """One line: the first rank that failed on its own, and its error's last line. When
        every such rank timed out waiting in a collective while others were still running,
        the rank(s) still running are the hung ones, and the line names them first."""
        ranks = sorted(self.failures)
        own = [r for r in ranks if not any(c in self.failures[r] for c in self.CONSEQUENCES)] or ranks
        last = {r: self._last_line(r) for r in own}
        running = [r for r in ranks if self.failures[r].startswith(self.STOPPED + " still running")]
        if running and all(_TIMEOUT.search(last[r]) for r in own):
            return (
                f"rank(s) {running} hung: still running when rank(s) {own} timed out waiting for them in a "
                f"collective (rank {own[0]}: {last[own[0]][:200]})"
            )
        tail = f"; rank(s) {running} still running when stopped (hung?)" if running else ""
        return f"rank {own[0]}: {last[own[0]][:300]}{tail}"

    def _last_line(self, rank: int) -> str:
        text = self.failures[rank].split(STACK_HEADER)[0]  # the rank's own report, not its stack's last frame
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return next((ln for ln in reversed(lines) if _EXCEPTION_LINE.match(ln)), lines[-1] if lines else "?")


def threads_per_worker(nprocs: int) -> int:
    """Intra-op threads so that nprocs workers never oversubscribe this machine's cores."""
    return max(1, (os.cpu_count() or 1) // nprocs)


#: the variables that name the network interface gloo and NCCL bind their sockets to; unset,
#: gloo binds the address the hostname resolves to (on a cloud VM: its LAN address) and
#: NCCL the first interface that is not loopback
SOCKET_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP address; a name is not) is a loopback one: 127.0.0.0/8,
    ::1, or 127.0.0.0/8 mapped into IPv6 (``::ffff:127.0.0.1``, how a dual-stack socket
    connected to 127.0.0.1 shows its end)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def loopback_ifname() -> str:
    """The name of this machine's loopback device: the interface whose IPv4 address is a
    loopback one (``lo`` on Linux). Falls back to ``lo`` where none is found that way (no
    ``if_nameindex`` or ``SIOCGIFADDR``): the Linux name, which is all this project runs on."""
    try:
        for _, name in socket.if_nameindex():
            try:
                address = interface_address(name)
            except OSError:  # no IPv4 address (down, or IPv6 only)
                continue
            if is_loopback(address):
                return name
    except OSError:
        pass
    return "lo"


def loopback_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that puts every socket of a world on this machine alone on loopback:
    ``SOCKET_IFNAME_VARS`` set to ``loopback_ifname()``, but only those not already set
    (non-empty) in ``environ`` (default ``os.environ``): a user's explicit choice stands."""
    environ = os.environ if environ is None else environ
    unset = [k for k in SOCKET_IFNAME_VARS if not environ.get(k)]
    return dict.fromkeys(unset, loopback_ifname()) if unset else {}


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


#: ProcessGroupNCCL's settings for a collective that waits longer than its timeout: with
#: blocking wait the waiting rank's call raises (``DistBackendError``, reported like any
#: worker error) instead of the watchdog thread tearing the process down with SIGABRT
#: (torch's default, ``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``, which blocking wait replaces).
#: Set only where the environment does not set them already.
NCCL_ENV = {"TORCH_NCCL_BLOCKING_WAIT": "1"}


def join_group(backend: str, startup_timeout: float, collective_timeout: float, **init: Any) -> None:
    """Collective: ``init_process_group`` with ``startup_timeout`` (the slowest rank's
    start-up), a barrier (every rank is up), then ``collective_timeout`` for every later
    operation, so that a hung peer is noticed soon. With NCCL each rank first binds its
    GPU (LOCAL_RANK, else rank: ``gtopk.host.local_gpu``, which refuses more ranks than
    GPUs), as the training loop will, and names it as the group's ``device_id`` (its
    communicator is built at once, not lazily per peer pair inside the first timed step);
    ``NCCL_ENV`` makes a timed-out collective raise."""
    if backend == "nccl":
        for key, value in NCCL_ENV.items():
            os.environ.setdefault(key, value)
        local = int(os.environ.get("LOCAL_RANK", init.get("rank", os.environ.get("RANK", 0))))
        gpu = local_gpu(local)
        torch.cuda.set_device(gpu)
        init["device_id"] = torch.device("cuda", gpu)
    dist.init_process_group(backend, timeout=timedelta(seconds=startup_timeout), **init)
    dist.barrier()
    set_collective_timeout(collective_timeout)


def set_collective_timeout(seconds: float) -> None:
    """The default group's timeout for every later collective (local: no communication).
    ``torch.distributed.set_timeout`` came in torch 2.14; older releases (the CUDA images
    of GPU clusters often lag) have it as ``distributed_c10d._set_pg_timeout``."""
    set_timeout = getattr(dist, "set_timeout", None) or dist.distributed_c10d._set_pg_timeout
    set_timeout(timedelta(seconds=seconds))
    transport.TIMEOUT_S = float(seconds)  # the sparse rounds' sockets wait as long
