"""Ok-Topk's P ranks in one process (``cluster=simulated``); all local.

``oktopk_group(workers, grads)`` returns what every rank's ``OkTopKReducer.reduce``
returns in a group of P = len(workers) ranks and leaves each worker's state (residual,
thresholds, regions, step) as that rank's ``reduce`` leaves it, bit for bit: the same
kernels (``gtopk.reducers.oktopk.regions``, ``topk_rows`` = ``topk_indices`` row by row),
every index's sum taken in rank order as the region owners take it, the same global
selection on the same entries. Records: ``selected`` and the traffic each rank would send
(``oktopk_cost.rank_traffic``, from the step's counts: what the distributed records count),
``payload_bytes``, ``t_compr`` and ``t_merge`` as equal shares of the work, no ``t_commu``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gtopk.host import Clock
from gtopk.reducers.inprocess import residual_rows
from gtopk.reducers.oktopk.cost import rank_traffic
from gtopk.reducers.oktopk.regions import boundaries, passing, quantiles, select_global, split, threshold_of
from gtopk.reducers.outcome import ReduceRecord
from gtopk.reducers.selection.exact import k_for, topk_indices
from gtopk.reducers.sparse import member_mask


def _counts(sel: Tensor, bounds: Tensor) -> list[int]:
    cuts = split(sel, bounds)
    return [b - a for a, b in zip(cuts[:-1], cuts[1:])]


def oktopk_group(workers: list, grads: list[Tensor], accumulated: bool = False) -> tuple[Tensor, list[ReduceRecord]]:
    """Ok-Topk over P ranks' gradients in one process. ``accumulated``: the gradients are
    already in the ranks' residuals, held as one matrix (``gtopk.reducers.inprocess.residual_matrix``)."""
    P, m, w0 = len(grads), grads[0].numel(), workers[0]
    clock = Clock(grads[0].device)
    k = k_for(w0.density, m)
    exact, new_regions = w0.exact_step(k), w0.boundary_step()
    recs = [ReduceRecord() for _ in workers]
    t0 = clock()
    acc = residual_rows(workers, grads, accumulated)  # [P, m]: row i is rank i's residual buffer
    if exact:  # ``Selector.pick_rows``: row i is what rank i's ``select_local`` selects
        picks = w0.selector.pick_rows(acc, k)
        sels = [picks.own(i) for i in range(P)]
        sels = [s if s.numel() else topk_indices(a, k) for s, a in zip(sels, acc)]
        locals_ = [threshold_of(a[s]) for a, s in zip(acc, sels)]
    else:
        locals_ = [w.local_threshold for w in workers]
        sels = [passing(a, th) for a, th in zip(acc, locals_)]
    t1 = clock()
    bounds = w0.bounds
    if new_regions:
        bounds = boundaries(torch.stack([quantiles(s, P, m) for s in sels]).sum(0), P, m)
    summed = torch.zeros(m, dtype=torch.float32, device=acc.device)
    present = torch.zeros(m, dtype=torch.bool, device=acc.device)
    for row, sel in zip(acc, sels):  # rank order, as every region's owner adds its parts
        summed.index_add_(0, sel, row[sel])
        present[sel] = True
    union = torch.nonzero(present).squeeze(1)
    (final_idx, final_val), glob = select_global(union, summed[union], k, w0.global_threshold, exact)
    t2 = clock()
    for row, sel in zip(acc, sels):
        row[sel[member_mask(final_idx, sel)]] = 0
    update = torch.zeros_like(summed)
    update[final_idx] = final_val / P
    t3 = clock()
    counts = [_counts(sel, bounds) for sel in sels]
    sizes = _counts(union if exact else final_idx, bounds)
    boundary_step = new_regions and P > 1
    for rank, (w, rec, sel, local) in enumerate(zip(workers, recs, sels, locals_)):
        traffic, wire = rank_traffic(rank, P, m, counts, sizes, boundary_step)
        rec.set_traffic(traffic)
        rec.selected, rec.payload_bytes = sel.numel(), wire.payload
        rec.t_compr = ((t1 - t0) + (t3 - t2)) / P
        rec.t_merge = (t2 - t1) / P
        w.advance(k, local, glob, bounds)
        w.wire = wire
        if w.diagnostics:  # lossless: nothing dropped
            rec.update_nnz, rec.lost_l1 = final_idx.numel(), 0.0
            rec.residual_norm = float(torch.linalg.vector_norm(acc[rank]))
    return update, recs
