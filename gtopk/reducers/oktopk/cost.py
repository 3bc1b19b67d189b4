"""Ok-Topk's communication: what one rank sends in one ``reduce`` (from the step's counts),
the alpha-beta model of the schedule as ``gtopk.reducers.oktopk`` runs it, and the
paper's bound (Li and Hoefler, PPoPP 2022, Eq. 1-3). All local arithmetic.

One ``reduce`` on P > 1 ranks (docs/oktopk.md), with e = 8 bytes per entry (int32 index +
float32 value; 12 with int64 indices), counts as wide as an index, boundaries int64:

1. boundary steps only: ring all-reduce of the P - 1 proposed boundaries (``metadata``);
2. all-gather of each rank's P part counts (``metadata``);
3. split and reduce: P - 1 rotation steps, in step s rank i sends its part of region
   i + s to rank i + s and receives its own region's part from rank i - s (empty parts are
   not sent: both ends know the counts);
4. all-gather of each rank's count of selected (exact step: reduced) entries (``metadata``);
5. balance: P - 1 rotation steps moving entries so that rank q holds block q of L =
   ceil(N / P) entries (none in the balanced case);
6. all-gather of the blocks, padded to L entries with (index -1, 0.0) (``padding``).

Backend all-gathers and all-reduces are counted as the rings gloo runs
(``costmodel.topk_traffic``'s convention: P - 1 messages of one rank's block), the
point-to-point messages as sent. ``Wire`` splits the bytes of the tensors this rank
passed to the collectives into entries (``payload``), padding and metadata.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gtopk.reducers.costmodel import VALUE_BYTES, Network, Traffic, dense_traffic, index_bytes
from gtopk.reducers.oktopk.regions import balance_plan, block_length

META_BYTES = 8  # int64 boundaries


def entry_bytes(m: int) -> int:
    """Bytes of one (index, value) entry on the wire for an m-entry gradient."""
    return index_bytes(m) + VALUE_BYTES


def count_bytes(m: int) -> int:
    """Bytes of one count (of entries, at most m): as wide as an index."""
    return index_bytes(m)


@dataclass(frozen=True)
class Wire:
    """The bytes of the tensors one rank passed to the collectives in one ``reduce``:
    ``payload`` (entries: its point-to-point sends and the real entries of its all-gather
    block), ``padding`` (the all-gather block's padding entries) and ``meta`` (counts and
    boundaries)."""

    payload: int = 0
    padding: int = 0
    meta: int = 0

    def __add__(self, other: Wire) -> Wire:
        return Wire(self.payload + other.payload, self.padding + other.padding, self.meta + other.meta)


def ring_gather(P: int, nbytes: int) -> Traffic:
    """A ring all-gather of ``nbytes`` per rank: P - 1 messages each way."""
    return Traffic() if P == 1 else Traffic(P - 1, (P - 1) * nbytes, (P - 1) * nbytes)


def boundary_traffic(P: int) -> tuple[Traffic, Wire]:
    """Step 1: the ring all-reduce of P - 1 int64 boundaries."""
    if P == 1:
        return Traffic(), Wire()
    return dense_traffic(P, [P - 1], META_BYTES), Wire(meta=META_BYTES * (P - 1))


def rank_traffic(
    rank: int, P: int, m: int, counts: list[list[int]], sizes: list[int], boundary_step: bool
) -> tuple[Traffic, Wire]:
    """What ``rank`` sends and receives in one ``reduce`` (steps 1-6 above), from the step's
    data: ``counts[i][r]``, rank i's selected entries in region r; ``sizes[r]``, the
    entries rank r holds for the final all-gather (region r's reduced entries on an exact
    step, its globally selected ones otherwise)."""
    if P == 1:
        return Traffic(), Wire()
    e, c = entry_bytes(m), count_bytes(m)
    t, w = boundary_traffic(P) if boundary_step else (Traffic(), Wire())
    t, w = t + ring_gather(P, c * P), w + Wire(meta=c * P)
    out = sum(counts[rank][r] for r in range(P) if r != rank)
    into = sum(counts[i][rank] for i in range(P) if i != rank)
    sends = sum(1 for r in range(P) if r != rank and counts[rank][r])
    t, w = t + Traffic(sends, e * out, e * into), w + Wire(payload=e * out)
    t, w = t + ring_gather(P, c), w + Wire(meta=c)
    plan = balance_plan(sizes, P)
    moved_out = [c for s, d, _, _, c in plan if s == rank and d != rank]
    moved_in = sum(c for s, d, _, _, c in plan if d == rank and s != rank)
    t, w = t + Traffic(len(moved_out), e * sum(moved_out), e * moved_in), w + Wire(payload=e * sum(moved_out))
    N = sum(sizes)
    if N:
        L = block_length(N, P)
        mine = max(0, min(L, N - rank * L))
        t, w = t + ring_gather(P, e * L), w + Wire(payload=e * mine, padding=e * (L - mine))
    return t, w


# ---------------------------------------------------------------- the model
def _gather_time(P: int, entries: float, e: int, net: Network) -> float:
    return (P - 1) * net.ring_msg(e * math.ceil(entries / P))


def p2p_time(P: int, k: int, m: int, net: Network, balance: bool = False) -> float:
    """The point-to-point phases of one ``reduce`` in the balanced case (every rank selects
    k entries, k / P in each region): split and reduce, P - 1 steps of k / P entries; with
    ``balance``, the balancing's worst case (the paper's bound: P - 1 more such steps);
    balanced regions move nothing."""
    return (2 if balance else 1) * (P - 1) * net.msg(entry_bytes(m) * k / P)


def step_time(P: int, k: int, m: int, net: Network, gathered: float, balance: bool = False) -> float:
    """One ``reduce`` without the boundary all-reduce, in the balanced case (``p2p_time``),
    with the all-gathers of the part counts, of the sizes and of ``gathered`` entries (k on
    a step with re-used thresholds, the union on an exact one)."""
    if P == 1:
        return 0.0
    e, c = entry_bytes(m), count_bytes(m)
    meta = (P - 1) * (net.ring_msg(c * P) + net.ring_msg(c))
    return meta + p2p_time(P, k, m, net, balance) + _gather_time(P, gathered, e, net)


def boundary_time(P: int, net: Network) -> float:
    """The ring all-reduce of the P - 1 int64 boundaries."""
    return 0.0 if P == 1 else 2 * (P - 1) * net.ring_msg(META_BYTES * math.ceil((P - 1) / P))


def oktopk_step_time(
    P: int,
    k: int,
    m: int,
    net: Network,
    step: int,
    threshold_period: int = 32,
    boundary_period: int = 64,
    union: float | None = None,
) -> float:
    """Critical-path time of step ``step`` (from 0, a fresh state; k unchanged) in the
    balanced case (``step_time``): an exact step (a multiple of ``threshold_period``)
    gathers the union of the ranks' selections (``union`` entries, by default min(m, P k),
    the selections disjoint), another k; a multiple of ``boundary_period`` adds the
    boundaries' all-reduce. Local work not included."""
    if P == 1:
        return 0.0
    exact = step % threshold_period == 0
    gathered = (min(m, P * k) if union is None else union) if exact else k
    t = step_time(P, k, m, net, gathered)
    return t + (boundary_time(P, net) if step % boundary_period == 0 else 0.0)


