"""Exact top-k selection and the gTop-k merge (local, no processes)."""

from __future__ import annotations

import pytest
import torch

from gtopk.reducers import reference, sparse
from gtopk.reducers.selection.exact import k_for, topk_indices
from gtopk.reducers.sparse import keep_topk, member_mask, merge


@pytest.mark.parametrize("m,k", [(1, 1), (10, 1), (10, 10), (1000, 7), (100_000, 100), (269_722, 269)])
def test_topk_indices_is_the_topk_set(m, k):
    x = torch.randn(m, generator=torch.Generator().manual_seed(m + k))
    got = topk_indices(x, k)
    want = torch.topk(x.abs(), k).indices.sort().values  # continuous data: no ties
    assert torch.equal(got, want)
    assert torch.equal(got, got.sort().values)


def test_ties_go_to_the_smaller_index():
    x = torch.tensor([1.0, -3.0, 2.0, 3.0, -2.0, 2.0, 0.0])
    assert topk_indices(x, 2).tolist() == [1, 3]
    assert topk_indices(x, 3).tolist() == [1, 2, 3]  # 2.0 at 2, 4, 5: index 2 wins
    assert topk_indices(x, 4).tolist() == [1, 2, 3, 4]
    assert topk_indices(torch.zeros(5), 2).tolist() == [0, 1]


def test_topk_indices_matches_reference_with_many_ties():
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        x = torch.randint(-3, 4, (500,), generator=g).float()
        for k in (1, 5, 77, 499, 500):
            assert torch.equal(topk_indices(x, k), reference.local_topk(x, k)[0])


@pytest.mark.parametrize("k", [0, 11])
def test_topk_indices_rejects_bad_k(k):
    with pytest.raises(ValueError, match="k must be"):
        topk_indices(torch.randn(10), k)


def test_k_for():
    assert k_for(0.001, 14_728_266) == 14_728
    assert k_for(1e-9, 100) == 1
    assert k_for(1.0, 100) == 100


def test_merge_sums_shared_indices_and_keeps_k():
    a = (torch.tensor([0, 3, 5]), torch.tensor([1.0, -4.0, 2.0]))
    b = (torch.tensor([3, 4, 5]), torch.tensor([1.0, 0.5, -2.0]))
    idx, val = merge(*a, *b, k=3)
    # union sums: {0: 1, 3: -3, 4: 0.5, 5: 0}; top-3 |.|: 3, 0, 4
    assert idx.tolist() == [0, 3, 4] and val.tolist() == [1.0, -3.0, 0.5]


def test_merge_is_commutative_bit_for_bit_and_equals_reference():
    g = torch.Generator().manual_seed(3)
    m, k = 200, 20
    for data in ("normal", "ties"):
        for _ in range(30):
            xs = [
                torch.randn(m, generator=g) if data == "normal" else torch.randint(-2, 3, (m,), generator=g).float()
                for _ in range(2)
            ]
            a, b = (reference.local_topk(x, k) for x in xs)
            ab, ba = merge(*a, *b, k), merge(*b, *a, k)
            assert torch.equal(ab[0], ba[0]) and torch.equal(ab[1], ba[1])
            ref = reference.merge(a, b, k, m)
            assert torch.equal(ab[0], ref[0]) and torch.equal(ab[1], ref[1])


def test_keep_topk_ties_to_smaller_index():
    idx, val = keep_topk(torch.tensor([2, 5, 9, 11]), torch.tensor([1.0, -2.0, 2.0, 2.0]), 2)
    assert idx.tolist() == [5, 9]


def test_member_mask():
    s = torch.tensor([2, 5, 9])
    assert member_mask(s, torch.tensor([], dtype=torch.long)).tolist() == []
    assert member_mask(s, torch.tensor([0, 2, 9, 10, 5])).tolist() == [False, True, True, False, True]
    assert member_mask(torch.tensor([], dtype=torch.long), torch.tensor([1])).tolist() == [False]


