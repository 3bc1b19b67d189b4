"""Start P worker processes on this machine, each in a torch.distributed world.

``spawn(fn, nprocs, args)`` runs ``fn(rank, world_size, *args)`` in ``nprocs`` fresh
processes joined in one process group (gloo on loopback by default), and returns the
ranks' return values in rank order. Nothing is left behind, whatever happens:

* A worker that raises or dies (SIGKILL, segfault) takes the whole group down: the others
  are stopped after ``grace`` seconds and ``WorkerError`` carries every rank's traceback
  (and the Python stack of each rank that was still running, dumped by faulthandler).
* A hung rank: once every rank has joined, a collective that waits longer than
  ``collective_timeout`` raises on the waiting ranks; a watchdog stops the group when a
  rank reports no progress (``heartbeat()``) for ``timeout`` seconds (P = 1, or every
  rank stuck outside a collective).
* The rendezvous port is bound by the parent before any worker starts and handed to rank
  0 already bound, so concurrent jobs never race for a port (``PortInUse`` if a fixed one
  is taken); it is free again when ``spawn`` returns.
* Workers die with their parent (PR_SET_PDEATHSIG), and SIGTERM or Ctrl-C of the parent
  stops them before it exits. Process groups are created and destroyed explicitly in
  each worker (try/finally).
"""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import pickle
import re
import signal
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gtopk.host import die_with_parent
from gtopk.run.cluster.base import Placement
from gtopk.run.supervise import dump_stacks, read_stack, signals_stop, stop, supervise

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


_beats: Any = None  # this worker's slot in spawn's heartbeat array (None outside spawn)
_rank = 0


def heartbeat() -> None:
    """Tell spawn's watchdog that this rank made progress (no-op outside spawn)."""
    if _beats is not None:
        _beats[_rank] = time.monotonic()


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


@dataclasses.dataclass(frozen=True)
class _Setup:
    """What every worker needs besides its rank (picklable)."""

    backend: str
    startup_timeout: float
    collective_timeout: float
    beats: Any
    stack_dir: str
    parent: int


_stack_file: Any = None  # kept open: faulthandler writes this worker's stacks into it


def _worker(
    rank: int,
    nprocs: int,
    placement: Placement,
    store_sock: socket.socket | None,
    setup: _Setup,
    fn: Callable,
    args: tuple,
    results: Any,
) -> None:
    global _beats, _rank, _stack_file
    die_with_parent()
    if os.getppid() != setup.parent:  # the parent died before PR_SET_PDEATHSIG took effect
        os._exit(1)
    _beats, _rank = setup.beats, rank
    heartbeat()  # imports done: the watchdog counts from here
    _stack_file = open(Path(setup.stack_dir) / f"rank{rank}.txt", "w")
    faulthandler.enable(_stack_file)  # fatal signals (segfault, abort): the stack, then death
    faulthandler.register(signal.SIGUSR1, _stack_file)  # spawn asks before it stops a live rank
    try:
        placement.enter(rank)  # its network namespace, MASTER_ADDR/PORT, socket ifname
    except BaseException:  # noqa: BLE001
        results.put((rank, False, traceback.format_exc()))
        return
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(nprocs))
    torch.set_num_threads(threads_per_worker(nprocs))
    try:
        fd = None if store_sock is None else store_sock.detach()  # the store owns it now
        store = dist.TCPStore(
            placement.master_addr,
            placement.master_port,
            nprocs,
            rank == 0,
            timedelta(seconds=setup.startup_timeout),
            wait_for_workers=False,
            master_listen_fd=fd,
        )
        join_group(
            setup.backend, setup.startup_timeout, setup.collective_timeout, store=store, rank=rank, world_size=nprocs
        )
        heartbeat()
        try:
            out = fn(rank, nprocs, *args)
        finally:
            dist.destroy_process_group()
        # plain pickle: tensors are copied, not shared through fds that die with us
        results.put((rank, True, pickle.dumps(out)))
    except BaseException:  # noqa: BLE001 - reported to the parent, which decides
        results.put((rank, False, traceback.format_exc()))


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

    ``fn`` must be importable (module level); it may call ``heartbeat()`` as it makes
    progress. ``timeout``: the watchdog stops the group when a running rank has not
    called ``heartbeat()`` for this long (since its start, for functions that never
    call it), and it bounds the ranks' start-up. ``collective_timeout`` (default
    ``timeout``): once every rank has joined, a collective that waits longer raises.
    ``grace``: how long the others get to report after the first failure.
    ``placement`` (from ``gtopk.run.cluster``) says where each rank runs; default: loopback,
    where ``port`` (0: a free one) is bound here and passed to rank 0 already bound.
    """
    if nprocs < 1:
        raise ValueError(f"nodes={nprocs} must be >= 1")
    placement = placement or Placement(master_addr="127.0.0.1", master_port=port)
    sock = None
    if not placement.namespaces:  # this machine's loopback: hold the rendezvous port from now on
        sock = listen(placement.master_addr, port)
        placement = dataclasses.replace(placement, master_port=sock.getsockname()[1])
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    beats = ctx.Array("d", [time.monotonic()] * nprocs, lock=False)
    outputs: dict[int, Any] = {}
    failures: dict[int, str] = {}
    with tempfile.TemporaryDirectory(prefix="gtopk-stacks-") as stack_dir, signals_stop():
        setup = _Setup(backend, timeout, collective_timeout or timeout, beats, stack_dir, os.getpid())
        # not daemonic: a rank may start DataLoader workers; the finally below and each
        # rank's PR_SET_PDEATHSIG make sure none outlives this call
        procs = [
            ctx.Process(
                target=_worker,
                daemon=False,
                args=(r, nprocs, placement, sock if r == 0 else None, setup, fn, args, results),
            )
            for r in range(nprocs)
        ]
        try:
            for p in procs:
                p.start()
            if sock is not None:
                sock.close()  # rank 0 holds its own copy
            hung = supervise(procs, results, beats, timeout, grace, outputs, failures)
            running = [
                r
                for r, p in enumerate(procs)
                if p.is_alive() and (r in hung or (r not in failures and r not in outputs))
            ]
            stacks = dump_stacks(procs, running, stack_dir) if failures else {}
        finally:
            if sock is not None:
                sock.close()
            stop(procs)
        for r, p in enumerate(procs):
            if r in outputs:
                continue
            text = failures.get(
                r, f"{WorkerError.STOPPED} still running when the group was stopped (another rank failed first)"
            )
            stack = stacks.get(r) or (read_stack(stack_dir, r) if (p.exitcode or 0) < 0 else "")
            failures[r] = text + (f"\nits Python stack then:\n{stack}" if stack else "")
    if failures:
        raise WorkerError(failures)
    return [outputs[r] for r in range(nprocs)]
