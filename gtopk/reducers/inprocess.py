"""P ranks' ``reduce`` computed in one process (``cluster=simulated``); all local.

``Reducer.reduce_group(workers, grads)`` of dense, Top-k and gTop-k calls these (Ok-Topk's
is ``gtopk.reducers.oktopk.group``, on ``residual_rows``; the hook baselines' is
``gtopk.simulated.hooks``): ``workers[i]`` is rank i's reducer
(settings, error-feedback residual, ``diagnostics``) and ``grads[i]`` its flat gradient.
They return the update every rank's ``reduce`` returns and each rank's ``ReduceRecord``,
and leave each worker's residual as that rank's ``reduce`` leaves it.

The sparse paths use the distributed reducers' own kernels (their ``Selector``'s
``pick_rows`` over all ranks' residuals held as one matrix: ``selection.topk_rows`` for
``selection=exact``, ``pick`` row by row for ``sampled``; ``sparse.merge`` / ``keep_topk`` /
``member_mask``), the same schedules run over a list
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
from gtopk.reducers.costmodel import dense_traffic, gtopk_traffic, topk_traffic
from gtopk.reducers.outcome import ReduceRecord
from gtopk.reducers.schedules import recursive_doubling_local, tree_reduce_local
from gtopk.reducers.selection import Picks
from gtopk.reducers.selection.exact import k_for
from gtopk.reducers.sparse import keep_topk, member_mask, merge

Sparse = tuple[Tensor, Tensor]


def _diagnose(workers: list, recs: list[ReduceRecord], nnz: int, lost: list[float] | None = None) -> None:
    """Fill the diagnostics of every rank's record (when the reducers ask for them)."""
    if not workers[0].diagnostics:
        return
    residuals = [getattr(getattr(w, "feedback", None), "residual", None) for w in workers]
    matrix = None if residuals[0] is None else _rows_of(residuals)
    if matrix is not None:
        norms = torch.linalg.vector_norm(matrix, dim=1).tolist()  # every rank's at once
    else:
        norms = [0.0 if r is None else float(torch.linalg.vector_norm(r)) for r in residuals]
    for i, rec in enumerate(recs):
        rec.update_nnz = nnz
        rec.residual_norm = norms[i]
        rec.lost_l1 = 0.0 if lost is None else lost[i]


def _select(
    workers: list, grads: list[Tensor], k: int, recs: list[ReduceRecord], accumulated: bool = False
) -> tuple[Tensor, Picks]:
    """Each rank's accumulated vector (its residual buffer, ``acc = residual + grad`` as
    ``ErrorFeedback.accumulate`` computes it) and message, for all ranks at once: the
    residuals are the rows of one [P, m] matrix (``residual_rows``), returned, and the
    messages are ``Selector.pick_rows`` over it ([P, k] each: ``topk_rows`` for
    ``selection=exact``). Each rank's ``t_compr`` gets an equal share of the time."""
    t0 = _now(grads[0])
    acc = residual_rows(workers, grads, accumulated)
    picks = workers[0].selector.pick_rows(acc, k)
    share = (_now(grads[0]) - t0) / len(workers)
    for rec, n in zip(recs, picks.counts()):
        rec.selected = n
        rec.t_compr += share
    return acc, picks


def _rows_of(tensors: list[Tensor]) -> Tensor | None:
    """The [P, m] matrix whose rows ``tensors`` are (views, in order), or None."""
    base = tensors[0]._base
    if base is None or base.dim() != 2 or base.shape[0] != len(tensors) or not base.is_contiguous():
        return None
    return base if all(t._base is base and t.data_ptr() == base[i].data_ptr() for i, t in enumerate(tensors)) else None


def residual_matrix(workers: list) -> Tensor | None:
    """The [P, m] matrix whose rows are the workers' error-feedback residuals (as the
    reduce leaves them after its first step), or None (no residuals, or not held so)."""
    feedbacks = [getattr(w, "feedback", None) for w in workers]
    if any(f is None or f.residual is None for f in feedbacks):
        return None
    return _rows_of([f.residual for f in feedbacks])


def residual_rows(workers: list, grads: list[Tensor], accumulated: bool = False) -> Tensor:
    """``acc``: every rank's ``feedback.accumulate(grads[i])`` (residual + gradient, into the
    residual buffer), with the residuals made the rows of one [P, m] matrix first (once:
    a restored checkpoint's separate tensors are copied in again). Returns that matrix.
    ``accumulated``: the gradients were already added into ``residual_matrix`` (the
    batched pass's ``accumulate``); ``grads`` only give the shapes."""
    if accumulated:
        acc = residual_matrix(workers)
        if acc is None:
            raise ValueError("accumulated=True needs the residuals held as one matrix (residual_matrix)")
        return acc
    feedbacks = [w.feedback for w in workers]
    if all(f.residual is None for f in feedbacks):
        acc = torch.stack([g.detach() for g in grads])  # the first step: acc = grad
    else:
        acc = _rows_of([f.residual for f in feedbacks])
        if acc is None:
            acc = torch.stack([f.residual for f in feedbacks])
        matrix = _rows_of(grads)
        if matrix is not None:
            acc.add_(matrix)
        else:
            for row, g in zip(acc, grads):
                row.add_(g)
    for f, row in zip(feedbacks, acc):
        f.residual = row
    return acc