# -- topk_indices against a brute-force reference, every path -------------------------

import gtopk.reducers.selection.exact as selection  # noqa: E402  (module constants are patched below)


def brute_topk(x: torch.Tensor, k: int) -> torch.Tensor:
    """Reference by a full sort: order by (|x| descending, index ascending), first k, sorted."""
    mag = x.abs().tolist()
    order = sorted(range(len(mag)), key=lambda i: (-mag[i], i))
    return torch.tensor(sorted(order[:k]), dtype=torch.long)


class PathSpy:
    """Counts the candidate scans and the full selections ``topk_indices`` makes."""

    def __init__(self, monkeypatch):
        self.scans = self.full = 0
        above, exact = selection._above, selection._exact

        def spy_above(x, thr, strict=False):
            self.scans += 1
            return above(x, thr, strict)

        def spy_exact(x, k):
            self.full += x.numel() == self.m
            return exact(x, k)

        monkeypatch.setattr(selection, "_above", spy_above)
        monkeypatch.setattr(selection, "_exact", spy_exact)

    def __call__(self, x: torch.Tensor, k: int) -> tuple[torch.Tensor, str]:
        """``topk_indices(x, k)`` and the path it took: direct, fast, retry or fallback."""
        self.scans = self.full = 0
        self.m = x.numel()
        got = selection.topk_indices(x, k)
        if self.scans == 0:
            path = "direct"
        elif self.full:
            path = "fallback"
        else:
            path = "fast" if self.scans == 1 else "retry"
        return got, path


@pytest.fixture
def small_sizes(monkeypatch):
    """Shrink the size constants so that tensors of a few thousand entries take every path
    (sampling, chunked column-max scan with a tail, retry, fallback; topk_rows' blocks of rows)."""
    monkeypatch.setattr(selection, "_EXACT_BELOW", 128)
    monkeypatch.setattr(selection, "_SAMPLE", 64)
    monkeypatch.setattr(selection, "_CHUNK", 256)
    monkeypatch.setattr(selection, "_ROWS", 8)
    monkeypatch.setattr(selection, "_MIN_STRIDE", 1)
    monkeypatch.setattr(selection, "_BLOCK", 4096)  # topk_rows scans a few rows per op
    monkeypatch.setattr(selection, "_COL_STRIDE", 2)
    return PathSpy(monkeypatch)


def random_case(g: torch.Generator, m: int) -> torch.Tensor:
    """One of several data families, chosen by the generator."""
    kind = int(torch.randint(0, 10, (1,), generator=g))
    if kind == 0:
        return torch.randn(m, generator=g)
    if kind == 1:  # heavy tails
        return torch.randn(m, generator=g) ** 5 * torch.randn(m, generator=g).exp() ** 8
    if kind == 2:  # few distinct values: many ties at the k-th value
        return torch.randint(-3, 4, (m,), generator=g).float()
    if kind == 3:  # mostly zeros (+0.0 and -0.0)
        x = torch.randn(m, generator=g) * (torch.rand(m, generator=g) < 0.01)
        return torch.where(torch.rand(m, generator=g) < 0.5, x, -x)
    if kind == 4:  # sorted by value, ascending or descending
        x = torch.randn(m, generator=g).sort().values
        return x if m % 2 else x.flip(0)
    if kind == 5:  # all equal magnitude, random signs
        return torch.where(torch.rand(m, generator=g) < 0.5, 2.5, -2.5)
    if kind == 6:  # large values exactly on a stride: the strided sample sees only them
        x = torch.randn(m, generator=g)
        x[:: int(torch.randint(1, 64, (1,), generator=g))] = 100.0
        return x
    if kind == 7:  # bfloat16-rounded values (ties) with infinities
        x = torch.randn(m, generator=g).bfloat16().float()
        x[torch.randint(0, m, (3,), generator=g)] = float("inf")
        return x
    if kind == 8:  # |x| sorted descending
        return torch.randn(m, generator=g).abs().sort().values.flip(0)
    # The strided sample is zeros and a few large values.
    x, stride = torch.randn(m, generator=g), selection._stride(m)
    x[::stride] = 0.0
    x[: int(torch.randint(1, 10, (1,), generator=g)) * stride : stride] = 100.0
    return x


