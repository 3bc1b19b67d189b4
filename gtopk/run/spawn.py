"""Start P worker processes on this machine, each in a torch.distributed world.

``spawn(fn, nprocs, args)`` runs ``fn(rank, world_size, *args)`` in ``nprocs`` new
processes joined in one process group (gloo on loopback by default), and returns the
ranks' return values in rank order: a ``gtopk.run.pool.WorkerGroup`` for one task (a
group runs many). The launcher's primitives (``WorkerError``, ``listen``, ``join_group``,
the default intra-op thread count) live in ``gtopk.run.world`` and are re-exported here. Nothing is left
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
* On loopback (the default placement) nothing listens on the machine's network: the
  workers' gloo and NCCL sockets are bound to the loopback device too (GLOO_SOCKET_IFNAME,
  NCCL_SOCKET_IFNAME, unless the environment sets them).
* Workers die with their parent (PR_SET_PDEATHSIG), and SIGTERM or Ctrl-C of the parent
  stops them before it exits. Process groups are created and destroyed explicitly in
  each worker (try/finally).
* Where the platform has it (Linux) the workers are forked from a fork server that has
  imported torch once (``start_method``, ``gtopk.run.forkserver``): they share those pages,
  and get the parent's environment as it is when ``spawn`` is called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gtopk.host import heartbeat as heartbeat  # re-exported: what workers call
from gtopk.run.cluster.base import Placement
from gtopk.run.pool import WorkerGroup
from gtopk.run.world import PortInUse as PortInUse  # re-exported with the rest of the launcher's API
from gtopk.run.world import WorkerError as WorkerError
from gtopk.run.world import join_group as join_group
from gtopk.run.world import listen as listen
from gtopk.run.world import threads_per_worker as threads_per_worker


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
    start_method: str | None = None,
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
    ``start_method``: ``forkserver`` or ``spawn`` (``WorkerGroup``'s default: forkserver
    where the platform has it, unless ``GTOPK_START_METHOD`` says).
    """
    with WorkerGroup(
        nprocs,
        backend,
        timeout,
        grace,
        placement,
        collective_timeout=collective_timeout,
        port=port,
        start_method=start_method,
    ) as group:
        return group.run(fn, args, timeout=timeout)
