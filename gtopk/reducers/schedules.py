"""Communication schedules built from counted point-to-point calls (all collective), and
the same schedules over P ranks' items held in one process (``*_local``: ``cluster=simulated``).

Each function is called by every rank of the group with its own ``item``; ``Payload``
says how an item travels (encode to a uint8 buffer of ``nbytes``, decode back).
``combine(own, received)`` must be commutative bit for bit (sums, gTop-k merges), so that
both partners of an exchange compute the same result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from gtopk.reducers.costmodel import log2_ceil
from gtopk.reducers.wire import MERGED, ROUND, PointToPoint


@dataclass(frozen=True)
class Payload:
    encode: Callable[[Any], Tensor]
    decode: Callable[[Tensor], Any]
    nbytes: int


def tree_reduce(p2p: PointToPoint, rank: int, P: int, item: Any, combine, msg: Payload, new_buf) -> Any:
    """Binomial tree to rank 0: in round r, rank i with i % 2^(r+1) == 0 receives from
    i + 2^r (if it exists) and combines; the sender then drops out. Returns the combined
    item on rank 0 and None on every other rank. ceil(log2 P) rounds.

    Each receive is posted one round ahead (``PointToPoint.post_recv``): the first before
    round 0, the next as soon as the one before it has arrived, before its merge. (All at
    once would let a rank idle in the early rounds of a tree of P != 2^n deliver ahead of
    its round, off the schedule the cost model describes.)"""
    rounds = log2_ceil(P)
    kids = iter([(r, rank + (1 << r)) for r in range(rounds) if rank % (2 << r) == 0 and rank + (1 << r) < P])
    nxt = next(kids, None)
    pending = p2p.post_recv(new_buf(msg.nbytes), nxt[1]) if nxt else None
    for r in range(rounds):
        step = 1 << r
        if rank % (2 * step) == step:
            p2p.mark(ROUND, r)
            p2p.send(msg.encode(item), rank - step)
            return None
        if nxt is not None and nxt[0] == r:
            p2p.mark(ROUND, r)
            theirs = p2p.wait(pending)
            nxt = next(kids, None)
            if nxt is not None:
                pending = p2p.post_recv(new_buf(msg.nbytes), nxt[1])
            item = combine(item, msg.decode(theirs))
            p2p.mark(MERGED)
    return item


def tree_reduce_first(rank: int, P: int, nbytes: int) -> list[tuple[int, int]]:
    """``tree_reduce``'s first receive, (source, bytes), if ``rank`` has one: what the rank
    may post before the collective (``PointToPoint.post_early``); the later ones stay one
    round ahead."""
    return [(rank + 1, nbytes)] if rank % 2 == 0 and rank + 1 < P else []


def tree_broadcast(p2p: PointToPoint, rank: int, P: int, buf: Tensor | None, nbytes: int, new_buf) -> Tensor:
    """Binomial broadcast from rank 0 along the same tree, reversed (rank 0 passes ``buf``,
    the others None). Returns the buffer on every rank. A rank's receive is posted first."""
    parent = rank - (rank & -rank)  # rank 0: none
    pending = p2p.post_recv(new_buf(nbytes), parent) if rank else None
    for r in reversed(range(log2_ceil(P))):
        step = 1 << r
        if rank % (2 * step) == 0:
            if rank + step < P:
                p2p.mark(ROUND, r)
                p2p.send(buf, rank + step)
        elif rank % (2 * step) == step:
            p2p.mark(ROUND, r)
            buf = p2p.wait(pending)
    return buf