def test_topk_indices_matches_brute_force_on_random_and_adversarial_data(small_sizes):
    g = torch.Generator().manual_seed(6)
    paths = {}
    for case in range(300):
        m = int(torch.randint(1, 3000, (1,), generator=g))
        x = random_case(g, m)
        for k in {1, 2, max(1, m // 1000), max(1, m // 100), max(1, m // 10), m - 1 or 1, m}:
            got, path = small_sizes(x, k)
            assert torch.equal(got, brute_topk(x, k)), (case, m, k, path)
            assert got.dtype == torch.long
            paths[path] = paths.get(path, 0) + 1
    # The data families must drive every path, or this test does not test them.
    assert set(paths) == {"direct", "fast", "retry", "fallback"}, paths


def test_fallback_when_the_sample_overestimates(small_sizes):
    m, k = 5000, 100
    stride = selection._stride(m)
    x = torch.randn(m, generator=torch.Generator().manual_seed(0))
    x[::stride] = 100.0  # the whole sample (65 entries) is 100: no lower cut, 65 < k candidates
    got, path = small_sizes(x, k)
    assert path == "fallback" and torch.equal(got, brute_topk(x, k))


def test_retry_when_the_first_cut_is_too_high(small_sizes):
    m, k = 5000, 12
    stride = selection._stride(m)
    x = torch.randn(m, generator=torch.Generator().manual_seed(0))
    x[::stride] = 0.0
    x[: 8 * stride : stride] = 100.0  # first cut at 100 (8 < k candidates), the retry at 0
    got, path = small_sizes(x, k)
    assert path == "retry" and torch.equal(got, brute_topk(x, k))


def test_fast_path_scans_once_on_normal_data(small_sizes):
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(1))
    got, path = small_sizes(x, 10)
    assert path == "fast" and torch.equal(got, brute_topk(x, 10))


@pytest.mark.parametrize("m", [1 << 16, (1 << 18) * 3 + 12_345])
def test_topk_indices_at_real_sizes(m, monkeypatch):
    """Unpatched constants: sample, several full chunks and a tail; normal and tied data."""
    spy = PathSpy(monkeypatch)
    g = torch.Generator().manual_seed(m)
    for x in (torch.randn(m, generator=g), torch.randint(-50, 51, (m,), generator=g).float()):
        for k in (1, m // 1000, m // 100):
            got, path = spy(x, k)
            ref = torch.sort(x.abs(), descending=True, stable=True).indices[:k].sort().values
            assert path in ("fast", "retry") and torch.equal(got, ref), (k, path)


def test_topk_indices_is_deterministic_and_takes_views(small_sizes):
    base = torch.randn(20_000, generator=torch.Generator().manual_seed(2))
    x = base[1::2]  # non-contiguous 1-D view
    first, path = small_sizes(x, 30)
    assert path == "fast" and torch.equal(first, brute_topk(x.contiguous(), 30))
    assert torch.equal(small_sizes(x, 30)[0], first)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_topk_indices_other_dtypes(small_sizes, dtype):
    x = torch.randn(4000, generator=torch.Generator().manual_seed(3)).to(dtype)
    for k in (1, 40, 400):
        assert torch.equal(small_sizes(x, k)[0], brute_topk(x.double(), k))


def _merge_by_sorting(ia, va, ib, vb, k):
    """Brute-force merge: sort the union, sum duplicates, stable sort by |value|."""
    idx = torch.cat([ia, ib])
    val = torch.cat([va, vb])
    uniq, inverse = torch.unique(idx, sorted=True, return_inverse=True)
    summed = torch.zeros(uniq.numel()).index_add_(0, inverse, val)
    if uniq.numel() <= k:
        return uniq, summed
    order = torch.sort(summed.abs(), descending=True, stable=True).indices[:k].sort().values
    return uniq[order], summed[order]


@pytest.mark.parametrize("impl", ["cpu", "torch"])
@pytest.mark.parametrize("seed", range(4))
def test_merge_equals_brute_force_including_empty_and_overlapping_inputs(seed, impl):
    """``cpu``: the NumPy path CPU tensors take; ``torch``: the path of other devices (CUDA),
    run here on CPU tensors."""
    merge_fn = merge if impl == "cpu" else sparse._merge_torch
    g = torch.Generator().manual_seed(seed)
    for trial in range(150):
        m = int(torch.randint(1, 120, (1,), generator=g))
        na, nb, k = (int(torch.randint(lo, m + 1, (1,), generator=g)) for lo in (0, 0, 1))
        if na + nb == 0:
            continue
        ia = torch.randperm(m, generator=g)[:na].sort().values
        ib = torch.randperm(m, generator=g)[:nb].sort().values
        draw = (
            (lambda n: torch.randint(-2, 3, (n,), generator=g).float())
            if trial % 2
            else (lambda n: torch.randn(n, generator=g))
        )
        va, vb = draw(na), draw(nb)
        got = merge_fn(ia, va, ib, vb, k)
        want = _merge_by_sorting(ia, va, ib, vb, k)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (m, na, nb, k)


def test_one_thread_sets_and_restores_the_thread_count():
    from gtopk.host import one_thread

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with one_thread():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with one_thread(enabled=False):
            assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError), one_thread():
            raise RuntimeError("restored on the way out")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_topk_rows_is_topk_indices_of_every_row(small_sizes):
    """All P ranks' selections at once (cluster=simulated): row i is topk_indices(x[i])
    exactly, whatever path each row would take alone (fast, retry, fallback, direct)."""
    from gtopk.reducers.selection.exact import topk_rows

    g = torch.Generator().manual_seed(7)
    paths = set()
    for case in range(80):
        m, P = int(torch.randint(1, 3000, (1,), generator=g)), int(torch.randint(1, 9, (1,), generator=g))
        x = torch.stack([random_case(g, m) for _ in range(P)])
        for k in {1, max(1, m // 1000), max(1, m // 100), max(1, m // 10), m}:
            got = topk_rows(x, k)
            assert got.shape == (P, k) and got.dtype == torch.long
            for i in range(P):
                want, path = small_sizes(x[i], k)
                paths.add(path)
                assert torch.equal(got[i], want), (case, m, P, k, i, path)
                assert torch.equal(want, brute_topk(x[i], k))
    assert paths == {"direct", "fast", "retry", "fallback"}, paths


def test_topk_rows_at_real_size():
    """ResNet-20's m, unpatched constants, rows of different scales, one of ties, one with
    fewer than k nonzero entries (its cut is 0), one whose largest entries share columns
    of the scan, and one with a few huge entries."""
    from gtopk.reducers.selection.exact import topk_rows

    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 269_722, generator=g) * torch.rand(8, 1, generator=g)
    x[5] = torch.randint(-50, 51, (269_722,), generator=g).float()
    x[6] = 0.0
    x[6, torch.randperm(269_722, generator=g)[:200]] = torch.randn(200, generator=g)
    W = 269_722 // 16
    x[7, 5 : 16 * W : W] = 1e3  # 16 of the largest in one column of the 16 x W view
    x[2, -3:] = -1e4  # the entries after the view's last full column
    for k in (1, 269, 2_697):
        got = topk_rows(x, k)
        for i in range(8):
            assert torch.equal(got[i], topk_indices(x[i], k)), (k, i)
