"""Where a collective's milliseconds go: the critical path of one traced call, summarised as
skew, wire and software time (all local; ``gtopk.perf.tracerun`` records and runs it).

Input: every rank's events of one call (``gtopk.reducers.wire.RoundTrace``; for a backend
collective, ``collective_trace``), read on one clock that all ranks share: the host's
monotonic clock (``time.perf_counter``, through ``gtopk.host.Clock``) when the ranks run on
one machine (loopback, the emulated cluster's namespaces), in virtual seconds under time
dilation. Every rank's events end with ``END`` and hold one ``START``; only receives posted
before the call (``PointToPoint.post_early``, while the rank selected) come before it
(``call_events``).

**The walk.** From the rank that ends last, back in time: an interval that ends when a
message completes is spent waiting for it. If the partner posted its half (the send this
rank receives, the receive this rank's send needs: gloo sends only to a posted receive)
after this rank began to wait, the walk moves to the partner at that moment, and the
interval from there to the completion is the message's transfer; otherwise the transfer is
the wait itself. Every other interval is this rank's own work (packing, merging, Python).
The walk stops at a rank's ``START``. Its segments tile the time from that start to the
last end, so by construction, for the call's ``total`` (last end - first start):

  total = skew + wire + transport + software

* skew: the first start to the start where the path begins (waiting for a rank that came
  to the collective later);
* wire: for each transfer on the path, alpha + bytes x beta (the calibrated network), or
  the transfer's length if that is shorter (then part of the message was hidden);
* transport: the rest of each transfer: what the library and the kernel add to a message
  beyond the alpha-beta cost (gloo's ready-to-receive notice, thread wake-ups);
* software: the path's own-work intervals; ``merge``, the part that ends in a merge.

A backend collective (Top-k's all-gather) is one message from every rank to every rank:
its gate is the last rank's post, its wire the cost model's time for it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch.distributed as dist

from gtopk.reducers.costmodel import Network
from gtopk.reducers.wire import END, MERGED, POST_RECV, POST_SEND, RECEIVED, SENT, START, RoundTrace

POST_COLL, COLL_DONE = "post_collective", "collective_done"  # a backend collective: a = 0, b = bytes sent
COMPLETIONS = (SENT, RECEIVED, COLL_DONE)

Event = tuple[float, str, int, int]


@dataclass
class Breakdown:
    """One traced call, in seconds (see the module's docstring). ``span``: last end - last
    start (the collective alone, the arrival skew left out); ``messages`` and ``path_bytes``:
    the transfers on the critical path and their bytes."""

    total: float = 0.0
    span: float = 0.0
    skew: float = 0.0
    wire: float = 0.0
    transport: float = 0.0
    software: float = 0.0
    merge: float = 0.0
    messages: int = 0
    path_bytes: int = 0
    path: list = field(default_factory=list)  # (rank, kind, seconds) per segment, last first

    def as_row(self) -> dict:
        row = asdict(self)
        row.pop("path")
        return row


@dataclass(frozen=True)
class _Op:
    rank: int
    peer: int
    send: bool
    nbytes: int
    posted: int  # index of the posting event in its rank's list


def _ops(events: Sequence[Event], rank: int) -> tuple[dict, dict]:
    """A rank's messages: ``by_completion[event index]`` the op that event completes, and
    ``posted[(peer, send)]`` the ops in posting order (FIFO per pair and direction)."""
    posted: dict[tuple[int, bool], list[_Op]] = defaultdict(list)
    open_: dict[tuple[int, bool], list[_Op]] = defaultdict(list)
    by_completion = {}
    for i, (_, kind, a, b) in enumerate(events):
        if kind in (POST_SEND, POST_RECV):
            op = _Op(rank, a, kind == POST_SEND, b, i)
            posted[(a, op.send)].append(op)
            open_[(a, op.send)].append(op)
        elif kind in (SENT, RECEIVED):
            by_completion[i] = open_[(a, kind == SENT)].pop(0)
    return by_completion, posted


def call_events(events: Sequence[Event], start: float, end: float) -> list[Event]:
    """One rank's events of one call, its ``START`` at ``start`` and its ``END`` at ``end``:
    the events read before ``start`` (receives posted early) come before ``START``."""
    early = [e for e in events if e[0] < start]
    return [*early, (start, START, 0, 0), *events[len(early) :], (end, END, 0, 0)]


def critical_path(
    ranks: Sequence[Sequence[Event]], net: Network, collective_wire: float = 0.0, eager: bool = False
) -> Breakdown:
    """The critical path of one call (``ranks[i]``: rank i's events, on one clock: one
    START, after it all but receives posted early, END last). ``collective_wire``: the
    alpha-beta time of a backend collective's transfer (``COLL_DONE``); point-to-point
    transfers cost ``net.msg(bytes)``. A walk that reaches a receive posted before its
    rank's START stops there: from the first start to that post is skew (the rank was
    still selecting). ``eager``: the sends were buffered (``gtopk.reducers.transport``'s
    sockets: the trace's ``eager``): a send waits for no receive, so only a receive
    gates on its partner, and a send alone is its rank's own work (writing to the kernel)."""
    P = len(ranks)
    starts = []
    for r, ev in enumerate(ranks):
        at = [i for i, e in enumerate(ev) if e[1] == START]
        if len(at) != 1 or ev[-1][1] != END or any(e[1] != POST_RECV for e in ev[: at[0]]):
            raise ValueError(
                f"rank {r}'s events must hold one {START!r} (only early receives before it) and end with {END!r}"
            )
        starts.append(at[0])
    ops = [_ops(ev, r) for r, ev in enumerate(ranks)]
    index = {(r, i): n for r in range(P) for i, n in _nth_index(ops[r][1])}
    coll = [[i for i, e in enumerate(ev) if e[1] == POST_COLL] for ev in ranks]

    def mirror(rank: int, op: _Op) -> _Op:  # the partner's half of a message
        return ops[op.peer][1][(rank, not op.send)][index[(rank, op.posted)]]

    for r, (done, _) in enumerate(ops):
        for i, op in done.items():
            if eager and op.send:
                continue
            if ranks[op.peer][mirror(r, op).posted][0] > ranks[r][i][0]:
                raise ValueError("events are not on one clock: a message completed before its partner posted it")
    first = min(ev[at][0] for ev, at in zip(ranks, starts))
    out = Breakdown()
    rank = max(range(P), key=lambda r: ranks[r][-1][0])
    k = len(ranks[rank]) - 1
    out.total = ranks[rank][-1][0] - first
    out.span = ranks[rank][-1][0] - max(ev[at][0] for ev, at in zip(ranks, starts))

    def add(kind: str, seconds: float, who: int) -> None:
        setattr(out, kind, getattr(out, kind) + seconds)
        out.path.append((who, kind, seconds))

    while k > starts[rank]:
        ev = ranks[rank]
        t_end = ev[k][0]
        j = k
        while ev[j][1] in COMPLETIONS and ev[j - 1][1] in COMPLETIONS:
            j -= 1  # an exchange: its send and receive complete together
        if ev[k][1] not in COMPLETIONS:
            add("software", t_end - ev[k - 1][0], rank)
            if ev[k][1] == MERGED:
                out.merge += t_end - ev[k - 1][0]
            k -= 1
            continue
        waited = ev[j - 1][0]  # this rank began to wait after its previous event
        gates = []
        for i in range(j, k + 1):
            if ev[i][1] == COLL_DONE:
                n = sum(1 for c in coll[rank] if c < i) - 1
                g = max(range(P), key=lambda r: ranks[r][coll[r][n]][0])
                gates.append((ranks[g][coll[g][n]][0], g, coll[g][n], collective_wire, ev[i][3]))
            else:
                op = ops[rank][0][i]
                if eager and op.send:
                    continue
                half = mirror(rank, op)
                gates.append((ranks[op.peer][half.posted][0], op.peer, half.posted, net.msg(op.nbytes), op.nbytes))
        if not gates:  # a buffered send: this rank's own work
            add("software", t_end - ev[k - 1][0], rank)
            k -= 1
            continue
        gate, peer, at, cost, nbytes = max(gates)
        start = gate if gate > waited else waited
        length = t_end - start
        add("wire", min(length, cost), rank)
        add("transport", length - min(length, cost), rank)
        out.messages += 1
        out.path_bytes += nbytes
        if gate > waited:
            rank, k = peer, at
        else:
            k = j - 1
    out.skew = ranks[rank][k][0] - first
    return out


def _nth_index(posted: dict) -> Iterator[tuple[int, int]]:
    """(event index of each posted op, its position among its pair-and-direction's ops)."""
    for queue in posted.values():
        for n, op in enumerate(queue):
            yield op.posted, n


@contextmanager
def collective_trace(trace: RoundTrace) -> Iterator[None]:
    """Within it, ``torch.distributed.all_gather`` and ``all_reduce`` (the calls a reducer
    makes through ``dist.``) record ``POST_COLL`` and ``COLL_DONE`` into ``trace``. Local;
    for a traced benchmark's own process only."""
    saved = {name: getattr(dist, name) for name in ("all_gather", "all_reduce")}

    def wrap(fn: Callable, nbytes_of: Callable) -> Callable:
        def traced(*args, **kwargs):
            nbytes = nbytes_of(*args)
            trace(POST_COLL, 0, nbytes)
            out = fn(*args, **kwargs)
            trace(COLL_DONE, 0, nbytes)
            return out

        return traced

    size = lambda t: t.numel() * t.element_size()  # noqa: E731
    dist.all_gather = wrap(saved["all_gather"], lambda outs, t, *_: size(t))
    dist.all_reduce = wrap(saved["all_reduce"], lambda t, *_: size(t))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)
