"""Exact top-k selection and the gTop-k merge (local, no processes)."""

from __future__ import annotations

import pytest
import torch

from gtopk import reference
from gtopk.selection import k_for, keep_topk, member_mask, merge, topk_indices


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
            xs = [torch.randn(m, generator=g) if data == "normal"
                  else torch.randint(-2, 3, (m,), generator=g).float() for _ in range(2)]
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
    assert member_mask(s, torch.tensor([0, 2, 9, 10, 5])).tolist() == [False, True, True, False, True]
    assert member_mask(torch.tensor([], dtype=torch.long), torch.tensor([1])).tolist() == [False]
