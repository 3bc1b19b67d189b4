"""Sparse-vector operations of the reducers: the gTop-k merge, keep-top-k, membership.

A sparse vector is (indices, values) with unique indices in ascending order (what
``gtopk.reducers.selection.exact.topk_indices`` and ``merge`` return). All functions are local (no
collective calls). Tie rule as in ``gtopk.reducers.selection.exact``: among equal |value| the smaller
index wins.

CPU tensors go through NumPy on the same memory (no copies in, none out): for vectors of
thousands of entries a torch op costs tens of microseconds of dispatch, and ``torch.topk``
/ ``torch.searchsorted`` are 5-15x slower than ``np.partition`` / a run-merging sort
there (``make bench`` times the merge; 14,728 + 14,728 entries: 2.2 ms in torch, 0.34 ms
in NumPy before its rework below; ``python -m tests.bench.merge_bench`` times it against
that version). Other devices (CUDA) run the same algorithm in torch, without the NumPy
path's shortcuts (no compacted union, a bracketed k-th largest); the results are the same.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

_BRACKET_FROM = 1 << 13  # entries from which a sampled bracket beats one np.partition of all
_STRIDE = 16  # the bracket's sample: every _STRIDE-th entry
_SIGMAS = 5.0  # its half-width, in standard deviations of the target's rank in the sample


def _kth_largest(mag: np.ndarray, k: int) -> np.generic:
    """The ``k``-th largest of ``mag`` as ``np.partition`` finds it (NaN above every number);
    ``k <= mag.size``.

    From ``_BRACKET_FROM`` entries a strided sample brackets it, a few standard deviations
    either side of its estimate, and it is selected among the entries within the bracket (a
    few thousand); if it is not there, among all. Exact either way: the entries below the
    bracket are counted, and a NaN, which fails every comparison, is never below or within.
    """
    j = mag.size - k  # its rank from the bottom
    if mag.size >= _BRACKET_FROM:
        sample = mag[::_STRIDE]
        p, n = j / mag.size, sample.size
        half = _SIGMAS * math.sqrt(n * p * (1 - p)) + 1
        ranks = [max(0, int(p * n - half)), min(n - 1, math.ceil(p * n + half))]
        lo, hi = np.partition(sample, ranks)[ranks]
        below = int(np.count_nonzero(mag < lo))
        within = mag[(mag >= lo) & (mag <= hi)]
        if below <= j < below + within.size:
            return np.partition(within, j - below)[j - below]
    return np.partition(mag, j)[j]


def _top_mask_np(mag: np.ndarray, k: int) -> np.ndarray:
    """Mask of the ``k`` largest ``mag`` (ties to the smaller position); ``k < mag.size``.
    Negative entries are never among them (``k`` must not exceed the others' count)."""
    thr = _kth_largest(mag, k)
    mask = mag >= thr
    extra = int(np.count_nonzero(mask)) - k  # ties at thr beyond the k: the last ones go
    if extra > 0:
        mask[np.flatnonzero(mag == thr)[-extra:]] = False
    return mask


def _top_mask_torch(mag: Tensor, k: int) -> Tensor:
    thr = torch.topk(mag, k, sorted=False).values.min()
    mask = mag > thr
    need = k - int(mask.sum())
    if need > 0:
        mask[torch.nonzero(mag == thr).squeeze(1)[:need]] = True
    return mask


def _merge_np(ia: np.ndarray, va: np.ndarray, ib: np.ndarray, vb: np.ndarray, k: int, dropped: list | None = None):
    idx = np.concatenate([ia, ib])
    val = np.concatenate([va, vb])
    order = np.argsort(idx, kind="stable")  # timsort: two sorted runs, one linear merge
    idx, val = idx[order], val[order]
    dup = np.flatnonzero(idx[1:] == idx[:-1])  # a's entry first, b's right after it
    gone = dup + 1  # b's entry of a shared index: summed into a's, then left out
    if dup.size:
        val[dup] += val[gone]
    if idx.size - dup.size <= k:
        return (np.delete(idx, gone), np.delete(val, gone)) if dup.size else (idx, val)
    # No compacted union, and positions rather than boolean masks to gather (a random mask
    # copies run by run: 25,000 indices and values, 95 us against 35 us here): b's entries
    # of shared indices get |value| -1, below all others, so they are neither kept nor dropped.
    mag = np.abs(val)
    if dup.size:
        mag[gone] = -1.0
    mask = _top_mask_np(mag, k)
    if dropped is not None:
        out = ~mask
        out[gone] = False
        rest = np.flatnonzero(out)
        dropped.append((torch.from_numpy(idx[rest]), torch.from_numpy(val[rest])))
    sel = np.flatnonzero(mask)
    return idx[sel], val[sel]


def _merge_torch(
    ia: Tensor, va: Tensor, ib: Tensor, vb: Tensor, k: int, dropped: list | None = None
) -> tuple[Tensor, Tensor]:
    idx = torch.cat([ia, ib])
    val = torch.cat([va, vb])
    order = torch.sort(idx, stable=True).indices
    idx, val = idx[order], val[order]
    dup = torch.nonzero(idx[1:] == idx[:-1]).squeeze(1)
    if dup.numel():
        val[dup] += val[dup + 1]
        keep = torch.ones(idx.numel(), dtype=torch.bool, device=idx.device)
        keep[dup + 1] = False
        idx, val = idx[keep], val[keep]
    if idx.numel() <= k:
        return idx, val
    mask = _top_mask_torch(val.abs(), k)
    if dropped is not None:
        dropped.append((idx[~mask], val[~mask]))
    return idx[mask], val[mask]


def _on_cpu(*tensors: Tensor) -> bool:
    return all(t.device.type == "cpu" for t in tensors)


def merge(idx_a, val_a, idx_b, val_b, k: int, dropped: list | None = None):
    """gTop-k merge of two sparse vectors: torch tensors, or NumPy arrays (what the CPU
    path of a gTop-k schedule carries between rounds: no conversion per merge).

    Values at a shared index are summed (``a + b``; float addition is commutative, so
    ``merge(a, b) == merge(b, a)`` bit for bit); of the union, the ``k`` largest |value|
    are kept, ties to the smaller index. Returns ascending indices and their values, of
    the inputs' kind (NumPy: int64 indices when either input's are). ``dropped``: a list
    to which the union's entries that were not kept are appended, as one (ascending
    indices, values) pair of tensors (nothing when none was dropped).
    """
    args = (idx_a, val_a, idx_b, val_b)
    if isinstance(idx_a, np.ndarray):
        return _merge_np(*args, k, dropped)
    if _on_cpu(*args):
        idx, val = _merge_np(*(t.detach().numpy() for t in args), k, dropped)
        return torch.from_numpy(idx), torch.from_numpy(val)
    return _merge_torch(*args, k, dropped)


def keep_topk(idx: Tensor, val: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Of a sparse vector, keep the ``k`` largest |val| (ties to the smaller index),
    in ascending index order."""
    if idx.numel() <= k:
        return idx, val
    if _on_cpu(idx, val):
        sel = torch.from_numpy(np.flatnonzero(_top_mask_np(np.abs(val.detach().numpy()), k)))
        return idx[sel], val[sel]
    mask = _top_mask_torch(val.abs(), k)
    return idx[mask], val[mask]


def member_mask(sorted_set: Tensor, query: Tensor) -> Tensor:
    """Boolean mask: which entries of ``query`` occur in the ascending ``sorted_set``."""
    if sorted_set.numel() == 0:
        return torch.zeros_like(query, dtype=torch.bool)
    if _on_cpu(sorted_set, query):
        s, q = sorted_set.numpy(), query.numpy()
        pos = np.minimum(np.searchsorted(s, q), s.size - 1)
        return torch.from_numpy(s[pos] == q)
    pos = torch.searchsorted(sorted_set, query).clamp_(max=sorted_set.numel() - 1)
    return sorted_set[pos] == query


def pad_to(idx: Tensor, val: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor | None]:
    """A sparse vector of ``n <= k`` entries as one of exactly ``k`` (the wire format's
    size): the ``k - n`` smallest indices not in ``idx`` join it with the value 0.0.
    Returns (ascending indices, values, bool mask of the padding entries), or ``(idx,
    val, None)`` when ``n == k``. A padding entry adds 0.0 wherever it lands (a sum or a
    merge of it changes no other value) and was not selected: its rank keeps it."""
    n = idx.numel()
    if n == k:
        return idx, val, None
    first = torch.arange(k, device=idx.device)  # holds at least k - n indices not in idx
    free = first[~member_mask(idx, first)][: k - n]
    order = torch.cat([idx, free]).argsort()  # unique indices: any sort is stable
    pad = torch.cat([torch.zeros(n, dtype=torch.bool, device=idx.device), free.new_ones(k - n, dtype=torch.bool)])
    return torch.cat([idx, free])[order], torch.cat([val, val.new_zeros(k - n)])[order], pad[order]