def recursive_doubling(
    p2p: PointToPoint, rank: int, P: int, item: Any, combine, msg: Payload, back: Payload, new_buf
) -> Any:
    """Recursive doubling with folding for any P.

    With P2 the largest power of two <= P: rank i >= P2 sends its item to i - P2, which
    combines it; the ranks below P2 exchange with partner i XOR 2^s for s = 0..log2(P2)-1
    and combine; finally rank i - P2 sends the result (as ``back``) to rank i. Every rank
    returns the final item (ranks >= P2 get ``back.decode`` of it). Every receive is
    posted before the first round (``PointToPoint.post_recv``). Trace rounds: 0 the fold,
    1 + s the exchange with i XOR 2^s, log2(P2) + 1 the return.
    """
    P2 = 1 << (P.bit_length() - 1)
    steps = P2.bit_length() - 1
    if rank >= P2:
        result = p2p.post_recv(new_buf(back.nbytes), rank - P2)
        p2p.mark(ROUND, 0)
        p2p.send(msg.encode(item), rank - P2)
        p2p.mark(ROUND, steps + 1)
        return back.decode(p2p.wait(result))
    fold = p2p.post_recv(new_buf(msg.nbytes), rank + P2) if rank + P2 < P else None
    pending = [p2p.post_recv(new_buf(msg.nbytes), rank ^ (1 << s)) for s in range(steps)]
    if fold is not None:
        p2p.mark(ROUND, 0)
        item = combine(item, msg.decode(p2p.wait(fold)))
        p2p.mark(MERGED)
    for s in range(steps):
        p2p.mark(ROUND, 1 + s)
        theirs = p2p.exchange(msg.encode(item), pending[s], rank ^ (1 << s))
        item = combine(item, msg.decode(theirs))
        p2p.mark(MERGED)
    if fold is not None:
        p2p.mark(ROUND, steps + 1)
        p2p.send(back.encode(item), rank + P2)
    return item


def recursive_doubling_receives(rank: int, P: int, nbytes: int, back_nbytes: int) -> list[tuple[int, int]]:
    """Every receive of ``recursive_doubling`` on ``rank``, (source, bytes) in its posting
    order: all are posted before the first round, so all may be posted before the
    collective (``PointToPoint.post_early``)."""
    P2 = 1 << (P.bit_length() - 1)
    if rank >= P2:
        return [(rank - P2, back_nbytes)]
    fold = [(rank + P2, nbytes)] if rank + P2 < P else []
    return fold + [(rank ^ (1 << s), nbytes) for s in range(P2.bit_length() - 1)]


def recursive_doubling_owned(rank: int, P: int) -> list[bool]:
    """For each ``combine`` that ``rank`` makes in ``recursive_doubling``, in order: whether
    it is the lowest of the ranks that make that same combine (the fold's receiver; at
    step s, the first rank of its aligned group of 2^(s+1), which all hold the same
    result). Counting only owned combines counts each distinct one once over the group
    (``tree_reduce``: every combine is its rank's own)."""
    P2 = 1 << (P.bit_length() - 1)
    if rank >= P2:
        return []
    return [True] * (rank + P2 < P) + [rank % (2 << s) == 0 for s in range(P2.bit_length() - 1)]


# -- the same schedules for P ranks' items held in one process (``cluster=simulated``) --
# ``combine(own, received, rank)``: the same combines, operands and order as the ranks
# make them; ``rank`` is the rank that makes it (its owner, for recursive doubling).


def tree_reduce_local(items: list, combine: Callable[[Any, Any, int], Any]) -> Any:
    """``tree_reduce`` of ``items[i]`` (rank i's) in one process: rank 0's result. Local."""
    cur, P = list(items), len(items)
    for r in range(log2_ceil(P)):
        step = 1 << r
        for i in range(0, P - step, 2 * step):
            cur[i] = combine(cur[i], cur[i + step], i)
    return cur[0]


def recursive_doubling_local(items: list, combine: Callable[[Any, Any, int], Any]) -> Any:
    """``recursive_doubling`` of ``items[i]`` (rank i's) in one process: the item every
    rank ends with (bit-identical on all: ``combine`` is commutative). Each distinct
    combine is made once, by its owner (``recursive_doubling_owned``). Local."""
    cur, P = list(items), len(items)
    P2 = 1 << (P.bit_length() - 1)
    for e in range(P2, P):
        cur[e - P2] = combine(cur[e - P2], cur[e], e - P2)
    for s in range(P2.bit_length() - 1):
        step = 1 << s
        for i in range(0, P2, 2 * step):
            cur[i] = combine(cur[i], cur[i + step], i)
    return cur[0]
