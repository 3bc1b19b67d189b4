"""P ranks' reduce in one process (``Reducer.reduce_group``, ``cluster=simulated``) against
the executable specification ``gtopk.reducers.reference``: sparse reducers bit for bit
(update and every rank's residual, over several steps), dense to float rounding; and the
per-step diagnostics against quantities computed from the reference's outputs."""

from __future__ import annotations

import itertools

import pytest
import torch

from gtopk.reducers import DenseReducer, GTopKReducer, TopKReducer, reference
from gtopk.reducers.selection.exact import k_for

SPARSE = [("topk", {"reselect": r}) for r in (False, True)] + [
    ("gtopk", {"algorithm": a, "putback": p})
    for a, p in itertools.product(("tree", "recursive_doubling"), ("index", "exact"))
]
CLASSES = {"topk": TopKReducer, "gtopk": GTopKReducer}


def grads_for(P: int, m: int, it: int, ties: bool) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7919 * it + P)
    if ties:  # small integers: many equal magnitudes
        return [torch.randint(-3, 4, (m,), generator=g).float() for _ in range(P)]
    return [torch.randn(m, generator=g) for _ in range(P)]


def reference_step(kind: str, options: dict, accs: list[torch.Tensor], k: int):
    return (reference.topk if kind == "topk" else reference.gtopk)(accs, k, **options)


@pytest.mark.parametrize("P", [1, 2, 3, 4, 5, 6, 8, 9])
@pytest.mark.parametrize("kind,options", SPARSE, ids=lambda v: str(v))
@pytest.mark.parametrize("m,density,ties", [(1000, 0.01, False), (1000, 0.1, True), (37, 0.2, False), (50, 1e-9, True)])
def test_sparse_group_equals_the_reference_bit_for_bit(P, kind, options, m, density, ties):
    workers = [CLASSES[kind](density=density, **options) for _ in range(P)]
    k = k_for(density, m)
    residuals = [torch.zeros(m) for _ in range(P)]
    for it in range(4):
        grads = grads_for(P, m, it, ties)
        want_update, residuals = reference_step(kind, options, [r + g for r, g in zip(residuals, grads)], k)
        update, recs = type(workers[0]).reduce_group(workers, [g.clone() for g in grads])
        assert torch.equal(update, want_update), f"iter {it}: max diff {(update - want_update).abs().max()}"
        for rank, (w, want) in enumerate(zip(workers, residuals)):
            assert torch.equal(w.feedback.residual, want), f"iter {it} rank {rank}"
        assert [r.selected for r in recs] == [k] * P and all(r.t_commu == 0 for r in recs)


@pytest.mark.parametrize("P", [1, 2, 3, 5])
def test_dense_group_is_the_mean_gradient(P):
    workers = [DenseReducer() for _ in range(P)]
    grads = grads_for(P, 1000, 0, False)
    update, recs = DenseReducer.reduce_group(workers, grads)
    want, _ = reference.dense(grads)
    assert torch.allclose(update, want, rtol=1e-6, atol=1e-7)
    assert all(r.selected == 1000 for r in recs)


@pytest.mark.parametrize("P", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("algorithm", ["tree", "recursive_doubling"])
def test_lost_mass_accounts_for_the_index_putback_gap(P, algorithm):
    """sum_i acc_i - P * update - sum_i residual_i is what the step lost (reference);
    the ranks' lost_l1 add up to its L1 when no two drops share an index (always for
    P <= 3: only the last merge follows the first) and bound it otherwise."""
    m, density = 2000, 0.02
    workers = [GTopKReducer(density=density, algorithm=algorithm, putback="index") for _ in range(P)]
    for w in workers:
        w.diagnostics = True
    residuals, total = [torch.zeros(m) for _ in range(P)], 0.0
    for it in range(5):
        grads = grads_for(P, m, it, False)
        accs = [r + g for r, g in zip(residuals, grads)]
        update, residuals = reference.gtopk(accs, k_for(density, m), algorithm, "index")
        got, recs = GTopKReducer.reduce_group(workers, grads)
        gap = (torch.stack(accs).double().sum(0) - P * update.double() - torch.stack(residuals).double().sum(0)).abs()
        lost = sum(r.lost_l1 for r in recs)
        if P <= 3:
            assert lost == pytest.approx(gap.sum().item(), rel=1e-5, abs=1e-4)  # float32 rounding
        else:
            assert lost >= gap.sum().item() * (1 - 1e-5) - 1e-4
        total += lost
        assert all(r.update_nnz == int(torch.count_nonzero(update)) for r in recs)
        for r, want in zip(recs, residuals):
            assert r.residual_norm == pytest.approx(want.norm().item(), rel=1e-6)
    assert (total > 0) == (P >= 3)  # a value dropped before the last merge needs 3 ranks


@pytest.mark.parametrize("kind,options", SPARSE + [("dense", {})], ids=lambda v: str(v))
def test_lossless_settings_report_no_loss_and_diagnostics_are_off_by_default(kind, options):
    P, m = 4, 1000
    make = (lambda: DenseReducer()) if kind == "dense" else (lambda: CLASSES[kind](density=0.05, **options))
    quiet = [make() for _ in range(P)]
    _, recs = type(quiet[0]).reduce_group(quiet, grads_for(P, m, 0, False))
    assert all(r.update_nnz is None and r.residual_norm is None and r.lost_l1 is None for r in recs)
    if options.get("putback") == "index":
        return
    loud = [make() for _ in range(P)]
    for w in loud:
        w.diagnostics = True
    update, recs = type(loud[0]).reduce_group(loud, grads_for(P, m, 0, False))
    assert all(r.lost_l1 == 0.0 for r in recs)
    assert all(r.update_nnz == int(torch.count_nonzero(update)) for r in recs)
