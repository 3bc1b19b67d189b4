"""Exact top-k selection (the merge of sparse vectors lives in ``gtopk.reducers.sparse``).

``topk_indices`` is local (no collective calls) and runs on the tensor's own device.

Tie rule, everywhere in this package: among entries of equal |value| the one with the
smaller index wins. Selected index sets are returned sorted ascending, which makes the
result a deterministic function of the input (so every rank that merges the same two sets
gets bit-identical output) and lets membership tests use ``searchsorted``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from gtopk.host import one_thread


def k_for(density: float, m: int) -> int:
    """Number of entries to keep: ``max(1, int(density * m))``, capped at ``m``."""
    return min(m, max(1, int(density * m)))


_EXACT_BELOW = 1 << 16  # m below this: select directly (sampling cannot pay off)
_SAMPLE = 1 << 16  # the |x| sample for the threshold: every max(_MIN_STRIDE, m // _SAMPLE)-th entry
_MIN_STRIDE = 16
_SIGMAS = 5.0  # sample rank = expected sample rank of the k-th value + this many std devs
_CHUNK = 1 << 18  # CPU candidate scan: 1 MiB of fp32 per chunk, so its scratch stays in L2
_ROWS = 16  # a chunk is scanned as _ROWS x (_CHUNK / _ROWS): column maxima first


def _exact(x: Tensor, k: int) -> Tensor:
    """Exact top-k by a full ``torch.topk`` threshold (any size; the slow reference path)."""
    if k == x.numel():
        return torch.arange(k, device=x.device)
    mag = x.abs()
    # k-th largest magnitude; everything strictly above it is in, ties fill the rest.
    thr = torch.topk(mag, k, sorted=False).values.min()
    above = torch.nonzero(mag > thr).squeeze(1)
    need = k - above.numel()
    if need == 0:
        return above
    ties = torch.nonzero(mag == thr).squeeze(1)[:need]
    return torch.cat([above, ties]).sort().values


def _stride(m: int) -> int:
    """The sample is every ``_stride(m)``-th entry of ``x``, from the first."""
    return max(_MIN_STRIDE, m // _SAMPLE)


def _sample_ranks(k: int, m: int, s: int) -> list[int]:
    """Ranks in an s-entry uniform sample of the m entries at which to cut, first to last.

    The k-th largest of m sits at sample rank ``e = k s / m`` (binomial, sd ``sqrt(e)``);
    the first cut is ``e + 5 sd + 1`` deep, so more than k entries of data the sample
    represents lie above it; the retry is 8x deeper. Empty when cutting cannot pay off
    (the candidates would be more than a quarter of the data).
    """
    e = k * s / m
    first = math.ceil(e + _SIGMAS * math.sqrt(e)) + 1
    if 4 * first > s:
        return []
    return [first] + ([8 * first] if 8 * first < s else [])


def _above_plain(x: Tensor, thr: Tensor, strict: bool) -> Tensor:
    """Ascending indices of ``|x| >= thr`` (``>`` if strict) by one mask over all of ``x``."""
    return torch.nonzero((torch.gt if strict else torch.ge)(x.abs(), thr)).squeeze(1)


def _above(x: Tensor, thr: Tensor, strict: bool = False) -> Tensor:
    """Ascending int64 indices of the entries with ``|x| >= thr`` (``>`` if ``strict``),
    in one pass over ``x``: on CPU chunk by chunk through a small scratch buffer (no
    full-size temporaries); on other devices in one full-size pass."""
    if x.device.type != "cpu" or x.numel() < _CHUNK:
        return _above_plain(x, thr, strict)
    return _scan_chunks(x, thr, strict)


def _scan_chunks(x: Tensor, thr: Tensor, strict: bool) -> Tensor:
    """``_above`` on CPU. A chunk of ``|x|`` is viewed as a ``_ROWS x W`` matrix: the
    column maxima (one vectorised reduction) tell which few columns can hold a candidate,
    and only those are compared. Row-major order of (row, column) is ascending index
    order, so the indices come out sorted."""
    m = x.numel()
    cmp = torch.gt if strict else torch.ge
    width = _CHUNK // _ROWS
    mag = torch.empty(_CHUNK, dtype=x.dtype, device=x.device)
    grid = mag.view(_ROWS, width)
    parts = []
    full = m - m % _CHUNK
    for start in range(0, full, _CHUNK):
        torch.abs(x[start : start + _CHUNK], out=mag)
        cols = torch.nonzero(cmp(grid.amax(0), thr)).squeeze(1)
        if cols.numel() == 0:
            continue
        hit = torch.nonzero(cmp(grid.index_select(1, cols), thr))  # (row, j), row-major order
        parts.append(hit[:, 0].mul_(width).add_(cols[hit[:, 1]]).add_(start))
    if full < m:
        parts.append(_above_plain(x[full:], thr, strict).add_(full))
    if not parts:
        return torch.empty(0, dtype=torch.long, device=x.device)
    return torch.cat(parts)


def topk_indices(x: Tensor, k: int) -> Tensor:
    """Indices of the ``k`` largest ``|x|`` of a 1-D tensor, sorted ascending (int64).

    Exact: the result is the same set as ``torch.topk(x.abs(), k)`` except that ties at
    the k-th value are broken towards the smaller index.

    Fast path (m >= 2^16 and k small against m): a threshold ``t`` is read off a fixed
    strided sample of ``|x|``, a few standard deviations below the sample's estimate of
    the k-th largest value; one pass collects the candidates ``|x| >= t`` (``> 0`` when
    ``t`` is 0), and the exact selection runs on those only. That is exact whenever at
    least k candidates come back (the k-th largest is then >= ``t``, so all of the k
    largest are candidates); otherwise a lower threshold is tried, then the full
    selection. Deterministic: same input, same work, same result.
    """
    if x.dim() != 1:
        raise ValueError(f"topk_indices expects a 1-D tensor, got shape {tuple(x.shape)}")
    m = x.numel()
    if not 1 <= k <= m:
        raise ValueError(f"k must be in [1, {m}] for a tensor of {m} entries, got k={k}")
    if k == m:
        return torch.arange(m, device=x.device)
    if m >= _EXACT_BELOW:
        # On one CPU thread: the path is hundreds of short ops, and each multi-threaded
        # one waits at a barrier for a thread that another process may have descheduled
        # (3x slower on a 2-core machine with one competing process).
        with one_thread(x.device.type == "cpu"):
            found = _via_sample(x, k)
        if found is not None:
            return found
    return _exact(x, k)  # small m, large k, or the sample overestimated: full selection


def _via_sample(x: Tensor, k: int) -> Tensor | None:
    """``topk_indices``' fast path; None when no cut leaves at least k candidates."""
    m = x.numel()
    sample = x[:: _stride(m)].abs()
    tried = None
    for rank in _sample_ranks(k, m, sample.numel()):
        thr = torch.topk(sample, rank, sorted=False).values.min()
        if tried is not None and thr >= tried:
            break  # ties in the sample: the deeper cut is no lower
        cand = _above(x, thr, strict=bool(thr == 0))  # |x| >= 0 would be everything
        if cand.numel() >= k:  # the k largest are all >= thr: select among candidates
            return cand[_exact(x[cand], k)]
        tried = thr
    return None


