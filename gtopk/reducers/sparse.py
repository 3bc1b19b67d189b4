"""Sparse-vector operations of the reducers: the gTop-k merge, keep-top-k, membership.

A sparse vector is (indices, values) with unique indices in ascending order (what
``gtopk.reducers.selection.topk_indices`` and ``merge`` return). All functions are local (no
collective calls). Tie rule as in ``gtopk.reducers.selection``: among equal |value| the smaller
index wins.

CPU tensors go through NumPy on the same memory (no copies in, none out): for vectors of
thousands of entries a torch op costs tens of microseconds of dispatch, and ``torch.topk``
/ ``torch.searchsorted`` are 5-15x slower than ``np.partition`` / a run-merging sort
there (``make bench`` times the merge; 14,728 + 14,728 entries: 2.2 ms in torch,
0.34 ms here). Other devices (CUDA) run the same algorithm in torch.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def _top_mask_np(mag: np.ndarray, k: int) -> np.ndarray:
    """Mask of the ``k`` largest ``mag`` (ties to the smaller position); ``k < mag.size``."""
    n = mag.size
    thr = np.partition(mag, n - k)[n - k]
    mask = mag > thr
    need = k - int(np.count_nonzero(mask))
    if need > 0:
        mask[np.flatnonzero(mag == thr)[:need]] = True
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
    if dup.size:
        val[dup] += val[dup + 1]
        keep = np.ones(idx.size, dtype=bool)
        keep[dup + 1] = False
        idx, val = idx[keep], val[keep]
    if idx.size <= k:
        return idx, val
    mask = _top_mask_np(np.abs(val), k)
    if dropped is not None:
        dropped.append((torch.from_numpy(idx[~mask]), torch.from_numpy(val[~mask])))
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
