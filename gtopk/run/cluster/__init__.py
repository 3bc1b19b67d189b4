"""Where the P workers of a job run: loopback (``LocalCluster``), an emulated
low-bandwidth network of Linux network namespaces (``EmulatedCluster``), or one process
that trains them all (``SimulatedCluster``).

A cluster is picked by config (``cluster=local|emulated|simulated``, ``_target_`` instantiation).
``cluster.up(P)`` is a context manager that yields a picklable ``Placement``; each worker
calls ``placement.enter(rank)`` before ``dist.init_process_group``.
"""

from gtopk.run.cluster.base import Cluster, ClusterError, LocalCluster, Placement
from gtopk.run.cluster.emulated import EmulatedCluster
from gtopk.run.cluster.simulated import SimulatedCluster

__all__ = ["Cluster", "ClusterError", "LocalCluster", "Placement", "EmulatedCluster", "SimulatedCluster"]
