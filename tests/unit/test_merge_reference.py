"""The CPU gTop-k merge (``sparse.merge`` on NumPy arrays and CPU tensors) and ``keep_topk``
against a reference written out here: a dict sums the two vectors (a's value + b's at a
shared index), a sort by (-|value|, index) picks the k kept, the rest is what was dropped.
Random inputs as the rounds carry them (ascending unique indices, int64 and int32), with
no, some, and complete overlap, ties in |value| (small integers, +-0.0), a union of at
most k, and values whose strided sample misleads (the k-th largest selection's fallback),
at k = 1, 2, 269 and 14,728 (local, no processes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gtopk.reducers.sparse import keep_topk, merge


def reference(ia, va, ib, vb, k: int):
    """(kept, dropped): each a list of (index, value) in ascending index order; dropped is
    None when the union has at most k entries."""
    total = {int(i): v for i, v in zip(ia, va)}
    for i, v in zip(ib, vb):
        i = int(i)
        total[i] = total[i] + v if i in total else v
    if len(total) <= k:
        return sorted(total.items()), None
    ranked = sorted(total.items(), key=lambda e: (-abs(float(e[1])), e[0]))
    return sorted(ranked[:k]), sorted(ranked[k:])


def draw_values(rng: np.random.Generator, n: int, kind: str) -> np.ndarray:
    if kind == "normal":
        return rng.standard_normal(n).astype(np.float32)
    if kind == "ties":  # few distinct |values|, 0.0 and -0.0 among them
        return (rng.integers(-2, 3, n) * rng.choice([1.0, -1.0], n)).astype(np.float32)
    v = rng.standard_normal(n).astype(np.float32)  # "strided": every 16th is large (misleads a strided sample)
    v[::16] = 100.0
    return v


def draw_case(rng: np.random.Generator, k: int, overlap: float, kind: str, short: bool = False):
    """Two sparse vectors over [0, m): a with int64 indices (a rank's own selection), b
    with int32 (decoded from the wire); b shares about ``overlap`` of a's indices. With
    ``short``, fewer than k entries each (some union of at most k)."""
    m = max(4 * k, 16)
    na, nb = (int(rng.integers(0, k + 1)), int(rng.integers(0, k + 1))) if short else (k, k)
    ia = np.sort(rng.choice(m, na, replace=False)).astype(np.int64)
    shared = rng.choice(ia, min(na, nb, int(round(overlap * nb))), replace=False)
    others = np.setdiff1d(np.arange(m), ia)
    ib = np.sort(np.concatenate([shared, rng.choice(others, nb - shared.size, replace=False)]))
    return ia, draw_values(rng, na, kind), ib.astype(np.int32), draw_values(rng, nb, kind)


def check(got, dropped: list, want) -> None:
    kept, lost = want
    idx, val = got
    assert idx.dtype == np.int64 and val.dtype == np.float32
    assert idx.tolist() == [i for i, _ in kept]
    assert val.view(np.int32).tolist() == np.array([v for _, v in kept], np.float32).view(np.int32).tolist()
    if lost is None:
        assert dropped == []
        return
    ((d_idx, d_val),) = dropped
    assert d_idx.dtype == torch.int64 and d_val.dtype == torch.float32
    assert d_idx.tolist() == [i for i, _ in lost]
    assert d_val.numpy().view(np.int32).tolist() == np.array([v for _, v in lost], np.float32).view(np.int32).tolist()


@pytest.mark.parametrize("kind", ["normal", "ties", "strided"])
@pytest.mark.parametrize("k", [1, 2, 269, 14_728])
def test_merge_equals_the_reference(k, kind):
    rng = np.random.default_rng([k, len(kind)])
    trials = 2 if k > 1000 else 12
    for overlap in (0.0, 0.25, 0.5, 1.0):
        for trial in range(trials):
            a, b = (draw_case(rng, k, overlap, kind, short=trial % 4 == 3) for _ in range(2))
            ia, va, ib, vb = a[0], a[1], b[2], b[3]
            want = reference(ia, va, ib, vb, k)
            dropped: list = []
            check(merge(ia, va, ib, vb, k, dropped), dropped, want)
            tensors = [torch.from_numpy(x) for x in (ia, va, ib.astype(np.int64), vb)]
            dropped = []
            got = merge(*tensors, k, dropped)  # CPU tensors: the same path, tensors back
            check(tuple(t.numpy() for t in got), dropped, want)


@pytest.mark.parametrize("kind", ["normal", "ties", "strided"])
@pytest.mark.parametrize("k", [1, 2, 269, 14_728])
def test_keep_topk_equals_the_reference(k, kind):
    rng = np.random.default_rng([k, len(kind), 1])
    n = 2 * k + 1
    idx = np.sort(rng.choice(4 * n, n, replace=False))
    val = draw_values(rng, n, kind)
    kept, _ = reference(idx, val, idx[:0], val[:0], k)
    got_idx, got_val = keep_topk(torch.from_numpy(idx), torch.from_numpy(val), k)
    assert got_idx.tolist() == [i for i, _ in kept]
    assert got_val.numpy().view(np.int32).tolist() == np.array([v for _, v in kept], np.float32).view(np.int32).tolist()
