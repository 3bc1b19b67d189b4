"""Executable specification of the three reducers: one process, no torch.distributed.

Each function takes the P workers' tensors as a list of 1-D float tensors and returns
``(update, residuals)``: the update every worker applies (already divided by P) and every
worker's error-feedback residual after the step (zero tensors for dense).

For the sparse reducers the inputs are the accumulated vectors ``acc_i = residual_i + g_i``.
The code here is written for clarity, not speed (full sorts, dense scratch vectors), and is
independent of the distributed implementation in ``gtopk.reducers`` except for the
rules it states. The distributed reducers reproduce these results bit for bit on the sparse
paths, because every sum here is taken in the same pairwise order they use.

Rules shared by every function:
* k-selection picks the k largest |value|; ties go to the smaller index.
* Merging two sparse vectors sums values at a shared index, then keeps the k largest |value|
  of the union (ties to the smaller index).
* The update is ``summed_values / P`` scattered into zeros.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

Sparse = tuple[Tensor, Tensor]  # (ascending int64 indices, values)

ALGORITHMS = ("tree", "recursive_doubling")
PUTBACKS = ("index", "exact")


def _select(idx: Tensor, val: Tensor, k: int) -> Sparse:
    """The k entries of (idx, val) with the largest |val|, ties to the smaller index."""
    order = torch.argsort(idx)  # make "earlier" mean "smaller index" for the stable sort
    idx, val = idx[order], val[order]
    keep = torch.sort(val.abs(), descending=True, stable=True).indices[:k]
    keep = keep[torch.argsort(idx[keep])]
    return idx[keep], val[keep]


def local_topk(acc: Tensor, k: int) -> Sparse:
    """Step 2 of the paper: the k largest |acc| entries of one worker."""
    return _select(torch.arange(acc.numel()), acc, k)


def merge(a: Sparse, b: Sparse, k: int, m: int) -> Sparse:
    """Sum two sparse vectors of length m and keep the k largest |value| of the union."""
    dense = torch.zeros(m, dtype=a[1].dtype)
    present = torch.zeros(m, dtype=torch.bool)
    for idx, val in (a, b):
        dense[idx] += val
        present[idx] = True
    union = torch.nonzero(present).squeeze(1)
    return _select(union, dense[union], k)


def _check(tensors: list[Tensor], k: int | None = None) -> tuple[int, int]:
    if not tensors:
        raise ValueError("need at least one worker's tensor")
    m = tensors[0].numel()
    if any(t.dim() != 1 or t.numel() != m for t in tensors):
        raise ValueError("all workers' tensors must be 1-D of the same length")
    if k is not None and not 1 <= k <= m:
        raise ValueError(f"k must be in [1, {m}], got {k}")
    return len(tensors), m


def dense(grads: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
    """Dense S-SGD: the average of all gradients; nothing is kept back."""
    P, _ = _check(grads)
    update = torch.stack(grads).sum(0) / P
    return update, [torch.zeros_like(g) for g in grads]


def topk(accs: list[Tensor], k: int, reselect: bool = False) -> tuple[Tensor, list[Tensor]]:
    """Top-k S-SGD: every worker's local top-k, all gathered and summed (rank order).

    ``reselect=False``: the update holds up to k*P nonzeros; each worker keeps its
    unselected entries. ``reselect=True`` ("select k from k*P"): only the k largest |value|
    of the summed vector are applied, and each worker also keeps its own selected values
    whose index is outside that final set.
    """
    P, m = _check(accs, k)
    sels = [local_topk(a, k) for a in accs]
    summed = torch.zeros(m, dtype=accs[0].dtype)
    present = torch.zeros(m, dtype=torch.bool)
    for idx, val in sels:  # rank order
        summed[idx] += val
        present[idx] = True
    residuals = []
    if not reselect:
        for a, (idx, _) in zip(accs, sels):
            r = a.clone()
            r[idx] = 0
            residuals.append(r)
        return summed / P, residuals
    union = torch.nonzero(present).squeeze(1)
    final_idx, final_val = _select(union, summed[union], k)
    update = torch.zeros(m, dtype=accs[0].dtype)
    update[final_idx] = final_val / P
    in_final = torch.zeros(m, dtype=torch.bool)
    in_final[final_idx] = True
    for a, (idx, _) in zip(accs, sels):
        r = a.clone()
        r[idx[in_final[idx]]] = 0  # values outside the final set stay with their worker
        residuals.append(r)
    return update, residuals


def _recursive_doubling(items: list, combine) -> list:
    """Result of recursive doubling over P items, with folding for non-power-of-two P.

    Ranks P2..P-1 (P2 = largest power of two <= P) first hand their item to rank i - P2,
    which combines ``combine(own, received)``; then for s = 0..log2(P2)-1 rank i combines
    ``combine(own, item of rank i XOR 2^s)``; finally ranks >= P2 receive rank i - P2's
    result. Returns every rank's final item.
    """
    P = len(items)
    P2 = 1 << (P.bit_length() - 1)
    cur = list(items)
    for e in range(P2, P):
        cur[e - P2] = combine(cur[e - P2], cur[e])
    for s in range(P2.bit_length() - 1):
        cur[:P2] = [combine(cur[i], cur[i ^ (1 << s)]) for i in range(P2)]
    for e in range(P2, P):
        cur[e] = cur[e - P2]
    return cur


def _tree(items: list, combine) -> object:
    """Binomial tree towards rank 0: in round r, rank i with i % 2^(r+1) == 0 combines
    ``combine(own, item of rank i + 2^r)`` when that rank exists. Returns rank 0's item."""
    P = len(items)
    cur = list(items)
    for r in range(math.ceil(math.log2(P)) if P > 1 else 0):
        step = 1 << r
        for i in range(0, P, 2 * step):
            if i + step < P:
                cur[i] = combine(cur[i], cur[i + step])
    return cur[0]