def _doubling_sum(rows: Tensor) -> Tensor:
    """``recursive_doubling_local`` of the rows of ``rows`` [P, n] with ``a + b``, one
    vectorised add per round: the same operand pairs, so the same bits."""
    P = rows.shape[0]
    P2 = 1 << (P.bit_length() - 1)
    cur = rows.clone()
    if P > P2:
        cur[: P - P2] += cur[P2:P]
    step = 1
    while step < P2:
        cur[0 : P2 : 2 * step] += cur[step : P2 : 2 * step]
        step *= 2
    return cur[0]


def _now(t: Tensor) -> float:
    """The time once the work queued on ``t``'s device is done (``gtopk.host.Clock``)."""
    return Clock(t.device)()


def _timed(rec: ReduceRecord, fn, *args) -> None:
    t0 = _now(args[0])
    fn(*args)
    rec.t_compr += _now(args[0]) - t0


def dense_group(workers: list, grads: list[Tensor], accumulated: bool = False) -> tuple[Tensor, list[ReduceRecord]]:
    """Dense: the P gradients summed in rank order, / P (no residuals: ``accumulated`` must be False)."""
    if accumulated:
        raise ValueError("dense keeps no residuals: its gradients cannot have been accumulated into them")
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


def topk_group(workers: list, grads: list[Tensor], accumulated: bool = False) -> tuple[Tensor, list[ReduceRecord]]:
    """Top-k: every rank's k entries scatter-added in rank order, / P (``reselect``: the k
    largest of the sum; each rank puts back its selected values outside them).
    ``accumulated``: as ``residual_rows``."""
    P, m = len(grads), grads[0].numel()
    k = k_for(workers[0].density, m)
    recs = [ReduceRecord() for _ in workers]
    matrix, picks = _select(workers, grads, k, recs, accumulated)
    accs, sels = list(matrix.unbind(0)), list(picks.idx.unbind(0))
    owns = [picks.own(i) for i in range(P)]  # the selected entries (no padding)
    parts = list(zip(sels, picks.val.unbind(0)))
    summed = torch.zeros_like(accs[0])
    for idx, val in parts:  # rank order, as TopKReducer sums the gathered parts
        summed.index_add_(0, idx, val)
    union = torch.unique(torch.cat(sels), sorted=True)
    if workers[0].reselect:
        final_idx, final_val = keep_topk(union, summed[union], k)
        update = summed.zero_()
        update[final_idx] = final_val / P
        for acc, own, rec in zip(accs, owns, recs):
            _timed(rec, acc.__setitem__, own[member_mask(final_idx, own)], 0)
        nnz = final_idx.numel()
    else:
        update = summed.div_(P)
        for acc, own, rec in zip(accs, owns, recs):
            _timed(rec, acc.__setitem__, own, 0)
        nnz = union.numel()
    for rec in recs:
        rec.set_traffic(topk_traffic(P, k, m))
    _diagnose(workers, recs, nnz)
    return update, recs


def gtopk_group(workers: list, grads: list[Tensor], accumulated: bool = False) -> tuple[Tensor, list[ReduceRecord]]:
    """gTop-k: the ranks' k-entry sets merged along ``algorithm``'s schedule; ``putback``
    index (the paper's rule) or exact (the ranks' acc summed at the final indices by
    recursive doubling). ``accumulated``: as ``residual_rows``."""
    P, m = len(grads), grads[0].numel()
    w0 = workers[0]
    k = k_for(w0.density, m)
    recs = [ReduceRecord() for _ in workers]
    matrix, picks = _select(workers, grads, k, recs, accumulated)
    sel_rows = picks.idx
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
    values = picks.val  # [P, k]: each rank's selected values (0.0 at padding)
    final_idx, final_val = schedule(list(zip(sel_rows.unbind(0), values.unbind(0))), combine)
    t0 = _now(matrix)
    if w0.putback == "exact":
        final_val = _doubling_sum(matrix[:, final_idx])
        matrix[:, final_idx] = 0
    else:  # each rank clears its selected entries that the final set applied, keeps the rest
        applied = member_mask(final_idx, sel_rows.reshape(-1)).view_as(sel_rows)
        if picks.pad is not None:  # padding was not selected: its rank keeps it
            applied &= ~picks.pad
        matrix[applied.nonzero(as_tuple=True)[0], sel_rows[applied]] = 0
    share = (_now(matrix) - t0) / P
    for rec in recs:
        rec.t_compr += share
    update = torch.zeros_like(matrix[0])
    update[final_idx] = final_val / P
    lost = [0.0] * P
    for rank, (idx, val) in drops:  # each rank's owned merges in the order it makes them
        lost[rank] += float(val[member_mask(final_idx, idx)].abs().sum())
    for rank, rec in enumerate(recs):
        rec.set_traffic(gtopk_traffic(rank, P, k, m, w0.algorithm, w0.putback))
    _diagnose(workers, recs, final_idx.numel(), lost)
    return update, recs
