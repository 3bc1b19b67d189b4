"""A low-bandwidth cluster on one machine: one network namespace per rank, joined by a
Linux bridge (the switch, in its own namespace) over veth links that ``tbf`` shapes to
``bandwidth`` in both directions. Needs root and iproute2 (``ip``, ``tc``).

Layout for a job with P ranks (names unique per job, see ``gtopk.run.cluster.netns``)::

    <job>-r0 [eth0 10.99.0.1] ==tbf== [p0]
    <job>-r1 [eth0 10.99.0.2] ==tbf== [p1]   <job>-sw: bridge br0 over p0..p{P-1}
    ...

Every rank reaches every other through two shaped hops (its uplink and the peer's
downlink), so each rank's traffic is limited to ``bandwidth`` each way, like one NIC on a
non-blocking switch. Workers set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME to ``eth0``,
and NCCL is told to use sockets (no shared memory, P2P or InfiniBand shortcuts).
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

from gtopk.run.cluster import netns
from gtopk.run.cluster.base import Cluster, ClusterError, Placement

IFNAME = "eth0"
PORT = 29500  # inside the job's own namespaces: no clash with other jobs
#: every rank's environment: both backends' sockets on the shaped link, and every path by
#: which NCCL could bypass it turned off (InfiniBand, GPU peer-to-peer, shared memory,
#: NVLink SHARP on NVSwitch hosts, CollNet in-network reduction)
RANK_ENV = {
    "GLOO_SOCKET_IFNAME": IFNAME,
    "NCCL_SOCKET_IFNAME": IFNAME,
    "NCCL_IB_DISABLE": "1",
    "NCCL_P2P_DISABLE": "1",
    "NCCL_SHM_DISABLE": "1",
    "NCCL_NVLS_ENABLE": "0",
    "NCCL_COLLNET_ENABLE": "0",
}
_UNITS = {
    "bit": 1,
    "kbit": 1e3,
    "mbit": 1e6,
    "gbit": 1e9,
    "tbit": 1e12,
    "bps": 8,
    "kbps": 8e3,
    "mbps": 8e6,
    "gbps": 8e9,
}


def rate_bits_per_s(rate: str) -> float:
    """tc rate syntax (``1gbit``, ``100mbit``, ``125mbps`` = bytes) in bits per second."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]+)\s*", str(rate))
    if not m or m.group(2).lower() not in _UNITS:
        raise ClusterError(f"cluster.bandwidth={rate!r} is not a tc rate; write e.g. 1gbit, 100mbit or 10gbit")
    return float(m.group(1)) * _UNITS[m.group(2).lower()]


def address(rank: int) -> str:
    n = rank + 1
    return f"10.99.{n >> 8}.{n & 255}"


class EmulatedCluster(Cluster):
    """Shaped namespaces; ``bandwidth`` per link and direction (tc syntax), ``burst`` the
    token bucket size, ``latency`` the longest a packet may queue in it, ``mtu`` bytes."""

    kind = "emulated"
    MAX_NODES = 4094

    def __init__(
        self,
        bandwidth: str = "1gbit",
        burst: str = "32kb",
        latency: str = "10ms",
        mtu: int = 1500,
        gso_max_size: int | None = 16384,
    ):
        self.bandwidth, self.burst, self.latency, self.mtu = str(bandwidth), str(burst), str(latency), int(mtu)
        self.gso_max_size = gso_max_size
        self.bits_per_s = rate_bits_per_s(self.bandwidth)

    def check(self, nodes: int) -> None:
        reason = netns.unavailable_reason()
        if reason:
            raise ClusterError(
                f"cluster=emulated: {reason}. Run as root with iproute2, or use "
                "cluster=local (loopback, unshaped) or the alpha-beta model (gtopk.perf.model)"
            )
        if nodes > self.MAX_NODES:
            raise ClusterError(f"nodes={nodes}: cluster=emulated supports at most {self.MAX_NODES} ranks")

    def describe(self) -> dict:
        return {
            "cluster": self.kind,
            "bandwidth": self.bandwidth,
            "bandwidth_bits_per_s": self.bits_per_s,
            "burst": self.burst,
            "latency": self.latency,
            "mtu": self.mtu,
            "gso_max_size": self.gso_max_size,
        }

    def _commands(self, job: str, nodes: int) -> dict[str | None, tuple[list[str], list[str]]]:
        """``ip`` and ``tc`` batch commands per namespace (None: the caller's own)."""
        sw = f"{job}-sw"
        shape = f"tbf rate {self.bandwidth} burst {self.burst} latency {self.latency}"
        root = [f"netns add {sw}"] + [f"netns add {job}-r{r}" for r in range(nodes)]
        root += [
            f"link add {IFNAME} netns {job}-r{r} mtu {self.mtu} type veth peer name p{r} netns {sw} mtu {self.mtu}"
            for r in range(nodes)
        ]
        plan: dict[str | None, tuple[list[str], list[str]]] = {None: (root, [])}
        switch = ["link add br0 type bridge", "link set br0 up"]
        switch += [c for r in range(nodes) for c in (f"link set p{r} master br0", f"link set p{r} up")]
        gso = f" gso_max_size {self.gso_max_size}" if self.gso_max_size else ""
        switch += [f"link set p{r}{gso}" for r in range(nodes)] if gso else []
        plan[sw] = (switch, [f"qdisc add dev p{r} root {shape}" for r in range(nodes)])
        for r in range(nodes):
            plan[f"{job}-r{r}"] = (
                ["link set lo up", f"addr add {address(r)}/16 dev {IFNAME}", f"link set {IFNAME} up{gso}"],
                [f"qdisc add dev {IFNAME} root {shape}"],
            )
        return plan

    @contextmanager
    def up(self, nodes: int) -> Iterator[Placement]:
        self.check(nodes)
        netns.sweep_stale()
        job = f"{netns.PREFIX}{os.getpid()}x{secrets.token_hex(3)}"
        names = [f"{job}-sw"] + [f"{job}-r{r}" for r in range(nodes)]
        reaper = netns.start_reaper(names)  # removes them even if we are SIGKILLed
        try:
            try:
                for ns, (ip, tc) in self._commands(job, nodes).items():
                    netns.run_batch("ip", ip, ns)
                    netns.run_batch("tc", tc, ns)
            except netns.NetnsError as e:
                raise ClusterError(f"cluster=emulated could not be built: {e}. Use cluster=local instead") from None
            yield Placement(master_addr=address(0), master_port=PORT, namespaces=tuple(names[1:]), env=dict(RANK_ENV))
        finally:
            netns.delete(names)
            if reaper.stdin:
                reaper.stdin.close()
            reaper.wait(timeout=30)