def gtopk(accs: list[Tensor], k: int, algorithm: str = "tree", putback: str = "index") -> tuple[Tensor, list[Tensor]]:
    """gTop-k S-SGD (gTopKAllReduce).

    The global index set F comes from merging the workers' local top-k sets along the
    ``algorithm``'s schedule (``tree``: binomial tree to rank 0, which broadcasts F;
    ``recursive_doubling``: pairwise exchanges, every rank merges).

    ``putback="index"`` (the paper's rule): the update is the merged values at F, /P; each
    worker keeps its selected values whose index is not in F. A value dropped in an early
    merge whose index still reached F through other workers is neither applied nor kept.

    ``putback="exact"``: after F is known, the workers sum their full ``acc_i[F]`` by
    recursive doubling; the update is that sum / P at F and every worker keeps
    ``acc_i`` outside F. Then ``sum_i acc_i == P * update + sum_i residual_i`` exactly
    (up to float rounding): no gradient is lost.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if putback not in PUTBACKS:
        raise ValueError(f"putback must be one of {PUTBACKS}, got {putback!r}")
    P, m = _check(accs, k)
    sels = [local_topk(a, k) for a in accs]
    combine = lambda a, b: merge(a, b, k, m)  # noqa: E731
    if algorithm == "tree":
        final_idx, final_val = _tree(sels, combine)
    else:
        finals = _recursive_doubling(sels, combine)
        final_idx, final_val = finals[0]
    update = torch.zeros(m, dtype=accs[0].dtype)
    residuals = [a.clone() for a in accs]
    if putback == "index":
        update[final_idx] = final_val / P
        in_final = torch.zeros(m, dtype=torch.bool)
        in_final[final_idx] = True
        for r, (idx, _) in zip(residuals, sels):
            r[idx[in_final[idx]]] = 0
    else:
        totals = _recursive_doubling([a[final_idx] for a in accs], lambda x, y: x + y)
        update[final_idx] = totals[0] / P
        for r in residuals:
            r[final_idx] = 0
    return update, residuals
