"""Top-k S-SGD: all-gather of every worker's local top-k."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from gtopk.host import Clock
from gtopk.reducers import reference
from gtopk.reducers.base import SparseReducer
from gtopk.reducers.costmodel import Network, topk_time, topk_traffic
from gtopk.reducers.outcome import ReduceRecord
from gtopk.reducers.selection import Selector
from gtopk.reducers.selection.exact import k_for
from gtopk.reducers.selection.sampled import MAX_REFINE, SAMPLE_RATIO
from gtopk.reducers.sparse import keep_topk, member_mask
from gtopk.reducers.wire import SparseCodec


class TopKReducer(SparseReducer):
    """Local exact top-k of |residual + grad| with error feedback, then one
    ``dist.all_gather`` (collective) of k packed (int32 index, float32 value) entries per
    rank; the P sets are scatter-added in rank order and divided by P.

    ``reselect=False``: the update has up to k*P nonzeros; each worker keeps its
    unselected entries. ``reselect=True`` ("select k from k*P"): only the k largest |value|
    of the sum are applied; each worker puts back its selected values outside that set.
    Semantics: ``gtopk.reducers.reference.topk``. Traffic in the record is nominal
    (recursive-doubling all-gather, see gtopk.reducers.costmodel).

    ``selection``: ``exact`` (the k largest) or ``sampled`` (DGC's sampled threshold, at
    most k selected, the message padded to k: ``gtopk.reducers.selection``).
    """

    display_name = "Top-k"
    plot_order = 50

    def reference(self, grads: list[Tensor], residuals: list[Tensor | None] | None = None):
        """Local. ``gtopk.reducers.reference.topk`` of residual + gradient, these settings
        (the exact selection's semantics)."""
        accs = [g if r is None else r + g for g, r in zip(grads, residuals or [None] * len(grads))]
        return reference.topk(accs, k_for(self.density, grads[0].numel()), reselect=self.reselect)

    def __init__(
        self,
        density: float,
        reselect: bool = False,
        group: dist.ProcessGroup | None = None,
        align_timing: bool = False,
        selection: str = "exact",
        sample_ratio: float = SAMPLE_RATIO,
        max_refine: int = MAX_REFINE,
    ):
        self.selector = Selector(selection, sample_ratio, max_refine)  # gtopk.reducers.selection
        super().__init__(density, group, align_timing)
        self.reselect = bool(reselect)
        self.selection = selection

    @classmethod
    def predict_commu(cls, P: int, m: int, net: Network, density: float = 0.001, **_) -> float:
        """Recursive-doubling all-gather of k (index, value) entries per rank."""
        return topk_time(P, k_for(density, m), m, net)

    def _reduce(self, grad: Tensor, rec: ReduceRecord, clock: Clock, out: Tensor | None = None) -> Tensor:
        P, m = self.world_size, grad.numel()
        k = k_for(self.density, m)
        t0 = clock()
        acc = self.feedback.accumulate(grad)
        picks = self.selector.pick(acc, k)  # k entries on the wire; ``own``: the selected ones
        sel, vals, own = picks.idx, picks.val, picks.own()
        t1 = clock()
        t1c = self._commu_start(clock)
        codec = SparseCodec(k, m, grad.device)
        mine = codec.pack(sel, vals)
        bufs = [mine] if P == 1 else [codec.empty() for _ in range(P)]
        if P > 1:
            dist.all_gather(bufs, mine, group=self.group)
        parts = [codec.unpack(b) for b in bufs]
        t2 = self._commu_end(clock)  # every rank holds every rank's k entries: the collective is done
        # the gradient is in acc (the residual) by now: ``out`` may be the gradient's buffer
        summed = torch.zeros_like(acc) if out is None else out.zero_()
        for idx, val in parts:  # rank order; indices are unique within a part
            summed.index_add_(0, idx, val)
        if self.reselect:
            union = torch.unique(torch.cat([idx for idx, _ in parts]), sorted=True)
            final_idx, final_val = keep_topk(union, summed[union], k)
            update = summed.zero_()
            update[final_idx] = final_val / P
        else:
            update = summed.div_(P)
        t3 = clock()
        if self.reselect:
            acc[own[member_mask(final_idx, own)]] = 0
        else:
            acc[own] = 0
        t4 = clock()
        traffic = topk_traffic(P, k, m)
        rec.selected = own.numel()
        rec.set_traffic(traffic)
        rec.t_compr = (t1 - t0) + (t4 - t3)
        rec.t_commu = t2 - t1c
        if self.diagnostics:  # from what this rank holds (the training loop counts it in t_update)
            rec.update_nnz = (final_idx if self.reselect else torch.unique(torch.cat([i for i, _ in parts]))).numel()
            rec.residual_norm, rec.lost_l1 = float(torch.linalg.vector_norm(acc)), 0.0
        return update

    simulatable = True

    @classmethod
    def reduce_group(cls, workers, grads, accumulated=False):
        """Local: ``gtopk.reducers.inprocess.topk_group``."""
        from gtopk.reducers.inprocess import topk_group  # here: that module imports this package

        return topk_group(workers, grads, accumulated)
