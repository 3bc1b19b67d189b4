"""torch DistributedDataParallel as a reducer: the strongest dense baseline.

DDP all-reduces gradients in buckets while backward runs (overlap), so by the time the
loop calls ``reduce`` the gradient is already averaged: ``reduce`` returns it unchanged
and its communication time is hidden inside t_compute. Select with ``reducer=ddp``.
"""

from __future__ import annotations

import warnings

import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from gtopk.costmodel import VALUE_BYTES, dense_traffic
from gtopk.reducers.base import Clock, ReduceRecord, Reducer


class DDPReducer(Reducer):
    """Collective work happens in DDP's backward hooks (``all_reduce`` per bucket)."""

    def __init__(self, bucket_mb: float = 25.0, group: dist.ProcessGroup | None = None):
        super().__init__(group)
        if not bucket_mb > 0:
            raise ValueError(f"reducer.bucket_mb={bucket_mb!r} must be > 0 (MiB per DDP bucket), e.g. 25")
        self.bucket_mb = bucket_mb

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.world_size == 1:
            return model
        with warnings.catch_warnings():  # broadcast_buffers' deprecation notice; we want no syncing
            warnings.simplefilter("ignore", FutureWarning)
            # BN statistics stay per rank, as in the paper (buffers were broadcast at start)
            return DistributedDataParallel(model, bucket_cap_mb=self.bucket_mb, process_group=self.group,
                                           broadcast_buffers=False)

    def _reduce(self, grad: Tensor, rec: ReduceRecord, clock: Clock) -> Tensor:
        n = max(1, int(self.bucket_mb * 2**20) // VALUE_BYTES)
        m = grad.numel()
        traffic = dense_traffic(self.world_size, [min(n, m - s) for s in range(0, m, n)])
        rec.selected = m
        rec.messages_sent, rec.bytes_sent, rec.bytes_recv = (
            traffic.messages_sent, traffic.bytes_sent, traffic.bytes_recv)
        return grad
