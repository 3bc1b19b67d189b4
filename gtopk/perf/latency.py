"""Latency measurements of a process group (every function is collective over it): the
ping-pong of ``gtopk.perf.netbench`` (alpha and beta), the step of the backend's own ring
collectives (``Network.ring_alpha``), the recursive-doubling exchange with all P ranks up
(``alpha_at_P``), and the helpers they share with netbench's collectives (where a rank's
tensors live, waiting for its device, the span of a collective over the ranks' clocks)."""

from __future__ import annotations

import socket
import statistics
from collections.abc import Callable

import torch
import torch.distributed as dist

from gtopk import host
from gtopk.reducers.outcome import ReduceRecord
from gtopk.reducers.schedules import Payload, recursive_doubling
from gtopk.reducers.wire import PointToPoint


def device() -> torch.device:
    """Where this rank's tensors live for the group's backend: its GPU under NCCL (bound by
    ``join_group``), else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def settle(t: torch.Tensor) -> None:
    """Wait until the work queued on ``t``'s device is done (NCCL returns before it is)."""
    if t.is_cuda:
        torch.cuda.synchronize(t.device)


#: round trips, at least, of a message of at most ``SMALL_BYTES`` (alpha is the median of
#: theirs, ``gtopk.perf.netprofile.fit_alpha_beta``): each costs well under a millisecond. With 10,
#: calibrations of one emulated 1 Gbit/s network on the quiet 2-core machine gave alpha
#: 0.08-0.16 ms, and a size's median reached 0.59 ms; with 50 the small sizes agreed
#: (0.09-0.11 ms; docs/payoff.md)
SMALL_REPS, SMALL_BYTES = 50, 8192


def pingpong(rank: int, world: int, sizes: list[int], reps: int) -> list[tuple[int, float]] | None:
    """Collective over the group (ranks >= 2 only wait at the barrier). On rank 0:
    [(bytes, one-way seconds)]: the median of ``reps`` timed round trips per size (at least
    ``SMALL_REPS`` up to ``SMALL_BYTES``), after two untimed ones, halved."""
    out = []
    if rank < 2:
        for n in sizes:
            buf = torch.zeros(max(1, n), dtype=torch.uint8, device=device())
            rtts = []
            for i in range((max(reps, SMALL_REPS) if n <= SMALL_BYTES else reps) + 2):
                t0 = host.now()
                if rank == 0:
                    dist.send(buf, 1)
                    dist.recv(buf, 1)
                else:
                    dist.recv(buf, 0)
                    dist.send(buf, 0)
                settle(buf)
                if i >= 2:
                    rtts.append(host.now() - t0)
            out.append((n, statistics.median(rtts) / 2))
    dist.barrier()
    return out if rank == 0 else None


def on_one_host(world: int) -> bool:
    """Collective: whether every rank runs on this host (one ``gtopk.host.now`` clock)."""
    hosts: list = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    return len(set(hosts)) == 1


def span(starts: torch.Tensor, ends: torch.Tensor, one_clock: bool) -> float:
    """Time from the last rank's start to the last rank's end (clock readings per rank);
    without one shared clock, the slowest rank's own time."""
    return (ends.max() - starts.max() if one_clock else (ends - starts).max()).item()


def median_span(call: Callable[[], None], world: int, reps: int, one_clock: bool) -> float:
    """Collective. ``call`` (itself collective) after a barrier, 2 untimed times then ``reps``
    timed ones; the median ``span`` of the timed ones over the ranks' clock readings."""
    spans = []
    for i in range(reps + 2):
        dist.barrier()
        t0 = host.now()
        call()
        t = torch.tensor([t0, host.now()], dtype=torch.float64, device=device())
        everyone = [torch.zeros_like(t) for _ in range(world)]
        dist.all_gather(everyone, t)
        e = torch.stack(everyone)
        if i >= 2:
            spans.append(span(e[:, 0], e[:, 1], one_clock))
    return statistics.median(spans)


def round_latency(rank: int, world: int, reps: int, one_clock: bool) -> float | None:
    """Collective. Median time, on rank 0, of a recursive-doubling exchange of 8-byte
    messages over the whole group (the schedule gTop-k's ``recursive_doubling`` uses),
    from the last rank's start to the last rank's end on one shared clock when every rank
    runs on this host (else the slowest rank's own time). Divided by the model's number of
    rounds it is the latency per message with all P ranks running, ``alpha_at_P``: on a
    real cluster close to the ping-pong alpha; on an emulated one sharing few CPU cores
    among P ranks it adds the cost of waking P processes every round."""
    p2p = PointToPoint(ReduceRecord(), lambda r: r, None)
    word = Payload(lambda v: v.view(torch.uint8), lambda b: b.view(torch.float64), 8)
    new_buf = lambda n: torch.empty(n, dtype=torch.uint8, device=device())  # noqa: E731

    def exchange() -> None:
        one = torch.ones(1, dtype=torch.float64, device=device())
        settle(recursive_doubling(p2p, rank, world, one, torch.add, word, word, new_buf))

    t = median_span(exchange, world, reps, one_clock)  # every rank: it is collective
    return t if rank == 0 else None


def ring_latency(rank: int, world: int, reps: int, one_clock: bool) -> float | None:
    """Collective. On rank 0: the median time of the backend's own all-reduce of ``world``
    float32 flags (the training loop's non-finite check: ``gtopk.train.faults.NonFiniteGuard``),
    from the last rank's start to the last rank's end (``span``), over its 2(P - 1) ring steps:
    the latency of one step of the backend's collectives (``Network.ring_alpha``). A gloo TCP
    pair sends a message only once its receiver has posted the receive; a ring step posts
    both at once, so it pays a notice's crossing before the data's, where a ping-pong (whose
    receiver waits with its receive posted) pays one crossing."""
    flags = torch.zeros(world, device=device())

    def check() -> None:
        dist.all_reduce(flags)
        settle(flags)

    t = median_span(check, world, reps, one_clock)  # every rank: it is collective
    return t / (2 * (world - 1)) if rank == 0 else None