def oktopk_time(
    P: int,
    k: int,
    m: int,
    net: Network,
    threshold_period: int = 32,
    boundary_period: int = 64,
    union: float | None = None,
) -> float:
    """``oktopk_step_time`` averaged over the steps of a run: ``threshold_period`` - 1
    steps of re-used thresholds per exact step, and a boundary all-reduce every
    ``boundary_period`` steps (the mean over lcm(periods) steps, in closed form)."""
    if P == 1:
        return 0.0
    u = min(m, P * k) if union is None else union
    reuse, exact = step_time(P, k, m, net, k), step_time(P, k, m, net, u)
    return ((threshold_period - 1) * reuse + exact) / threshold_period + boundary_time(P, net) / boundary_period


def payload_words(P: int, k: int, balance: bool = True) -> float:
    """Entries' volume one rank sends on a step with re-used thresholds, in the paper's
    words (an entry is an index and a value: 2 words), balanced case: k (P - 1) / P entries
    split, the same balanced at worst, and its block of k / P entries to the P - 1 others
    (the ring all-gather: the paper's recursive doubling moves the same). Padding and
    metadata excluded."""
    parts = 3 if balance else 2
    return parts * 2 * k * (P - 1) / P


def paper_bound(P: int, k: int, alpha: float, beta_word: float) -> float:
    """The paper's Eq. 3: (2P + 2 log2 P) alpha + 6k (P - 1) / P beta (beta per 4-byte word)."""
    if P == 1:
        return 0.0
    return (2 * P + 2 * math.log2(P)) * alpha + 6 * k * (P - 1) / P * beta_word
