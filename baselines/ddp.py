"""torch DistributedDataParallel as a reducer: the strongest dense baseline.

DDP all-reduces gradients in buckets while backward runs (overlap), so by the time the
loop calls ``reduce`` the gradient is already averaged: ``reduce`` returns it unchanged
and its communication time is hidden inside t_compute. Select with ``reducer=ddp``.
"""

from __future__ import annotations

import warnings

from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from gtopk.host import Clock
from gtopk.reducers.base import ReduceRecord
from gtopk.reducers.costmodel import dense_traffic
from gtopk.reducers.dense import DenseReducer


class DDPReducer(DenseReducer):
    """Collective work happens in DDP's backward hooks (``all_reduce`` per bucket); the
    record reports the same nominal ring traffic as ``DenseReducer``."""

    #: the model (gtopk.perf.model) takes max(t_compute, t_commu) instead of their sum
    overlaps_backward = True

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.world_size == 1:
            return model
        with warnings.catch_warnings():  # broadcast_buffers' deprecation notice; we want no syncing
            warnings.simplefilter("ignore", FutureWarning)
            # BN statistics stay per rank, as in the paper (buffers were broadcast at start)
            return DistributedDataParallel(
                model, bucket_cap_mb=self.bucket_mb, process_group=self.group, broadcast_buffers=False
            )

    def _reduce(self, grad: Tensor, rec: ReduceRecord, clock: Clock) -> Tensor:
        rec.selected = grad.numel()
        rec.set_traffic(dense_traffic(self.world_size, self.bucket_sizes(grad.numel())))
        return grad
