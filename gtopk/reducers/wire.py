"""Wire format of sparse messages and counted point-to-point calls.

A sparse message of k entries is one uint8 buffer: k indices (int32, or int64 when the
model has 2^31 entries or more) followed by k float32 values, 8 bytes per entry.
Buffers stay on the gradient's device (CPU for gloo, CUDA for NCCL).

**Receives posted early.** gloo's TCP transport sends a message only once its receiver
has posted the receive (a "ready to receive" notice travels first): a receive posted when
the data is already due costs the message a second trip between the two ranks and a
wake-up of the sender's network thread. ``PointToPoint.post_recv`` therefore posts a
receive of CPU tensors (gloo) at once, so that a schedule can post each round's receive
before the round (``gtopk.reducers.schedules``); ``wait`` completes it. For CUDA tensors
(NCCL) the receive is made when it is waited for, as a plain ``recv`` or inside an
``exchange``'s batch: NCCL runs the operations between two ranks in order, so a receive
posted ahead of a send to the same peer would hold that send back.

**Transport.** With a ``SocketTransport`` (``gtopk.reducers.transport``: the CPU's
default, ``transport=auto``) the messages of CPU tensors travel over its sockets, in the
same bytes, instead of gloo's pairs: a send needs no posted receive and no network thread.
Without one (CUDA, or ``transport=backend``) they are ``torch.distributed``'s calls.

**Tracing** (``RoundTrace``, off by default): with a trace, every call appends its events,
read on the rank's clock (``gtopk.host.Clock``: ``time.perf_counter``, the host's monotonic
clock, shared by every process of one machine; virtual seconds under time dilation).
Without one (``trace=None``) nothing is read or recorded: one attribute test per call.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from gtopk.host import Clock
from gtopk.reducers.costmodel import index_bytes
from gtopk.reducers.outcome import ReduceRecord
from gtopk.reducers.transport import SocketTransport


class SparseCodec:
    """Packs (indices, values) of exactly k entries for a model of m entries.

    ``pack``/``unpack`` take and give torch tensors. ``item``/``encode``/``decode``/
    ``tensors`` are what a schedule's rounds use: on the CPU a sparse vector travels the
    rounds as NumPy arrays (the merge's own kind, ``gtopk.reducers.sparse.merge``; a
    received message is decoded to views of its buffer, indices as sent), so that a round
    converts nothing between torch and NumPy; elsewhere as torch tensors."""

    def __init__(self, k: int, m: int, device: torch.device):
        self.k = k
        self.index_dtype = torch.int32 if index_bytes(m) == 4 else torch.int64
        self.index_nbytes = k * index_bytes(m)
        self.nbytes = self.index_nbytes + 4 * k
        self.device = torch.device(device)
        self.arrays = self.device.type == "cpu"

    @property
    def _np_index(self) -> type:
        return np.int32 if self.index_dtype == torch.int32 else np.int64

    def item(self, idx: Tensor, val: Tensor) -> tuple:
        """A sparse vector (tensors) as the rounds carry it."""
        return (idx.detach().numpy(), val.detach().numpy()) if self.arrays else (idx, val)

    @staticmethod
    def tensors(item: tuple) -> tuple:
        """What the rounds gave back, as tensors (int64 indices; None stays None)."""
        return tuple(torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in item)

    def encode(self, item: tuple) -> Tensor:
        """One message of an item (``item``'s kind)."""
        if not isinstance(item[0], np.ndarray):
            return self.pack(*item)
        buf = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
        out = buf.numpy()
        out[: self.index_nbytes].view(self._np_index)[:] = item[0]  # the cast on the way
        out[self.index_nbytes :].view(np.float32)[:] = item[1]
        return buf

    def decode(self, buf: Tensor) -> tuple:
        """The item a message carries (views of ``buf`` on the CPU)."""
        if not self.arrays:
            return self.unpack(buf)
        b = buf.numpy()
        return b[: self.index_nbytes].view(self._np_index), b[self.index_nbytes :].view(np.float32)

    def encode_indices(self, item: tuple) -> Tensor:
        """One message of an item's indices alone."""
        idx = item[0]
        return self.pack_indices(torch.from_numpy(idx) if isinstance(idx, np.ndarray) else idx)

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


#: the kinds of a ``RoundTrace``'s events: (seconds, kind, a, b)
START, END = "start", "end"  # the collective begins / every rank holds its result (a = b = 0)
ROUND = "round"  # a schedule's round begins: a = its number in that schedule (``gtopk.reducers.schedules``)
POST_SEND, POST_RECV = "post_send", "post_recv"  # a message posted: a = peer (group rank), b = bytes
SENT, RECEIVED = "sent", "received"  # that message complete on this rank: a = peer, b = bytes
MERGED = "merged"  # a received item combined into this rank's (a gTop-k merge, a sum)


class RoundTrace:
    """One rank's events, in the order they happened: ``events`` holds (clock reading in
    seconds, kind, a, b) tuples (the kinds above). Local; a reducer or a schedule appends
    to it through ``PointToPoint``; ``gtopk.perf.trace`` analyses it."""

    __slots__ = ("clock", "events", "eager")

    def __init__(self, clock: Clock | None = None):
        self.clock = clock or Clock(torch.device("cpu"))
        self.events: list[tuple[float, str, int, int]] = []
        #: the messages went over a buffering transport (``SocketTransport``: a send waits for no
        #: receive), set by ``PointToPoint``; ``gtopk.perf.trace.critical_path``'s ``eager``
        self.eager = False

    def __call__(self, kind: str, a: int = 0, b: int = 0) -> None:
        self.events.append((self.clock(), kind, a, b))

    def take(self) -> list[tuple[float, str, int, int]]:
        """The events so far, which are then forgotten."""
        out, self.events = self.events, []
        return out


class Pending:
    """A posted receive (``PointToPoint.post_recv``): its buffer, source and, once posted
    to the backend, its work handle."""

    __slots__ = ("buf", "src", "work")

    def __init__(self, buf: Tensor, src: int, work=None):
        self.buf, self.src, self.work = buf, src, work


class PointToPoint:
    """Blocking point-to-point calls within a group, counted into a ReduceRecord.

    Ranks are group ranks; ``to_global`` maps them to the global ranks torch needs.
    Every method is one half of a matched pair: the peer must make the mirror call.
    ``trace``: a ``RoundTrace`` that every call appends its events to (None: nothing
    recorded).
    """

    def __init__(
        self,
        rec: ReduceRecord,
        to_global,
        group: dist.ProcessGroup | None,
        trace: RoundTrace | None = None,
        transport: SocketTransport | None = None,
    ):
        self.rec = rec
        self.to_global = to_global
        self.group = group
        self.trace = trace
        self.transport = transport
        if trace is not None and transport is not None:
            trace.eager = True
        self._early: dict[int, list[Pending]] = {}

    def post_early(self, receives: list[tuple[int, int]], new_buf) -> None:
        """Post these receives ((source, bytes), in the schedule's order) now, before the
        collective starts (a reducer calls it before its selection): the schedule's own
        ``post_recv`` of the same source and size then takes the posted one over. gloo
        sends only to a posted receive, and posting one costs its rank 30-50 us (a notice to
        the sender): posted before the selection, neither is on the collective's path."""
        for src, nbytes in receives:
            self._early.setdefault(src, []).append(self.post_recv(new_buf(nbytes), src))

    def early_left(self) -> int:
        """Receives posted early that the schedule did not take over (0 when they match)."""
        return sum(len(q) for q in self._early.values())

    def mark(self, kind: str, a: int = 0) -> None:
        """A schedule's event (``ROUND``, ``MERGED``) into the trace, if any."""
        if self.trace is not None:
            self.trace(kind, a)

    def send(self, buf: Tensor, dst: int) -> None:
        nbytes = buf.numel() * buf.element_size()
        if self.trace is not None:
            self.trace(POST_SEND, dst, nbytes)
        self._isend(buf, dst).wait()
        if self.trace is not None:
            self.trace(SENT, dst, nbytes)
        self.rec.messages_sent += 1
        self.rec.bytes_sent += nbytes

    def recv(self, buf: Tensor, src: int) -> Tensor:
        return self.wait(self.post_recv(buf, src))

    def post_recv(self, buf: Tensor, src: int) -> Pending:
        """Post a receive from ``src`` into ``buf`` (CPU tensors: at once; CUDA: when
        waited for, see the module's docstring); ``wait`` or ``exchange`` completes it.
        A receive of this source and size posted early (``post_early``) is taken instead."""
        early = self._early.get(src)
        if early and early[0].buf.numel() == buf.numel():
            return early.pop(0)
        pending = Pending(buf, src)
        if buf.device.type == "cpu":
            self._post(pending)
        return pending

    def _post(self, pending: Pending) -> None:
        if self.trace is not None:
            self.trace(POST_RECV, pending.src, pending.buf.numel() * pending.buf.element_size())
        if self.transport is not None and not pending.buf.is_cuda:
            pending.work = self.transport.irecv(pending.buf, pending.src)
        else:
            pending.work = dist.irecv(pending.buf, src=self.to_global(pending.src), group=self.group)

    def wait(self, pending: Pending) -> Tensor:
        """The buffer of a posted receive, once it holds the message."""
        if pending.work is None:
            self._post(pending)
        pending.work.wait()
        nbytes = pending.buf.numel() * pending.buf.element_size()
        if self.trace is not None:
            self.trace(RECEIVED, pending.src, nbytes)
        self.rec.bytes_recv += nbytes
        return pending.buf

    def exchange(self, sendbuf: Tensor, recvbuf: Tensor | Pending, peer: int) -> Tensor:
        """Send to and receive from ``peer`` at once (both ranks call exchange); the receive
        may have been posted already (``post_recv`` from ``peer``)."""
        pending = recvbuf if isinstance(recvbuf, Pending) else Pending(recvbuf, peer)
        nbytes = sendbuf.numel() * sendbuf.element_size()
        if self.trace is not None:
            self.trace(POST_SEND, peer, nbytes)
        if pending.work is None and sendbuf.device.type != "cpu":  # NCCL: both in one batch
            if self.trace is not None:
                self.trace(POST_RECV, peer, pending.buf.numel() * pending.buf.element_size())
            ops = [
                dist.P2POp(dist.isend, sendbuf, self.to_global(peer), self.group),
                dist.P2POp(dist.irecv, pending.buf, self.to_global(peer), self.group),
            ]
            works = dist.batch_isend_irecv(ops)
        else:
            if pending.work is None:
                self._post(pending)
            works = [self._isend(sendbuf, peer), pending.work]
        for work in works:
            work.wait()
        if self.trace is not None:
            self.trace(SENT, peer, nbytes)
            self.trace(RECEIVED, peer, pending.buf.numel() * pending.buf.element_size())
        self.rec.messages_sent += 1
        self.rec.bytes_sent += nbytes
        self.rec.bytes_recv += pending.buf.numel() * pending.buf.element_size()
        return pending.buf

    def _isend(self, buf: Tensor, dst: int):
        """A send posted to ``dst`` (the transport's for CPU tensors when there is one)."""
        if self.transport is not None and not buf.is_cuda:
            return self.transport.isend(buf, dst)
        return dist.isend(buf, dst=self.to_global(dst), group=self.group)

    def sendrecv(self, sendbuf: Tensor | None, dst: int, recvbuf: Tensor | None, src: int) -> None:
        """Send ``sendbuf`` to ``dst`` and receive into ``recvbuf`` from ``src`` at once (either
        may be None); ``dst`` and ``src`` make the mirror calls. Not counted: the caller counts."""
        some = sendbuf if sendbuf is not None else recvbuf
        if some is None:
            return
        if self.transport is not None and not some.is_cuda:
            works = [self.transport.irecv(recvbuf, src)] if recvbuf is not None else []
            works += [self.transport.isend(sendbuf, dst)] if sendbuf is not None else []
        else:
            ops = [dist.P2POp(dist.isend, sendbuf, self.to_global(dst), self.group)] if sendbuf is not None else []
            if recvbuf is not None:
                ops.append(dist.P2POp(dist.irecv, recvbuf, self.to_global(src), self.group))
            works = dist.batch_isend_irecv(ops)
        for work in works:
            work.wait()
