"""Exact top-k selection and the sparse merge used by gTopKAllReduce.

Both functions are local (no collective calls) and run on the tensors' own device.

Tie rule, everywhere in this package: among entries of equal |value| the one with the
smaller index wins. Selected index sets are returned sorted ascending, which makes the
result a deterministic function of the input (so every rank that merges the same two sets
gets bit-identical output) and lets membership tests use ``searchsorted``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def k_for(density: float, m: int) -> int:
    """Number of entries to keep: ``max(1, int(density * m))``, capped at ``m``."""
    return min(m, max(1, int(density * m)))


def topk_indices(x: Tensor, k: int) -> Tensor:
    """Indices of the ``k`` largest ``|x|`` of a 1-D tensor, sorted ascending (int64).

    Exact: the result is the same set as ``torch.topk(x.abs(), k)`` except that ties at
    the k-th value are broken towards the smaller index.
    """
    if x.dim() != 1:
        raise ValueError(f"topk_indices expects a 1-D tensor, got shape {tuple(x.shape)}")
    m = x.numel()
    if not 1 <= k <= m:
        raise ValueError(f"k must be in [1, {m}] for a tensor of {m} entries, got k={k}")
    if k == m:
        return torch.arange(m, device=x.device)
    mag = x.abs()
    # k-th largest magnitude; everything strictly above it is in, ties fill the rest.
    thr = torch.topk(mag, k, sorted=False).values.min()
    above = torch.nonzero(mag > thr).squeeze(1)
    need = k - above.numel()
    if need == 0:
        return above
    ties = torch.nonzero(mag == thr).squeeze(1)[:need]
    return torch.cat([above, ties]).sort().values


def keep_topk(idx: Tensor, val: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Of a sparse vector with unique ascending ``idx``, keep the ``k`` largest |val|.

    Ties go to the smaller index; the kept entries come back in ascending index order.
    """
    if idx.numel() <= k:
        return idx, val
    # Stable descending sort keeps ascending-index order among equal magnitudes.
    order = torch.sort(val.abs(), descending=True, stable=True).indices[:k]
    order = order.sort().values
    return idx[order], val[order]


def merge(idx_a: Tensor, val_a: Tensor, idx_b: Tensor, val_b: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """gTop-k merge of two sparse vectors (each with unique indices).

    Values at a shared index are summed (``a + b``; float addition is commutative, so
    ``merge(a, b) == merge(b, a)`` bit for bit); of the union, the ``k`` largest |value|
    are kept, ties to the smaller index. Returns ascending indices and their values.
    """
    idx = torch.cat([idx_a, idx_b])
    val = torch.cat([val_a, val_b])
    uniq, inverse = torch.unique(idx, sorted=True, return_inverse=True)
    summed = torch.zeros(uniq.numel(), dtype=val.dtype, device=val.device)
    # At most two contributions per slot: 0 + a + b == a + b exactly.
    summed.index_add_(0, inverse, val)
    return keep_topk(uniq, summed, k)


def member_mask(sorted_set: Tensor, query: Tensor) -> Tensor:
    """Boolean mask: which entries of ``query`` occur in the ascending ``sorted_set``."""
    if sorted_set.numel() == 0:
        return torch.zeros_like(query, dtype=torch.bool)
    pos = torch.searchsorted(sorted_set, query).clamp_(max=sorted_set.numel() - 1)
    return sorted_set[pos] == query
