"""Ok-Topk's local steps: selection by threshold, region boundaries, region sums, the
global selection and the balancing plan. All local (no collective calls); shared by the
distributed reducer (``gtopk.reducers.oktopk``) and its P ranks in one process
(``gtopk.reducers.oktopk.group``), so that both compute the same bits.

Sparse vectors are (ascending int64 indices, float32 values). Tie rule as everywhere in
``gtopk.reducers``: among equal |value| the smaller index wins (``topk_indices``,
``keep_topk``). Thresholds are float32 0-d tensors on the gradient's device.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gtopk.host import one_thread
from gtopk.reducers.selection import Selector
from gtopk.reducers.selection.exact import _above, topk_indices
from gtopk.reducers.sparse import keep_topk

#: the index of a padding entry in a padded all-gather (never a real index)
SENTINEL = -1

Sparse = tuple[Tensor, Tensor]


def threshold_of(values: Tensor) -> Tensor:
    """The smallest |value| of a non-empty selection: the threshold that re-selects it."""
    return values.abs().min()


def passing(acc: Tensor, threshold: Tensor) -> Tensor:
    """Ascending int64 indices of the entries with ``|acc| >= threshold``: one pass, on CPU
    chunk by chunk on one thread (``selection._above``, as the sampled selection's pass)."""
    with one_thread(acc.device.type == "cpu"):
        return _above(acc, threshold)


def select_local(acc: Tensor, k: int, threshold: Tensor | None, exact: Selector | None) -> tuple[Tensor, Tensor]:
    """A rank's local selection of its accumulated vector ``acc`` and the threshold to keep.

    ``exact`` (the selection method of an exact step): its selection (``Selector.indices``:
    the k largest |acc| with ``selection=exact``, ties to the smaller index) and the
    smallest |acc| selected as the new threshold (none selected: the exact top-k).
    None: every entry with ``|acc| >= threshold`` (the re-used threshold: 0 to m entries)."""
    if exact is not None:
        sel = exact.indices(acc, k)
        if sel.numel() == 0:
            sel = topk_indices(acc, k)
        return sel, threshold_of(acc[sel])
    return passing(acc, threshold), threshold


def select_global(idx: Tensor, val: Tensor, k: int, threshold: Tensor | None, exact: bool) -> tuple[Sparse, Tensor]:
    """The global selection among reduced entries (idx ascending): ``exact``, the k largest
    |val| (``keep_topk``) and the k-th largest as the new threshold; otherwise the entries
    with ``|val| >= threshold``. Returns ((idx, val), threshold)."""
    if exact:
        idx, val = keep_topk(idx, val, k)
        return (idx, val), (threshold_of(val) if val.numel() else threshold)
    keep = val.abs() >= threshold
    return (idx[keep], val[keep]), threshold


def quantiles(sel: Tensor, P: int, m: int) -> Tensor:
    """This rank's proposal for the P - 1 inner region boundaries: the indices at which its
    ascending selection ``sel`` splits into P parts of (almost) equal counts, entry
    ``sel[floor(r n / P)]`` for r = 1..P-1 (with no selection: r m / P). int64 [P - 1]."""
    n = sel.numel()
    r = torch.arange(1, P, dtype=torch.int64, device=sel.device)
    if n == 0:
        return r * m // P
    return sel[r * n // P]


def boundaries(summed: Tensor, P: int, m: int) -> Tensor:
    """The regions' boundaries [P + 1] (0, ..., m) from the sum over ranks of their
    ``quantiles``: the average, rounded down (non-decreasing, as every proposal is).
    Region r is [b[r], b[r + 1]); it may be empty."""
    ends = torch.tensor([0, m], dtype=torch.int64, device=summed.device)
    return torch.cat([ends[:1], torch.div(summed, P, rounding_mode="floor"), ends[1:]])


def split(sel: Tensor, bounds: Tensor) -> list[int]:
    """Cut points of the ascending ``sel`` at the regions: part r is
    ``sel[cuts[r]:cuts[r + 1]]`` (P + 1 Python ints)."""
    return torch.searchsorted(sel, bounds).tolist()


def region_sum(parts: list[Sparse], device: torch.device) -> Sparse:
    """Sum of the ranks' parts of one region, added in rank order (``parts``: the non-empty
    parts, in rank order, each with unique ascending indices): the union of their indices
    (ascending) and the sums. Each index's value is ((0 + a_i) + a_j) + ... over the ranks
    i < j < ... that sent it."""
    if not parts:
        return torch.zeros(0, dtype=torch.int64, device=device), torch.zeros(0, dtype=torch.float32, device=device)
    union = torch.unique(torch.cat([idx for idx, _ in parts]), sorted=True)
    sums = torch.zeros(union.numel(), dtype=torch.float32, device=device)
    for idx, val in parts:
        sums.index_add_(0, torch.searchsorted(union, idx), val)
    return union, sums


def block_length(total: int, P: int) -> int:
    """Entries per rank in the balanced all-gather of ``total`` entries: ceil(total / P)."""
    return -(-total // P)


def balance_plan(sizes: list[int], P: int) -> list[tuple[int, int, int, int, int]]:
    """The balancing moves before the all-gather. Rank r holds ``sizes[r]`` entries, the
    positions [off_r, off_r + sizes[r]) of their concatenation in rank order (N entries);
    rank q is to hold the block [q L, (q + 1) L) of it (L = ``block_length(N, P)``).
    Returns every move (src, dst, start in src's entries, start in dst's block, count),
    in order of position; src == dst is a local copy."""
    L = block_length(sum(sizes), P)
    moves, off = [], 0
    for src, n in enumerate(sizes):
        pos, end = off, off + n
        while pos < end:
            dst = pos // L
            stop = min(end, (dst + 1) * L)
            moves.append((src, dst, pos - off, pos - dst * L, stop - pos))
            pos = stop
        off = end
    return moves


def pad(idx: Tensor, val: Tensor, length: int) -> Sparse:
    """(idx, val) padded to ``length`` entries with (``SENTINEL``, 0.0)."""
    extra = length - idx.numel()
    if extra == 0:
        return idx, val
    fill_i = torch.full((extra,), SENTINEL, dtype=idx.dtype, device=idx.device)
    fill_v = torch.zeros(extra, dtype=val.dtype, device=val.device)
    return torch.cat([idx, fill_i]), torch.cat([val, fill_v])
