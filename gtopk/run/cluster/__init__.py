"""Where the P workers of a job run: loopback (``LocalCluster``) or an emulated
low-bandwidth network of Linux network namespaces (``EmulatedCluster``).

A cluster is picked by config (``cluster=local|emulated``, ``_target_`` instantiation).
``cluster.up(P)`` is a context manager that yields a picklable ``Placement``; each worker
calls ``placement.enter(rank)`` before ``dist.init_process_group``.
"""

from gtopk.run.cluster.base import Cluster, ClusterError, LocalCluster, Placement
from gtopk.run.cluster.emulated import EmulatedCluster

__all__ = ["Cluster", "ClusterError", "LocalCluster", "Placement", "EmulatedCluster"]
