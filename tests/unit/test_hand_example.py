"""A 4-worker example computed by hand, in the style of the paper's Fig. 1 (Top-k) and
Fig. 3 (gTop-k), run through the reference and the distributed reducers.

m = 8, k = 2. Local top-2 sets: w0 {0: 10, 1: 9}, w1 {4: 1, 5: 0.9}, w2 {4: 20, 6: 0.3},
w3 {4: 20, 7: 0.2}. Tree round 0: 0<-1 keeps {0: 10, 1: 9} (w1's index 4 is dropped);
2<-3 keeps {4: 40, 6: 0.3}. Round 1: 0<-2 keeps {4: 40, 0: 10}. So F = {0, 4}.
"""

from __future__ import annotations

import pytest
import torch

from gtopk.reducers import reference
from gtopk.run.spawn import spawn
from tests.workers import run_hand_cases


def accs() -> list[torch.Tensor]:
    a = torch.zeros(4, 8)
    a[0, 0], a[0, 1] = 10, 9
    a[1, 4], a[1, 5] = 1, 0.9
    a[2, 4], a[2, 6] = 20, 0.3
    a[3, 4], a[3, 7] = 20, 0.2
    return list(a)


def sparse(m: int, entries: dict[int, float]) -> torch.Tensor:
    v = torch.zeros(m)
    for i, x in entries.items():
        v[i] = x
    return v


EXPECTED = {
    # Top-k (Fig. 1): every selected value is summed and applied; nothing is kept.
    ("topk", "reselect=False"): (
        {0: 10 / 4, 1: 9 / 4, 4: 41 / 4, 5: 0.9 / 4, 6: 0.3 / 4, 7: 0.2 / 4},
        [{}, {}, {}, {}],
    ),
    # select k from k*P: the top-2 of the sum {4: 41, 0: 10}; the rest goes back.
    ("topk", "reselect=True"): ({0: 10 / 4, 4: 41 / 4}, [{1: 9}, {5: 0.9}, {6: 0.3}, {7: 0.2}]),
    # gTop-k, the paper's put-back: w1's 1.0 at index 4 is neither applied nor kept.
    ("gtopk", "index"): ({0: 10 / 4, 4: 40 / 4}, [{1: 9}, {5: 0.9}, {6: 0.3}, {7: 0.2}]),
    # gTop-k, exact put-back: acc[F] re-summed, so index 4 carries 1 + 20 + 20.
    ("gtopk", "exact"): ({0: 10 / 4, 4: 41 / 4}, [{1: 9}, {5: 0.9}, {6: 0.3}, {7: 0.2}]),
}

CALLS = {
    ("topk", "reselect=False"): (dict(reselect=False), lambda a: reference.topk(a, 2, reselect=False)),
    ("topk", "reselect=True"): (dict(reselect=True), lambda a: reference.topk(a, 2, reselect=True)),
}
for algo in ("tree", "recursive_doubling"):
    for pb in ("index", "exact"):
        CALLS[("gtopk", algo, pb)] = (
            dict(algorithm=algo, putback=pb),
            lambda a, algo=algo, pb=pb: reference.gtopk(a, 2, algorithm=algo, putback=pb),
        )


def expected_for(key):
    want_update, want_res = EXPECTED[key if key[0] == "topk" else ("gtopk", key[2])]
    return sparse(8, want_update), [sparse(8, r) for r in want_res]


@pytest.mark.parametrize("key", list(CALLS), ids=lambda k: "-".join(k))
def test_reference_by_hand(key):
    want_update, want_res = expected_for(key)
    update, residuals = CALLS[key][1](accs())
    torch.testing.assert_close(update, want_update, rtol=0, atol=1e-7)
    for r, w in zip(residuals, want_res):
        torch.testing.assert_close(r, w, rtol=0, atol=0)


def test_index_putback_loses_exactly_the_dropped_value():
    update, residuals = reference.gtopk(accs(), 2, algorithm="tree", putback="index")
    lost = torch.stack(accs()).sum(0) - (4 * update + torch.stack(residuals).sum(0))
    torch.testing.assert_close(lost, sparse(8, {4: 1.0}), rtol=0, atol=1e-6)


def test_distributed_by_hand():
    """The same example on 4 gloo ranks, every reducer variant: equal to the hand result."""
    keys = list(CALLS)
    configs = [(key[0], CALLS[key][0]) for key in keys]
    out = spawn(run_hand_cases, 4, (configs, accs(), 2), timeout=120)
    for i, key in enumerate(keys):
        want_update, want_res = expected_for(key)
        for rank, per_rank in enumerate(out):
            update, residual = per_rank[i]
            torch.testing.assert_close(update, want_update, rtol=0, atol=1e-7, msg=f"{key} rank {rank}")
            torch.testing.assert_close(residual, want_res[rank], rtol=0, atol=0, msg=f"{key} rank {rank}")
