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

**Time dilation** (``dilation``, default ``auto``): P ranks of T intra-op threads on C cores
share them; the cluster runs D times slower than the wall so that each gets a processor of
its own in virtual time (D >= P x T / C; ``auto`` is the least such integer). Every link is
shaped to ``bandwidth`` / D, with the same burst and queue in bytes (``latency`` x D); each
rank is CPU-capped to T / D cores (``gtopk.run.cluster.cpucap``); its clock reads wall
seconds / D and its replayed compute sleeps D times as long (``gtopk.host``); the launcher's
timeouts are D times as long (``Placement.dilation``). ``dilation=1``: real time, as before.
"""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from gtopk.run.cluster import cpucap, netns
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
    "dilation": "auto (the least D >= nodes x threads / cores), 1 (real time) or 8",
    "min_dilation": "2 (no CPU job in real time under dilation=auto) or 1 (no floor)",
}
MTU = (68, 65535)  # IPv4's smallest, a veth's largest
MAX_DILATION = cpucap.MAX_PERIOD_US // cpucap.QUOTA_US  # a CPU cap's period (D x 5 ms) is at most 1 s
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


def _dilation(value: object) -> int | str:
    """``auto``, or a whole number 1 .. MAX_DILATION."""
    return "auto" if value == "auto" else netns.parse_count(value, 1, MAX_DILATION)


def cores() -> int:
    """The CPUs this process may run on (its affinity), which the ranks of a job share."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_threads(nodes: int) -> int:
    """The launcher's intra-op threads per rank (``gtopk.run.world.threads_per_worker``)."""
    from gtopk.run.world import threads_per_worker  # torch: not for the reaper, which imports this package

    return threads_per_worker(nodes)


def rate_bits_per_s(rate: object) -> float:
    """tc rate syntax (``1gbit``, ``100mbit``, ``125mbps`` = bytes) in bits per second;
    ClusterError naming ``cluster.bandwidth`` for anything else."""
    return float(_setting("bandwidth", rate, netns.parse_rate))


def on_gpu(device: str) -> bool:
    """Whether a job's resolved ``device`` (``cpu``, ``cuda``, ``cuda:1``) is a GPU."""
    return str(device).startswith("cuda")


def address(rank: int) -> str:
    n = rank + 1
    return f"10.99.{n >> 8}.{n & 255}"


