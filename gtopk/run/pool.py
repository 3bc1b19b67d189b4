"""A persistent group of P worker processes that runs tasks one after another.

``WorkerGroup(P, ...)`` starts P processes once, joined in one torch.distributed world
(gloo on loopback by default, or where ``placement`` says); ``group.run(fn, args)`` runs
``fn(rank, P, *args)`` on every rank and returns the results by rank; ``close()`` ends the
group (each worker destroys its process group and exits). ``gtopk.run.spawn.spawn`` is the
one-shot form (a group for one task). What the group guarantees:

* A rank that raises, dies (SIGKILL, segfault) or hangs stops the whole group: the others
  are stopped after ``grace`` seconds and ``WorkerError`` carries every rank's traceback
  (and the Python stack of each rank that was still running, dumped by faulthandler).
  A failed group runs nothing more; start a new one.
* Per task: the watchdog ``timeout`` (a running rank that reports no progress through
  ``gtopk.host.heartbeat()`` for this long is hung), the intra-op thread count, and the
  timeout of every collective of the default process group. Between tasks the workers
  wait for the next one; no watchdog runs.
* The rendezvous port is bound by the parent before any worker starts and handed to rank
  0 already bound (``PortInUse`` if a fixed one is taken); it is free again after close.
* On this machine alone (no namespaces, a loopback ``master_addr``: cluster=local, simulated)
  nothing listens on the machine's network: the workers get ``gtopk.run.world.loopback_env()``
  (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME: the loopback device, unless the environment sets them).
* ``close()``: each worker destroys its process group and says so; then the workers are
  stopped (not left to run their interpreter's shutdown).
* Workers die with their parent (PR_SET_PDEATHSIG); while the group lives, SIGTERM and
  SIGHUP of the parent raise ``SystemExit`` in it (Ctrl-C raises KeyboardInterrupt), and
  whatever ends the parent ends the workers first (``close`` also runs at exit).
* ``start_method``: ``forkserver`` (the default where the platform has it) forks the workers
  from a server that has imported torch once (``gtopk.run.forkserver``): the ranks share
  those pages. The server exits when the launcher does (SIGKILL included), and with it
  the workers (their parent); each worker is handed the launcher's environment, stdout,
  stderr, CPU affinity and niceness as they are when the group starts, as under ``spawn``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import faulthandler
import math
import os
import pickle
import queue
import signal
import socket
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing  # noqa: F401 - its tensor reductions for the queues, as before

from gtopk import host
from gtopk.run import forkserver
from gtopk.run.cluster.base import Placement
from gtopk.run.supervise import dump_stacks, read_stack, signals_stop, stack_dir, stop, supervise
from gtopk.run.world import (
    STACK_HEADER,
    WorkerError,
    is_loopback,
    join_group,
    listen,
    loopback_env,
    set_collective_timeout,
    threads_per_worker,
)


@dataclasses.dataclass(frozen=True)
class _Setup:
    """What every worker needs besides its rank (picklable)."""

    backend: str
    startup_timeout: float
    collective_timeout: float
    beats: Any
    stack_dir: str
    parent: int  # the workers' parent: the launcher (spawn) or its fork server
    handover: forkserver.Handover


@dataclasses.dataclass(frozen=True)
class _Task:
    fn: Callable
    args: tuple
    threads: int
    collective_timeout: float


_stack_file: Any = None  # kept open: faulthandler writes this worker's stacks into it


def _worker(
    rank: int,
    nprocs: int,
    placement: Placement,
    store_sock: socket.socket | None,
    setup: _Setup,
    tasks: Any,
    results: Any,
) -> None:
    """One rank: join the group, report ready (its pid), then run tasks until ``None``
    comes or one fails (collective: every task is)."""
    global _stack_file
    host.die_with_parent()
    if os.getppid() != setup.parent:  # the parent died before PR_SET_PDEATHSIG took effect
        os._exit(1)
    forkserver.leave_server()  # else a forked worker would keep its server, hence itself, alive
    setup.handover.apply()  # what a spawned worker takes from the launcher: its environment first
    host.watch(setup.beats, rank)
    host.heartbeat()  # imports done: the watchdog counts from here
    _stack_file = open(Path(setup.stack_dir) / f"rank{rank}.txt", "w")
    faulthandler.enable(_stack_file)  # fatal signals (segfault, abort): the stack, then death
    faulthandler.register(signal.SIGUSR1, _stack_file)  # the parent asks before it stops a live rank
    try:
        placement.enter(rank)  # its network namespace, MASTER_ADDR/PORT, socket ifname
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(nprocs))
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
    except BaseException:  # noqa: BLE001 - reported to the parent, which decides
        results.put((rank, False, traceback.format_exc()))
        return
    results.put((rank, True, pickle.dumps(os.getpid())))
    closing = False
    try:
        while not (closing := (task := tasks.get()) is None):
            host.heartbeat()
            try:
                torch.set_num_threads(task.threads)
                set_collective_timeout(task.collective_timeout)
                # plain pickle: tensors are copied, not shared through fds that die with us
                results.put((rank, True, pickle.dumps(task.fn(rank, nprocs, *task.args))))
            except BaseException:  # noqa: BLE001 - the group ends: reported, then out
                results.put((rank, False, traceback.format_exc()))
                break
    except KeyboardInterrupt:  # Ctrl-C between tasks: the parent stops too
        pass
    finally:
        with contextlib.suppress(BaseException):
            dist.destroy_process_group()
    if closing:
        results.put((rank, True, pickle.dumps(None)))  # left the process group: the parent may stop us


#: the least time the ranks get to start (spawn, import torch, join the group), whatever the watchdog's timeout
STARTUP_S = 300.0


class WorkerGroup:
    """``nprocs`` worker processes in one process group, started once, running tasks.

    ``timeout`` is the default watchdog timeout of a task (every limit here is in virtual
    seconds: x ``placement.dilation`` on the wall); ``startup_timeout`` (default
    ``max(timeout, STARTUP_S)``) bounds the ranks' start-up (interpreter, imports, rendezvous:
    tens of seconds on a loaded machine, whatever a task's watchdog says);
    ``collective_timeout`` (default ``timeout``) the default limit of a collective once
    every rank has joined; ``threads`` (default cores / nprocs) the default intra-op
    thread count; ``grace``: how long the others get to report after the first failure.
    ``placement`` (from ``gtopk.run.cluster``) says where each rank runs; default loopback,
    where ``port`` (0: a free one) is bound here and passed to rank 0 already bound.
    ``start_method``: ``forkserver`` or ``spawn`` (None: ``GTOPK_START_METHOD``, else
    forkserver where the platform has it); ``self.start_method`` is the one used
    (``gtopk.run.forkserver.context``). Raises ``WorkerError`` if a rank fails to start
    (nothing is left running then).
    """

    def __init__(
        self,
        nprocs: int,
        backend: str = "gloo",
        timeout: float = 120.0,
        grace: float = 5.0,
        placement: Placement | None = None,
        collective_timeout: float | None = None,
        port: int = 0,
        threads: int | None = None,
        startup_timeout: float | None = None,
        start_method: str | None = None,
    ):
        if nprocs < 1:
            raise ValueError(f"nodes={nprocs} must be >= 1")
        ctx, parent, self.start_method = forkserver.context(start_method)
        # under time dilation D (``placement.dilation``) the workers run D times slower: every limit is D times longer
        self.dilation = placement.dilation if placement else 1
        self.nprocs, self.timeout, self.grace = nprocs, float(timeout) * self.dilation, float(grace)
        self.collective_timeout = float(collective_timeout or timeout) * self.dilation
        self.startup_timeout = float(startup_timeout or max(float(timeout), STARTUP_S)) * self.dilation
        self.threads = int(threads or threads_per_worker(nprocs))
        self.closed = False
        placement = placement or Placement(master_addr="127.0.0.1", master_port=port)
        sock = None
        if not placement.namespaces:  # this machine's loopback: hold the rendezvous port from now on
            sock = listen(placement.master_addr, port)
            placement = dataclasses.replace(placement, master_port=sock.getsockname()[1])
            if is_loopback(placement.master_addr):  # and gloo's and NCCL's sockets on it too
                placement = dataclasses.replace(placement, env={**loopback_env(), **placement.env})
        self._exit = contextlib.ExitStack()
        self._exit.callback(lambda: sock and sock.close())
        self._stack_dir = self._exit.enter_context(stack_dir())
        self._exit.enter_context(signals_stop())
        self._results = ctx.Queue()
        self._tasks = [ctx.SimpleQueue() for _ in range(nprocs)]
        self._beats = ctx.Array("d", [time.monotonic()] * nprocs, lock=False)
        setup = _Setup(
            backend,
            self.startup_timeout,
            self.collective_timeout,
            self._beats,
            self._stack_dir,
            parent,
            forkserver.Handover.now(),
        )
        # not daemonic: a rank may start DataLoader workers; close() and each rank's
        # PR_SET_PDEATHSIG make sure none outlives the group
        self._procs = [
            ctx.Process(
                target=_worker,
                daemon=False,
                args=(r, nprocs, placement, sock if r == 0 else None, setup, self._tasks[r], self._results),
            )
            for r in range(nprocs)
        ]
        atexit.register(self.close)
        try:
            for p in self._procs:
                p.start()
            if sock is not None:
                sock.close()  # rank 0 holds its own copy
            self.pids: list[int] = self._collect(self.startup_timeout)
        except BaseException:
            self._stop()
            self.close()
            raise

    def run(
        self,
        fn: Callable,
        args: tuple = (),
        timeout: float | None = None,
        threads: int | None = None,
        collective_timeout: float | None = None,
    ) -> list[Any]:
        """Collective over the group: ``fn(rank, nprocs, *args)`` on every rank (``fn``
        importable, at module level; it may call ``gtopk.host.heartbeat()`` as it makes
        progress); the results by rank. Any failure (``WorkerError``, or an exception
        here, Ctrl-C included) stops the whole group before it propagates."""
        if self.closed:
            raise RuntimeError("this worker group is closed (a task failed, or close() was called); start another")
        task = _Task(
            fn,
            tuple(args),
            int(threads or self.threads),
            float(collective_timeout) * self.dilation if collective_timeout else self.collective_timeout,
        )
        try:
            for r in range(self.nprocs):  # the watchdog counts from each rank's first beat in the task
                self._beats[r] = math.inf  # (it beats on taking it), not from when it was queued
            for q in self._tasks:
                q.put(task)  # pickled here: a task that does not pickle fails in the caller
            return self._collect(float(timeout) * self.dilation if timeout else self.timeout)
        except BaseException:
            self._stop()
            self.close()
            raise

    def _collect(self, timeout: float) -> list[Any]:
        """Every rank's report of the current step; on a failure, stop the group and raise
        ``WorkerError`` with every rank's text (and the stacks of the ranks still running)."""
        outputs: dict[int, Any] = {}
        failures: dict[int, str] = {}
        hung = supervise(self._procs, self._results, self._beats, timeout, self.grace, outputs, failures)
        if not failures:
            return [outputs[r] for r in range(self.nprocs)]
        procs = self._procs
        running = [
            r for r, p in enumerate(procs) if p.is_alive() and (r in hung or (r not in failures and r not in outputs))
        ]
        stacks = dump_stacks(procs, running, self._stack_dir)
        self._stop()
        for r, p in enumerate(procs):
            if r in outputs:
                continue
            text = failures.get(
                r, f"{WorkerError.STOPPED} still running when the group was stopped (another rank failed first)"
            )
            stack = stacks.get(r) or (read_stack(self._stack_dir, r) if (p.exitcode or 0) < 0 else "")
            failures[r] = text + (f"{STACK_HEADER}{stack}" if stack else "")
        self.close()
        raise WorkerError(failures)

    def _stop(self) -> None:
        """Terminate every worker now (a failure): the group is closed."""
        self.closed = True
        stop([p for p in self._procs if p.pid is not None])

    def close(self) -> None:
        """End the group: each worker leaves its process group and exits (stopped after
        a few seconds if it does not); idempotent, also run at exit."""
        if not self.closed:
            self.closed = True
            for q in self._tasks:
                with contextlib.suppress(OSError):
                    q.put(None)
            self._await_left(time.monotonic() + self.grace + 5)
        # then stop them: a worker's own interpreter shutdown (torch's) takes seconds
        stop([p for p in self._procs if p.pid is not None])
        self._exit.close()
        atexit.unregister(self.close)

    def _await_left(self, deadline: float) -> None:
        """Wait until every live worker reports that it left the process group."""
        left: set[int] = set()
        while time.monotonic() < deadline:
            if all(r in left or not p.is_alive() for r, p in enumerate(self._procs)):
                return
            with contextlib.suppress(queue.Empty):
                left.add(self._results.get(timeout=0.1)[0])

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
