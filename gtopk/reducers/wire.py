"""Wire format of sparse messages and counted point-to-point calls.

A sparse message of k entries is one uint8 buffer: k indices (int32, or int64 when the
model has 2^31 entries or more) followed by k float32 values, 8 bytes per entry.
Buffers stay on the gradient's device (CPU for gloo, CUDA for NCCL).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from gtopk.reducers.base import ReduceRecord
from gtopk.reducers.costmodel import index_bytes


class SparseCodec:
    """Packs (indices, values) of exactly k entries for a model of m entries."""

    def __init__(self, k: int, m: int, device: torch.device):
        self.k = k
        self.index_dtype = torch.int32 if index_bytes(m) == 4 else torch.int64
        self.index_nbytes = k * index_bytes(m)
        self.nbytes = self.index_nbytes + 4 * k
        self.device = device

    def pack(self, idx: Tensor, val: Tensor) -> Tensor:
        return torch.cat([idx.to(self.index_dtype).view(torch.uint8), val.view(torch.uint8)])

    def pack_indices(self, idx: Tensor) -> Tensor:
        return idx.to(self.index_dtype).view(torch.uint8)

    def unpack(self, buf: Tensor) -> tuple[Tensor, Tensor]:
        idx = buf[: self.index_nbytes].view(self.index_dtype).long()
        val = buf[self.index_nbytes :].view(torch.float32)
        return idx, val

    def unpack_indices(self, buf: Tensor) -> Tensor:
        return buf[: self.index_nbytes].view(self.index_dtype).long()

    def empty(self, nbytes: int | None = None) -> Tensor:
        return torch.empty(self.nbytes if nbytes is None else nbytes, dtype=torch.uint8, device=self.device)


class PointToPoint:
    """Blocking point-to-point calls within a group, counted into a ReduceRecord.

    Ranks are group ranks; ``to_global`` maps them to the global ranks torch needs.
    Every method is one half of a matched pair: the peer must make the mirror call.
    """

    def __init__(self, rec: ReduceRecord, to_global, group: dist.ProcessGroup | None):
        self.rec = rec
        self.to_global = to_global
        self.group = group

    def send(self, buf: Tensor, dst: int) -> None:
        dist.send(buf, dst=self.to_global(dst), group=self.group)
        self.rec.messages_sent += 1
        self.rec.bytes_sent += buf.numel() * buf.element_size()

    def recv(self, buf: Tensor, src: int) -> Tensor:
        dist.recv(buf, src=self.to_global(src), group=self.group)
        self.rec.bytes_recv += buf.numel() * buf.element_size()
        return buf

    def exchange(self, sendbuf: Tensor, recvbuf: Tensor, peer: int) -> Tensor:
        """Send to and receive from ``peer`` at once (both ranks call exchange)."""
        ops = [
            dist.P2POp(dist.isend, sendbuf, self.to_global(peer), self.group),
            dist.P2POp(dist.irecv, recvbuf, self.to_global(peer), self.group),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        self.rec.messages_sent += 1
        self.rec.bytes_sent += sendbuf.numel() * sendbuf.element_size()
        self.rec.bytes_recv += recvbuf.numel() * recvbuf.element_size()
        return recvbuf