def topk_rows(x: Tensor, k: int) -> Tensor:
    """``topk_indices`` of every row of a 2-D tensor ``x`` [P, m]: a [P, k] int64 tensor
    whose row i is ``topk_indices(x[i], k)`` exactly (same set, same tie rule, ascending).

    For P ranks' accumulated gradients held as one matrix (``cluster=simulated``), in a
    few large ops over all rows (so they may use every intra-op thread): each row's first
    ``_ROWS * W`` entries are viewed as a ``_ROWS x W`` matrix, and its ``W`` column
    maxima of ``|x|`` (with its last ``m mod _ROWS`` entries as columns of one) give the
    row's cut ``t`` (``_cut``): a value that at least k column maxima reach, read off a
    sample of them. At least k columns reach ``t``, each
    with an entry ``>= t``, so the k largest ``|x|`` are all ``>= t``: the candidates are
    the entries ``>= t`` in the columns that reach it (``_candidates``), and the exact
    selection among them runs once over all rows (``_exact_rows``). A row whose cut is 0,
    or which is too short for the columns to narrow anything, is selected on its own by
    ``topk_indices``. Local.
    """
    if x.dim() != 2:
        raise ValueError(f"topk_rows expects a 2-D tensor, got shape {tuple(x.shape)}")
    P, m = x.shape
    if P == 0:
        return x.new_empty(0, k, dtype=torch.long)
    if not 1 <= k <= m:
        raise ValueError(f"k must be in [1, {m}] for rows of {m} entries, got k={k}")
    if P == 1 or m < _EXACT_BELOW or 4 * k > m // _ROWS:
        return torch.stack([topk_indices(x[i], k) for i in range(P)])
    x = x.contiguous()
    key, row, counts = _candidates(x, k)
    full = counts >= k  # a row whose cut is 0 (or NaN) has none
    out = torch.empty(P, k, dtype=torch.long, device=x.device)
    for i in (~full).nonzero().squeeze(1).tolist():
        out[i] = topk_indices(x[i], k)
    if bool(full.any()):
        out[full] = _exact_rows(x, key, row, counts, full, k)
    return out


