"""P ranks' ``reduce`` computed in one process (``cluster=simulated``); all local.

``Reducer.reduce_group(workers, grads)`` calls these: ``workers[i]`` is rank i's reducer
(settings, error-feedback residual, ``diagnostics``) and ``grads[i]`` its flat gradient.
They return the update every rank's ``reduce`` returns and each rank's ``ReduceRecord``,
and leave each worker's residual as that rank's ``reduce`` leaves it.

The sparse paths use the distributed reducers' own kernels (``selection.topk_indices``,
``sparse.merge`` / ``keep_topk`` / ``member_mask``), the same schedules run over a list
(``schedules.tree_reduce_local`` / ``recursive_doubling_local``: the same combines with
the same operands, in the same order) and the same summation order, so the update and
residuals equal the distributed ones bit for bit (and ``gtopk.reducers.reference``'s:
``tests/unit/test_reduce_group.py``). Dense sums the gradients in rank order; the
backend's all-reduce sums in its own order (equal up to float rounding).

Records: ``selected``, the traffic the real collective would have (the cost model's
per-rank counts, ``gtopk.reducers.costmodel``: nominal for dense and Top-k as in their
distributed records, exact for gTop-k), ``t_compr`` (the rank's own selection and
put-back), ``t_merge`` (the merges the rank makes, or owns), no ``t_commu`` (nothing is
sent), and with ``diagnostics`` update_nnz, residual_norm and lost_l1 as defined in
``ReduceRecord``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gtopk.host import Clock
from gtopk.reducers.base import ReduceRecord
from gtopk.reducers.costmodel import dense_traffic, gtopk_traffic, topk_traffic
from gtopk.reducers.schedules import recursive_doubling_local, tree_reduce_local
from gtopk.reducers.selection import k_for, topk_indices
from gtopk.reducers.sparse import keep_topk, member_mask, merge

Sparse = tuple[Tensor, Tensor]


def _diagnose(workers: list, recs: list[ReduceRecord], nnz: int, lost: list[float] | None = None) -> None:
    """Fill the diagnostics of every rank's record (when the reducers ask for them)."""
    if not workers[0].diagnostics:
        return
    for i, (w, rec) in enumerate(zip(workers, recs)):
        feedback = getattr(w, "feedback", None)
        residual = None if feedback is None else feedback.residual
        rec.update_nnz = nnz
        rec.residual_norm = 0.0 if residual is None else float(torch.linalg.vector_norm(residual))
        rec.lost_l1 = 0.0 if lost is None else lost[i]


def _select(workers: list, grads: list[Tensor], k: int, recs: list[ReduceRecord]) -> tuple[list, list]:
    """Each rank's accumulated vector (its residual buffer) and selected indices."""
    accs, sels = [], []
    for w, g, rec in zip(workers, grads, recs):
        t0 = _now(g)
        acc = w.feedback.accumulate(g)
        sels.append(topk_indices(acc, k))
        accs.append(acc)
        rec.selected = k
        rec.t_compr += _now(g) - t0
    return accs, sels


def _now(t: Tensor) -> float:
    """The time once the work queued on ``t``'s device is done (``gtopk.host.Clock``)."""
    return Clock(t.device)()


def _timed(rec: ReduceRecord, fn, *args) -> None:
    t0 = _now(args[0])
    fn(*args)
    rec.t_compr += _now(args[0]) - t0


def dense_group(workers: list, grads: list[Tensor]) -> tuple[Tensor, list[ReduceRecord]]:
    """Dense: the P gradients summed in rank order, / P."""
    P, m = len(grads), grads[0].numel()
    update = grads[0].detach().clone()
    for g in grads[1:]:
        update.add_(g)
    if P > 1:
        update.div_(P)
    recs = [ReduceRecord(selected=m) for _ in workers]
    for rec in recs:
        rec.set_traffic(dense_traffic(P, workers[0].bucket_sizes(m)))
    _diagnose(workers, recs, m)
    return update, recs


def topk_group(workers: list, grads: list[Tensor]) -> tuple[Tensor, list[ReduceRecord]]:
    """Top-k: every rank's k entries scatter-added in rank order, / P (``reselect``: the k
    largest of the sum; each rank puts back its selected values outside them)."""
    P, m = len(grads), grads[0].numel()
    k = k_for(workers[0].density, m)
    recs = [ReduceRecord() for _ in workers]
    accs, sels = _select(workers, grads, k, recs)
    parts = [(sel, acc[sel]) for acc, sel in zip(accs, sels)]
    summed = torch.zeros_like(accs[0])
    for idx, val in parts:  # rank order, as TopKReducer sums the gathered parts
        summed.index_add_(0, idx, val)
    union = torch.unique(torch.cat(sels), sorted=True)
    if workers[0].reselect:
        final_idx, final_val = keep_topk(union, summed[union], k)
        update = summed.zero_()
        update[final_idx] = final_val / P
        for acc, sel, rec in zip(accs, sels, recs):
            _timed(rec, acc.__setitem__, sel[member_mask(final_idx, sel)], 0)
        nnz = final_idx.numel()
    else:
        update = summed.div_(P)
        for acc, sel, rec in zip(accs, sels, recs):
            _timed(rec, acc.__setitem__, sel, 0)
        nnz = union.numel()
    for rec in recs:
        rec.set_traffic(topk_traffic(P, k, m))
    _diagnose(workers, recs, nnz)
    return update, recs


def gtopk_group(workers: list, grads: list[Tensor]) -> tuple[Tensor, list[ReduceRecord]]:
    """gTop-k: the ranks' k-entry sets merged along ``algorithm``'s schedule; ``putback``
    index (the paper's rule) or exact (the ranks' acc summed at the final indices by
    recursive doubling)."""
    P, m = len(grads), grads[0].numel()
    w0 = workers[0]
    k = k_for(w0.density, m)
    recs = [ReduceRecord() for _ in workers]
    accs, sels = _select(workers, grads, k, recs)
    track = w0.diagnostics and w0.putback == "index"
    drops: list[tuple[int, Sparse]] = []  # (owner rank, entries its merge dropped)

    def combine(a: Sparse, b: Sparse, rank: int) -> Sparse:
        t0 = _now(a[0])
        dropped: list | None = [] if track else None
        out = merge(*a, *b, k, dropped)
        if dropped:
            drops.append((rank, dropped[0]))
        recs[rank].t_merge += _now(a[0]) - t0
        return out

    schedule = tree_reduce_local if w0.algorithm == "tree" else recursive_doubling_local
    final_idx, final_val = schedule([(sel, acc[sel]) for acc, sel in zip(accs, sels)], combine)
    if w0.putback == "exact":
        final_val = recursive_doubling_local([acc[final_idx] for acc in accs], lambda a, b, _: a + b)
        for acc, rec in zip(accs, recs):
            _timed(rec, acc.__setitem__, final_idx, 0)
    else:
        for acc, sel, rec in zip(accs, sels, recs):
            _timed(rec, acc.__setitem__, sel[member_mask(final_idx, sel)], 0)
    update = torch.zeros_like(accs[0])
    update[final_idx] = final_val / P
    lost = [0.0] * P
    for rank, (idx, val) in drops:  # each rank's owned merges in the order it makes them
        lost[rank] += float(val[member_mask(final_idx, idx)].abs().sum())
    for rank, rec in enumerate(recs):
        rec.set_traffic(gtopk_traffic(rank, P, k, m, w0.algorithm, w0.putback))
    _diagnose(workers, recs, final_idx.numel(), lost)
    return update, recs