class EmulatedCluster(Cluster):
    """Shaped namespaces; ``bandwidth`` per link and direction (tc syntax), ``burst`` the
    token bucket size, ``latency`` the longest a packet may queue in it, ``mtu`` bytes, all
    in virtual time; ``dilation`` the time dilation D (``auto`` or an integer >= 1);
    ``min_dilation`` the least D that ``auto`` gives ranks computing on the CPU (1 here: no
    floor; ``conf/cluster/emulated.yaml`` sets 2, so that no CPU job runs in real time)."""

    kind = "emulated"
    MAX_NODES = 4094

    def __init__(
        self,
        bandwidth: str = "1gbit",
        burst: str | int = "32kb",
        latency: str = "10ms",
        mtu: int = 1500,
        gso_max_size: int | None = 16384,
        dilation: int | str = "auto",
        min_dilation: int = 1,
    ):
        # parsed into numbers here, so no setting's text ever reaches ``ip``/``tc`` (their
        # commands are written from these numbers, ``_commands``); a bad one is a ClusterError
        self.rate_bits = _setting("bandwidth", bandwidth, netns.parse_rate)
        self.burst_bytes = _setting("burst", burst, netns.parse_size)
        self.latency_us = _setting("latency", latency, netns.parse_time)
        self.mtu = _setting("mtu", mtu, lambda v: netns.parse_count(v, *MTU))
        gso = None if gso_max_size is None else _setting("gso_max_size", gso_max_size, _gso)
        self.gso_max_size = gso or None  # 0: the kernel's default, as null
        self.dilation = _setting("dilation", dilation, _dilation)
        self.min_dilation = _setting("min_dilation", min_dilation, lambda v: netns.parse_count(v, 1, MAX_DILATION))
        if self.burst_bytes < self.mtu + ETH_HEADER:
            raise ClusterError(
                f"cluster.burst={burst!r} is {self.burst_bytes} bytes, less than one frame of cluster.mtu={self.mtu} "
                f"({self.mtu + ETH_HEADER} bytes): tbf would drop every full-size packet; raise cluster.burst (e.g. 32kb)"
            )
        # as given (validated), for the records: summaries compare these strings across runs
        self.bandwidth, self.burst, self.latency = str(bandwidth), str(burst), str(latency)
        self.bits_per_s = float(self.rate_bits)

    def dilation_for(self, nodes: int, threads: int | None = None, device: str = "cpu") -> int:
        """The time dilation D of ``nodes`` ranks of ``threads`` intra-op threads (None: the
        launcher's default, ``gtopk.run.world.threads_per_worker``) on ``device``: the
        setting, or for ``auto`` the least integer D >= nodes x threads / cores, at least
        ``min_dilation`` where the ranks compute on the CPU (a GPU's work cannot be dilated:
        there, at least 1)."""
        if self.dilation != "auto":
            return int(self.dilation)
        threads = threads or default_threads(nodes)
        floor = 1 if on_gpu(device) else self.min_dilation
        return max(floor, math.ceil(nodes * threads / cores()))

    def check(self, nodes: int, threads: int | None = None, device: str = "cpu") -> None:
        reason = netns.unavailable_reason()
        if reason:
            raise ClusterError(
                f"cluster=emulated: {reason}. Run as root with iproute2, or use "
                "cluster=local (loopback, unshaped) or the alpha-beta model (gtopk.perf.model)"
            )
        if nodes > self.MAX_NODES:
            raise ClusterError(f"nodes={nodes}: cluster=emulated supports at most {self.MAX_NODES} ranks")
        d = self.dilation_for(nodes, threads, device)
        if d > MAX_DILATION:
            raise ClusterError(
                f"cluster.dilation={self.dilation}: nodes={nodes} on {cores()} cores need D = {d}, above "
                f"{MAX_DILATION}; use fewer nodes or threads_per_worker, or cluster.dilation=1 (real time, shared cores)"
            )
        reason = cpucap.unavailable_reason(netns.PREFIX) if d > 1 else None
        if reason:
            raise ClusterError(
                f"cluster.dilation={self.dilation} (D = {d} for nodes={nodes}) caps each rank's CPU, but {reason}; "
                "run as root with a cgroup CPU controller, or pass cluster.dilation=1 (real time, shared cores)"
            )

    def check_job(self, cfg: Any) -> None:
        """``check`` with the job's ``threads_per_worker``; a dilated job must compute on
        the CPU (its cap slows CPU work by D; a GPU's work would look D times too fast)."""
        from gtopk.run.checks import placement  # the device the job will run on
        from gtopk.run.nodes import build

        threads = cfg.get("threads_per_worker") or None
        device, _ = placement(cfg.device, cfg.backend, build(cfg, "compute").wants_gpu)
        self.check(cfg.nodes, threads, device)
        d = self.dilation_for(cfg.nodes, threads, device)
        if d > 1:
            if on_gpu(device):
                raise ClusterError(
                    f"cluster.dilation={self.dilation} (D = {d}) with device={device}: time dilation slows CPU work "
                    "only, GPU work would look D times too fast; pass device=cpu, compute=replay or cluster.dilation=1"
                )

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

    def shaping(self, dilation: int = 1) -> tuple[int, int, int]:
        """(rate bits/s, burst bytes, latency us) of every link's tbf under time dilation D:
        the rate / D (whole bytes/s, rounded), the same burst and queue in bytes (the
        latency x D), so that in virtual time the link is the one configured."""
        rate = max(8, round(self.rate_bits / dilation / 8) * 8)
        return rate, self.burst_bytes, min(netns.U32, self.latency_us * dilation)

    def _commands(self, job: str, nodes: int, dilation: int = 1) -> dict[str | None, tuple[list[str], list[str]]]:
        """``ip`` and ``tc`` batch commands per namespace (None: the caller's own)."""
        if not netns.JOB.fullmatch(job) or not (isinstance(nodes, int) and 0 < nodes <= self.MAX_NODES):
            raise ValueError(f"not a job name and rank count: {job!r}, {nodes!r}")
        if not (isinstance(dilation, int) and 1 <= dilation <= MAX_DILATION):
            raise ValueError(f"not a time dilation: {dilation!r}")
        sw = f"{job}-sw"
        rate_bits, burst_bytes, latency_us = self.shaping(dilation)
        rate, burst, latency = netns.tc_rate(rate_bits), netns.tc_size(burst_bytes), netns.tc_time(latency_us)
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

    def up_for(self, nodes: int, threads: int, device: str = "cpu") -> AbstractContextManager[Placement]:
        return self.up(nodes, threads, device)

    @contextmanager
    def up(self, nodes: int, threads: int | None = None, device: str = "cpu") -> Iterator[Placement]:
        """The network of ``nodes`` ranks of ``threads`` intra-op threads each (None: the
        launcher's default) on ``device``, dilated by ``dilation_for(nodes, threads, device)``."""
        self.check(nodes, threads, device)
        d = self.dilation_for(nodes, threads, device)
        netns.sweep_stale()
        job = f"{netns.PREFIX}{os.getpid()}x{secrets.token_hex(3)}"
        names = [f"{job}-sw"] + [f"{job}-r{r}" for r in range(nodes)]
        reaper = netns.start_reaper(names)  # removes them (and their cgroups) even if we are SIGKILLed
        try:
            try:
                for ns, (ip, tc) in self._commands(job, nodes, d).items():
                    netns.run_batch("ip", ip, ns)
                    netns.run_batch("tc", tc, ns)
                per_rank = threads or default_threads(nodes)
                groups = tuple(cpucap.cap(n, per_rank, d) for n in names[1:]) if d > 1 else ()
            except netns.NetnsError as e:
                raise ClusterError(f"cluster=emulated could not be built: {e}. Use cluster=local instead") from None
            except cpucap.CapError as e:
                raise ClusterError(f"cluster.dilation={self.dilation}: {e}; pass cluster.dilation=1") from None
            from gtopk.host import DILATION_ENV

            env = {**RANK_ENV, DILATION_ENV: str(d)}
            yield Placement(
                master_addr=address(0), master_port=PORT, namespaces=tuple(names[1:]), env=env, cpu_groups=groups
            )
        finally:
            netns.delete(names)
            if reaper.stdin:
                reaper.stdin.close()
            reaper.wait(timeout=30)
