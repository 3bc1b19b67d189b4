"""Dense S-SGD: bucketed all-reduce of the full gradient."""

from __future__ import annotations

import torch.distributed as dist
from torch import Tensor

from gtopk.host import Clock
from gtopk.reducers import reference
from gtopk.reducers.base import Reducer
from gtopk.reducers.costmodel import VALUE_BYTES, Network, dense_time, dense_traffic
from gtopk.reducers.outcome import ReduceRecord


def bucket_numel(bucket_mb: float) -> int:
    return max(1, int(bucket_mb * 2**20) // VALUE_BYTES)


def bucket_sizes(m: int, numel: int) -> list[int]:
    """Sizes of the all-reduce buckets of an m-entry gradient (the last one shorter)."""
    return [min(numel, m - s) for s in range(0, m, numel)]


class DenseReducer(Reducer):
    """``update = all_reduce(grad) / P``, issued as asynchronous all-reduces over buckets
    of ``bucket_mb`` MiB (the last one shorter). Collective: ``dist.all_reduce`` per bucket.

    Traffic in the record is nominal: a ring all-reduce per bucket (see gtopk.reducers.costmodel).
    Every entry is sent: ``density`` reads 1.0 (setting it only validates the value), and
    there is no state (``state_dict()`` is ``{}``). With one worker the update is the gradient.
    """

    display_name = "dense"
    plot_order = 10
    exact_average = True
    simulatable = True

    def __init__(self, bucket_mb: float = 25.0, group: dist.ProcessGroup | None = None, align_timing: bool = False):
        if not bucket_mb > 0:  # settings first (gtopk.run.checks builds reducers in the parent)
            raise ValueError(f"reducer.bucket_mb={bucket_mb!r} must be > 0 (MiB per bucket), e.g. 25")
        super().__init__(group, align_timing)
        self.bucket_mb = bucket_mb
        self.bucket_numel = bucket_numel(bucket_mb)

    def bucket_sizes(self, m: int) -> list[int]:
        return bucket_sizes(m, self.bucket_numel)

    @classmethod
    def predict_commu(cls, P: int, m: int, net: Network, bucket_mb: float = 25.0, **_) -> float:
        """Ring all-reduce per bucket, buckets one after another."""
        return dense_time(P, bucket_sizes(m, bucket_numel(bucket_mb)), net)

    def reference(self, grads: list[Tensor], residuals: list[Tensor | None] | None = None):
        """Local. ``gtopk.reducers.reference.dense``: the mean of the gradients, nothing kept."""
        return reference.dense(grads)

    def _reduce(self, grad: Tensor, rec: ReduceRecord, clock: Clock, out: Tensor | None = None) -> Tensor:
        t0 = self._commu_start(clock)
        # the all-reduce runs in place on ``out``: a copy of the gradient, unless ``out`` is the
        # gradient itself (the training loop's flat gradient buffer, refilled every step)
        if out is None:
            out = grad.detach().clone()
        elif out is not grad:
            out.copy_(grad)
        if self.world_size > 1:
            works = [dist.all_reduce(b, group=self.group, async_op=True) for b in out.split(self.bucket_numel)]
            for w in works:
                w.wait()
            out.div_(self.world_size)
        t1 = self._commu_end(clock)
        rec.selected = out.numel()
        rec.set_traffic(dense_traffic(self.world_size, self.bucket_sizes(out.numel())))
        rec.t_commu = t1 - t0
        if self.diagnostics:  # every entry applied, nothing kept back or lost
            rec.update_nnz, rec.residual_norm, rec.lost_l1 = out.numel(), 0.0, 0.0
        return out

    @classmethod
    def reduce_group(cls, workers, grads, accumulated=False):
        """Local: ``gtopk.reducers.inprocess.dense_group``."""
        from gtopk.reducers.inprocess import dense_group  # here: that module imports this package

        return dense_group(workers, grads, accumulated)