#: ``_cut`` samples every this many column maxima
_COL_STRIDE = 8

#: ``_candidates`` scans at most this many entries of the matrix per op (whole rows), so
#: that its scratch (about 3 / ``_ROWS`` of the block) stays bounded at any P
_BLOCK = 1 << 24


def _candidates(x: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """``topk_rows``' candidates in the contiguous ``x`` [P, m]: every entry with
    ``|x[i, j]| >= t[i]`` (``t[i]``: row i's ``_cut``, +inf where it is 0): its flat index
    ``i * m + j`` and row, two int64 tensors in ascending order, and each row's count ([P])."""
    P, m = x.shape
    W = m // _ROWS
    flat = x.view(-1)
    spread = torch.arange(_ROWS, device=x.device) * W  # a column's entries, from its first
    keys = []
    step = max(1, _BLOCK // m)
    for a in range(0, P, step):
        e = min(P, a + step)
        body = x[a:e, : _ROWS * W].reshape(e - a, _ROWS, W)
        colmax = torch.cat([torch.maximum(body.amax(1), body.amin(1).neg_()), x[a:e, _ROWS * W :].abs()], 1)
        t, r, c = _cut(colmax, k)  # the columns that reach their row's cut (aminmax above: slower)
        first = (r + a) * m + c  # a body column's first entry; a tail column's one entry
        cols = c < W
        ent = first[cols].unsqueeze(1) + spread  # [columns, _ROWS]: the reaching columns' entries
        keys.append(ent[flat.take(ent).abs() >= t[r[cols]]])
        keys.append(first[~cols] + (_ROWS - 1) * W)  # tail columns: their maximum is the entry
    key = torch.cat(keys).sort().values
    row = torch.div(key, m, rounding_mode="floor")
    return key, row, torch.bincount(row, minlength=P)


def _cut(colmax: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """Each row's cut ``t`` ([R, 1]) that at least k of its column maxima reach, and the
    (row, column) of the maxima that reach it, ascending. Read off a strided sample of
    the maxima (``_sample_ranks``: a few standard deviations deeper than the sample's
    estimate of the k-th largest); a row whose sampled cut leaves fewer than k columns,
    or is 0, takes the exact k-th largest maximum. A cut of 0 narrows nothing: it becomes
    +inf (no candidates; ``topk_rows`` selects that row on its own)."""
    R, n = colmax.shape
    sample = colmax[:, ::_COL_STRIDE]
    ranks = _sample_ranks(k, n, sample.shape[1])
    exact = not ranks
    t = torch.topk(colmax if exact else sample, k if exact else ranks[0], dim=1, sorted=False).values.amin(
        1, keepdim=True
    )
    if exact:
        t.masked_fill_(t == 0, float("inf"))
    r, c = torch.nonzero(colmax >= t, as_tuple=True)
    if not exact:
        short = ((torch.bincount(r, minlength=R) < k) | (t.squeeze(1) == 0)).nonzero().squeeze(1)
        if short.numel():  # rare: the exact cut for those rows, then the reaching columns again
            t[short] = torch.topk(colmax[short], k, dim=1, sorted=False).values.amin(1, keepdim=True)
            t.masked_fill_(t == 0, float("inf"))
            r, c = torch.nonzero(colmax >= t, as_tuple=True)
    return t, r, c


def _exact_rows(x: Tensor, key: Tensor, row: Tensor, counts: Tensor, full: Tensor, k: int) -> Tensor:
    """The k largest ``|x[i]|`` among row i's candidates (flat indices ``key`` of the
    contiguous ``x``, ascending, their rows ``row``; ``counts[i]`` in row i, at least k
    where the bool ``full[i]``), ties to the smaller index, for every row with ``full[i]``:
    [sum(full), k] column indices, ascending."""
    P, m = x.shape
    n = int(counts.max())
    pos = torch.arange(row.numel(), device=x.device) - (torch.cumsum(counts, 0) - counts)[row]
    idx = torch.zeros(P, n, dtype=torch.long, device=x.device)
    mag = torch.full((P, n), -1.0, dtype=x.dtype, device=x.device)  # padding: below every |x|
    idx[row, pos] = key - row * m
    mag[row, pos] = x.view(-1).take(key).abs()
    idx, mag = idx[full], mag[full]
    kth = torch.topk(mag, k, dim=1, sorted=False).values.amin(1, keepdim=True)
    above = mag > kth
    ties = mag == kth
    need = k - above.sum(1, keepdim=True)
    keep = above | (ties & (torch.cumsum(ties, 1) <= need))  # the first ties, by index
    return idx[keep].view(-1, k)
