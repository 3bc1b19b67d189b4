"""The one way work reaches worker processes: ``run_on_cluster``.

Jobs (``gtopk.run.execute``), the local compute profile (``gtopk.run.measure_compute``) and the
network benchmark (``gtopk.perf.netbench``) all run their per-rank functions through it.
It keeps at most one live ``WorkerGroup`` in this process, with the cluster it runs on
(``cluster.up(P)``: the emulated network's namespaces stay up as long as the group
lives). A call whose ``GroupSpec`` equals the live group's reuses it: the P worker
processes start once for all the jobs of one P in a sweep (from the fork server a later
group starts in 0.1 s at P = 2 and 0.5 s at P = 8 on the 2-core machine, spawned 7 and 16 s:
docs/cluster.md, "Memory per rank").
Otherwise the live group is closed and a new one started.

The group is closed: when a call does not ask to keep it (``keep=False``: a single run,
a job under a launcher that runs each job in its own process), on a spec change, after
any failure (``WorkerError``, Ctrl-C, SIGTERM: nothing of a failed group is reused), by
``close()`` (the end of a sweep: ``gtopk.run.jobs.FailedJobs``; a failed job), and at
interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from gtopk.run.pool import WorkerGroup
from gtopk.run.world import threads_per_worker


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    """Everything two tasks must share to run in the same worker group."""

    nodes: int
    backend: str
    threads: int  # intra-op threads per worker
    device: str
    cluster: str  # the cluster's config (``_target_`` and settings), as sorted JSON
    port: int = 0  # rendezvous port on loopback (0: a free one)

    @classmethod
    def of(cls, cfg: DictConfig, nodes: int, backend: str, threads_for: int | None = None) -> GroupSpec:
        """The spec of ``nodes`` workers for config ``cfg`` (a job's or netbench's):
        ``threads_per_worker`` (null or absent: cores / ``threads_for``, default nodes: the
        thread count of a job's real rank also where fewer processes run it), ``device``,
        ``cluster``, ``master_port``."""
        threads = cfg.get("threads_per_worker") or threads_per_worker(threads_for or nodes)
        cluster = json.dumps(OmegaConf.to_container(cfg.cluster, resolve=True), sort_keys=True)
        return cls(int(nodes), backend, int(threads), str(cfg.get("device", "cpu")), cluster, cfg.get("master_port", 0))


@dataclasses.dataclass
class _Live:
    spec: GroupSpec
    group: WorkerGroup
    exit: contextlib.ExitStack  # closes the group, then takes the cluster down


_live: _Live | None = None


def run_on_cluster(
    spec: GroupSpec,
    fn: Callable,
    args: tuple,
    timeout: float,
    collective_timeout: float | None = None,
    keep: bool = False,
) -> list[Any]:
    """Collective over ``spec.nodes`` workers: ``fn(rank, nodes, *args)`` on each (``fn``
    importable), in the live group if its spec is ``spec``, else in a new one on
    ``spec.cluster``; returns the results by rank. ``timeout``: the watchdog's (a rank
    with no ``heartbeat()`` this long is hung), also the new group's start-up limit;
    ``collective_timeout`` (default ``timeout``): a collective waiting longer fails.
    ``keep``: leave the group running for the next call (else it is closed on return).
    Any failure closes the group before it propagates."""
    try:
        group = _group(spec, timeout, collective_timeout)
        out = group.run(fn, args, timeout=timeout, threads=spec.threads, collective_timeout=collective_timeout)
    except BaseException:
        close()
        raise
    if not keep:
        close()
    return out


def _group(spec: GroupSpec, timeout: float, collective_timeout: float | None) -> WorkerGroup:
    """The live group for ``spec``, starting it (after closing another) if needed."""
    global _live
    if _live is not None and _live.spec == spec and not _live.group.closed:
        return _live.group
    close()
    exit = contextlib.ExitStack()
    try:
        placement = exit.enter_context(
            instantiate(json.loads(spec.cluster)).up_for(spec.nodes, spec.threads, spec.device)
        )
        group = exit.enter_context(
            WorkerGroup(
                spec.nodes,
                backend=spec.backend,
                timeout=timeout,
                placement=placement,
                collective_timeout=collective_timeout,
                port=spec.port,
                threads=spec.threads,
            )
        )
    except BaseException:
        exit.close()
        raise
    _live = _Live(spec, group, exit)
    return group


def close() -> None:
    """Close the live group, if any (its workers exit), and take its cluster down."""
    global _live
    live, _live = _live, None
    if live is not None:
        live.exit.close()


atexit.register(close)
