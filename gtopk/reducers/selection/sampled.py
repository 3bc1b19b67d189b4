"""Deep Gradient Compression's sampled threshold (Lin et al., ICLR 2018): an approximate
top-k selection, ``selection=sampled`` of the sparse reducers (``gtopk.reducers.selection``).

``sampled_indices(x, k)`` is local (no collective calls), runs on the tensor's own device
and draws no random numbers (the same input gives the same output, on every rank and in
the simulated cluster). Steps, with ``ratio`` = ``sample_ratio`` and ``R`` = ``max_refine``:

1. The sample: every s-th ``|x|`` from the first, ``s = sample_stride(m, k, ratio)``: at
   least ``ratio * m`` entries and at least ``2 m / k`` (two expected entries above the
   k-th largest), at an odd stride (a power-of-two layer width does not alias it).
2. The threshold ``t``: the ``ceil(n k / m)``-th largest of the n sampled magnitudes.
3. One pass: the candidates ``S = {i : |x_i| >= t}`` (ascending).
4. Refinement, at most R times: while ``|S| < LOWER * k`` the threshold is lowered to
   ``LOWER * t`` and ``S`` found again (stops early when ``t`` no longer moves).
5. Too many pass (``|S| > k``): the k largest of ``S`` by the exact selection
   (``topk_indices``; ``S`` holds the k largest of ``x``, so this is the exact top-k).
   Otherwise ``S`` itself.

So the result is always the n largest ``|x|`` (ascending indices, int64) for
``n = min(k, |S|) <= k``: exactly k whenever at least k pass, fewer (down to about
``LOWER * k``, or below when the refinement bound runs out) otherwise; every entry left
out is no larger than every entry selected. A threshold of 0 or NaN (it would pass
everything, or nothing), and k = m, take the exact selection of ``x``.

Where this departs from DGC's released implementation: one vector (the flat gradient)
rather than each layer; the sample starts at entry 0 rather than at a random offset (no
random draw); when more than k pass, DGC keeps the k largest only above ``1.3 k`` and
otherwise the first k by position, here always the k largest.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from gtopk.host import one_thread
from gtopk.reducers.selection.exact import _EXACT_BELOW, _above, topk_indices

#: DGC's defaults: the sample holds this fraction of the entries (at least)
SAMPLE_RATIO = 0.01
#: ... the threshold is lowered at most this many times (DGC's ``max_adaptation_iters``)
MAX_REFINE = 10
#: ... by this factor while fewer than ``LOWER * k`` entries pass (DGC's ``compress_lower_bound``)
LOWER = 0.8


def sample_stride(m: int, k: int, ratio: float = SAMPLE_RATIO) -> int:
    """The sample's stride: ``s = m // n`` for ``n = max(ceil(ratio m), ceil(2 m / k))``,
    less one when even, so that every s-th entry from the first makes at least n (1:
    every entry, when n >= m)."""
    want = max(math.ceil(ratio * m), math.ceil(2 * m / k))
    if want >= m:
        return 1
    s = m // want  # m // s >= want entries
    return s if s % 2 else s - 1


def sampled_indices(x: Tensor, k: int, sample_ratio: float = SAMPLE_RATIO, max_refine: int = MAX_REFINE) -> Tensor:
    """DGC's sampled-threshold selection of at most ``k`` entries of the 1-D ``x`` (see the
    module's docstring): the ``n <= k`` largest ``|x|``, ascending int64 indices."""
    return sampled_path(x, k, sample_ratio, max_refine)[0]


def sampled_path(x: Tensor, k: int, sample_ratio: float, max_refine: int) -> tuple[Tensor, str, int]:
    """``sampled_indices`` and how it got there: the path (``first``: the first threshold's
    candidates, ``refined``: after lowering it, ``too_many``: more than k passed, the k
    largest of them; ``exact``: a threshold of 0 or NaN, the exact selection of ``x``) and
    the number of passes over ``x`` (1 + refinements; 0 for ``exact``)."""
    if x.dim() != 1:
        raise ValueError(f"sampled_indices expects a 1-D tensor, got shape {tuple(x.shape)}")
    m = x.numel()
    if not 1 <= k <= m:
        raise ValueError(f"k must be in [1, {m}] for a tensor of {m} entries, got k={k}")
    # One CPU thread for the many short ops, as ``topk_indices`` (see there).
    with one_thread(x.device.type == "cpu" and m >= _EXACT_BELOW):
        return _sampled(x, k, sample_ratio, max_refine)


def _sampled(x: Tensor, k: int, sample_ratio: float, max_refine: int) -> tuple[Tensor, str, int]:
    m = x.numel()
    if k == m:  # everything
        return topk_indices(x, k), "exact", 0
    sample = x[:: sample_stride(m, k, sample_ratio)].abs()
    n = sample.numel()
    rank = min(n, max(1, math.ceil(n * k / m)))
    thr = torch.topk(sample, rank, sorted=False).values.min()
    if not bool(thr > 0):  # 0 passes everything, NaN nothing
        return topk_indices(x, k), "exact", 0
    cand, passes, path = _above(x, thr), 1, "first"
    for _ in range(max_refine):
        if cand.numel() >= LOWER * k:
            break
        lower = thr * LOWER
        if not bool(lower > 0):  # underflow: the exact selection
            return topk_indices(x, k), "exact", 0
        if bool(lower == thr):  # inf: the threshold no longer moves
            break
        thr = lower
        cand, passes, path = _above(x, thr), passes + 1, "refined"
    if cand.numel() > k:  # too many pass: the k largest of them (the k largest of x)
        return cand[topk_indices(x[cand], k)], "too_many", passes
    return cand, path, passes
