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
import secrets
from collections.abc import Callable, Iterator
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
#: an example of each setting, for the error messages
EXAMPLES = {
    "bandwidth": "1gbit, 100mbit or 10gbit",
    "burst": "32kb, 64kb or 1mb",
    "latency": "10ms, 500us or 1s",
    "mtu": "1500 or 9000",
    "gso_max_size": "16384, 65536 or null (the kernel's default)",
}
MTU = (68, 65535)  # IPv4's smallest, a veth's largest
ETH_HEADER = 14  # bytes a frame has beyond its MTU-sized payload (what tbf counts)


def _setting(name: str, value: object, parse: Callable[[object], int]) -> int:
    """``parse(value)``, or a one-line ClusterError naming ``cluster.<name>`` and examples."""
    try:
        return parse(value)
    except ValueError as e:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise ClusterError(f"cluster.{name}={shown} {e}; write e.g. cluster.{name}={EXAMPLES[name]}") from None


def _gso(value: object) -> int:
    """``gso_max_size`` in bytes (0: leave the kernel's default)."""
    return netns.parse_count(value, 0, netns.U32)


def rate_bits_per_s(rate: object) -> float:
    """tc rate syntax (``1gbit``, ``100mbit``, ``125mbps`` = bytes) in bits per second;
    ClusterError naming ``cluster.bandwidth`` for anything else."""
    return float(_setting("bandwidth", rate, netns.parse_rate))


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
        burst: str | int = "32kb",
        latency: str = "10ms",
        mtu: int = 1500,
        gso_max_size: int | None = 16384,
    ):
        # parsed into numbers here, so no setting's text ever reaches ``ip``/``tc`` (their
        # commands are written from these numbers, ``_commands``); a bad one is a ClusterError
        self.rate_bits = _setting("bandwidth", bandwidth, netns.parse_rate)
        self.burst_bytes = _setting("burst", burst, netns.parse_size)
        self.latency_us = _setting("latency", latency, netns.parse_time)
        self.mtu = _setting("mtu", mtu, lambda v: netns.parse_count(v, *MTU))
        gso = None if gso_max_size is None else _setting("gso_max_size", gso_max_size, _gso)
        self.gso_max_size = gso or None  # 0: the kernel's default, as null
        if self.burst_bytes < self.mtu + ETH_HEADER:
            raise ClusterError(
                f"cluster.burst={burst!r} is {self.burst_bytes} bytes, less than one frame of cluster.mtu={self.mtu} "
                f"({self.mtu + ETH_HEADER} bytes): tbf would drop every full-size packet; raise cluster.burst (e.g. 32kb)"
            )
        # as given (validated), for the records: summaries compare these strings across runs
        self.bandwidth, self.burst, self.latency = str(bandwidth), str(burst), str(latency)
        self.bits_per_s = float(self.rate_bits)

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
        if not netns.JOB.fullmatch(job) or not (isinstance(nodes, int) and 0 < nodes <= self.MAX_NODES):
            raise ValueError(f"not a job name and rank count: {job!r}, {nodes!r}")
        sw = f"{job}-sw"
        rate, burst, latency = (
            netns.tc_rate(self.rate_bits),
            netns.tc_size(self.burst_bytes),
            netns.tc_time(self.latency_us),
        )
        shape = f"tbf rate {rate} burst {burst} latency {latency}"
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
