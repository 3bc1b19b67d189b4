"""The cluster interface, and the loopback cluster."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from gtopk.run.cluster import cpucap, netns


class ClusterError(RuntimeError):
    """The cluster cannot be set up here, or a setting of it is bad; the message (one line)
    names the setting and the fix."""


@dataclass(frozen=True)
class Placement:
    """Where each rank of one job runs (picklable: it travels to the spawned workers).

    master_addr / master_port: the rendezvous (rank 0's address as the others see it).
    namespaces: one network namespace name per rank, or empty for the caller's own.
    env: variables every worker sets before creating its process group.
    cpu_groups: one CPU-capped cgroup (its path) per rank, or empty (time dilation:
        ``gtopk.run.cluster.cpucap``).
    """

    master_addr: str
    master_port: int
    namespaces: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cpu_groups: tuple[str, ...] = ()

    @property
    def dilation(self) -> int:
        """The time dilation D the workers run under (``gtopk.host``; 1: real time): the
        launcher gives them D times its timeouts."""
        from gtopk.host import dilation  # torch: not for the reaper, which imports this package

        return dilation(self.env)

    def enter(self, rank: int) -> None:
        """Move the calling worker into its network namespace (and CPU-capped cgroup) and
        set its environment. Call before any socket is created (i.e. before
        ``dist.init_process_group``)."""
        if self.namespaces:
            netns.enter(self.namespaces[rank])
        if self.cpu_groups:
            cpucap.join(self.cpu_groups[rank])
        os.environ.update(self.env)
        os.environ.update(MASTER_ADDR=self.master_addr, MASTER_PORT=str(self.master_port))


class Cluster(ABC):
    """A place to run P workers on this machine."""

    #: short name for records and plots
    kind: str = "cluster"

    def check(self, nodes: int, threads: int | None = None, device: str = "cpu") -> None:
        """Raise ``ClusterError`` (naming the setting and the fix) if ``nodes`` workers of
        ``threads`` intra-op threads on ``device`` cannot run here. Cheap; called before any
        process starts."""
        return None

    def check_job(self, cfg: Any) -> None:
        """``check`` for a job of config ``cfg`` (``gtopk.run.execute``): ``check(cfg.nodes)``."""
        self.check(cfg.nodes)

    def processes(self, nodes: int) -> int:
        """Worker processes a job of ``nodes`` workers starts (one per worker)."""
        return nodes

    def entry(self) -> Callable:
        """What each of them runs: ``fn(rank, processes, cfg_dict, run_dir)`` (importable)."""
        from gtopk.train.loop import run_worker

        return run_worker

    @abstractmethod
    @contextmanager
    def up(self, nodes: int) -> Iterator[Placement]:
        """Build the network for ``nodes`` workers, yield their placement, tear it down
        on exit (also on exceptions and Ctrl-C)."""

    def up_for(self, nodes: int, threads: int, device: str = "cpu") -> AbstractContextManager[Placement]:
        """``up(nodes)`` for workers of ``threads`` intra-op threads each on ``device`` (what
        the runner calls; the emulated cluster's time dilation counts the threads, and
        dilates only CPU work)."""
        return self.up(nodes)

    def describe(self) -> dict:
        """What goes into every record: the cluster kind and its settings."""
        return {"cluster": self.kind}


class LocalCluster(Cluster):
    """All workers on loopback (127.0.0.1), no shaping: this machine's own speed."""

    kind = "local"

    @contextmanager
    def up(self, nodes: int) -> Iterator[Placement]:
        # port 0: gtopk.run.spawn.spawn binds the rendezvous port itself (``port=``) before
        # any worker starts
        yield Placement(master_addr="127.0.0.1", master_port=0)
