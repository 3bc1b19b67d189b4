"""Ok-Topk's collectives on plain ``torch.distributed``, counted (every function here is
collective over the reducer's group: every rank calls it, in the same order).

``Comm`` extends the counted point-to-point layer (``gtopk.reducers.wire.PointToPoint``)
with the rotation step and the two backend collectives Ok-Topk uses; it counts into the
``ReduceRecord`` what ``gtopk.reducers.oktopk.cost.rank_traffic`` states (backend
collectives as the rings gloo runs, point-to-point messages as sent) and into ``wire``
the bytes of the tensors it passed: entries, padding, metadata.

gloo's ``all_gather`` needs equal sizes on every rank (pytorch#156627) and fails on empty
tensors (pytorch#85234): blocks are padded to the common length L with (index -1, 0.0),
and nothing is gathered when no rank holds an entry.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from gtopk import host
from gtopk.reducers import native
from gtopk.reducers import transport as tcp
from gtopk.reducers.costmodel import dense_traffic
from gtopk.reducers.oktopk.cost import META_BYTES, Wire, count_bytes, entry_bytes, ring_gather
from gtopk.reducers.oktopk.regions import SENTINEL, Sparse, balance_plan, block_length, pad
from gtopk.reducers.outcome import ReduceRecord
from gtopk.reducers.wire import PointToPoint, SparseCodec


class Comm(PointToPoint):
    """One rank's side of Ok-Topk's communication in one ``reduce``."""

    def __init__(
        self,
        rec: ReduceRecord,
        to_global,
        group,
        P: int,
        rank: int,
        m: int,
        device: torch.device,
        transport=None,
        compiled: bool = False,
    ):
        super().__init__(rec, to_global, group, transport=transport)
        self.P, self.rank, self.m, self.device = P, rank, m, device
        #: the rotations' steps run as one compiled call on ``transport`` (``gtopk.reducers.native``)
        self.compiled = compiled and transport is not None
        self.entry = entry_bytes(m)
        #: counts travel as wide as an index (``oktopk_cost.count_bytes``)
        self.count_dtype = torch.int32 if count_bytes(m) == 4 else torch.int64
        self.wire = Wire()

    def _count(self, traffic, wire: Wire) -> None:
        self.rec.messages_sent += traffic.messages_sent
        self.rec.bytes_sent += traffic.bytes_sent
        self.rec.bytes_recv += traffic.bytes_recv
        self.wire = self.wire + wire

    def codec(self, n: int) -> SparseCodec:
        return SparseCodec(n, self.m, self.device)

    # -- backend collectives ------------------------------------------------------------
    def sum_meta(self, values: Tensor) -> Tensor:
        """Collective: the ranks' int64 ``values`` summed (a ring all-reduce, in place)."""
        dist.all_reduce(values, group=self.group)
        self._count(dense_traffic(self.P, [values.numel()], META_BYTES), Wire(meta=META_BYTES * values.numel()))
        return values

    def gather_counts(self, counts: list[int]) -> Tensor:
        """Collective: every rank's ``counts`` (same length), as rows [P, n]."""
        values = torch.tensor(counts, dtype=self.count_dtype, device=self.device)
        out = values.new_empty((self.P, values.numel()))
        dist.all_gather(list(out.unbind(0)), values, group=self.group)
        nbytes = values.numel() * values.element_size()
        self._count(ring_gather(self.P, nbytes), Wire(meta=nbytes))
        return out

    def gather_entries(self, idx: Tensor, val: Tensor, length: int) -> Sparse:
        """Collective: every rank's block of ``length`` entries (this rank's real ones
        ``(idx, val)``, padded), the real entries concatenated in rank order."""
        codec = self.codec(length)
        out = torch.empty((self.P, codec.nbytes), dtype=torch.uint8, device=self.device)
        dist.all_gather(list(out.unbind(0)), codec.pack(*pad(idx, val, length)), group=self.group)
        real = self.entry * idx.numel()
        self._count(ring_gather(self.P, codec.nbytes), Wire(payload=real, padding=codec.nbytes - real))
        at = codec.index_nbytes
        every_idx = out[:, :at].contiguous().view(codec.index_dtype).view(-1).long()
        every_val = out[:, at:].contiguous().view(torch.float32).view(-1)
        keep = every_idx != SENTINEL
        return every_idx[keep], every_val[keep]

    # -- point to point -----------------------------------------------------------------
    def rotate(self, outgoing: dict[int, Sparse], incoming: dict[int, int]) -> dict[int, Sparse]:
        """Collective: P - 1 rotation steps; in step s this rank sends ``outgoing[rank + s]``
        (if any) and receives ``incoming[rank - s]`` entries (if any), ranks mod P. Every
        pair agrees on what moves (both ends computed it), so empty messages are skipped.
        Returns what was received, by source."""
        P, me, got, moves = self.P, self.rank, {}, []
        for s in sorted({(d - me) % P for d in outgoing} | {(me - s) % P for s in incoming}):
            dst, src = (me + s) % P, (me - s) % P
            data = buf = None
            if dst in outgoing:
                data = self.codec(outgoing[dst][0].numel()).pack(*outgoing[dst])
                self._count_send(data)
            if src in incoming:
                buf = self.codec(incoming[src]).empty()
            if not self.compiled:
                self.sendrecv(data, dst, buf, src)
            moves.append((dst, data, src, buf))
        if self.compiled and moves:
            self._steps_compiled(moves)
        for _, _, src, buf in moves:
            if buf is not None:
                self.rec.bytes_recv += buf.numel()
                got[src] = self.codec(incoming[src]).unpack(buf)
        return got

    def _steps_compiled(self, moves: list) -> None:
        """The rotation's steps (dst, data, src, buffer) in one compiled call (``native.steps``)."""
        pace = host.pacing_state() if host.dilation() > 1 else None
        native.steps(
            self.transport.fds(), self.rank, [(d, t if t is None else t.numpy(), s, b if b is None else b.numpy())
                                              for d, t, s, b in moves],
            timeout_s=tcp.TIMEOUT_S, spin_s=native.spin_seconds(self.P), dilation=host.dilation(), pace=pace,
            threads=max(1, torch.get_num_threads()),
        )  # fmt: skip
        if pace is not None:
            host.set_pacing_state(pace)

    def _count_send(self, data: Tensor) -> None:
        self.rec.messages_sent += 1
        self.rec.bytes_sent += data.numel()
        self.wire = self.wire + Wire(payload=data.numel())

    # -- Ok-Topk's phases ---------------------------------------------------------------
    def split_and_reduce(self, parts: dict[int, Sparse], into: list[int]) -> list[Sparse]:
        """Collective: this rank's part of region r (``parts[r]``, non-empty ones only) goes
        to rank r; returns the non-empty parts of this rank's region, in rank order (its own
        included). ``into[i]``: the entries rank i has in this rank's region."""
        me = self.rank
        outgoing = {r: p for r, p in parts.items() if r != me}
        incoming = {i: n for i, n in enumerate(into) if i != me and n}
        got = self.rotate(outgoing, incoming)
        got.update({me: parts[me]} if me in parts else {})
        return [got[i] for i in sorted(got)]

    def gather_balanced(self, idx: Tensor, val: Tensor) -> Sparse:
        """Collective: the concatenation, in rank order, of every rank's (idx, val): the
        ranks' counts are gathered, the entries balanced into blocks of L = ceil(N / P)
        (``balance_plan``), and the blocks all-gathered (padded to L). Nothing is
        gathered when N = 0."""
        P, me = self.P, self.rank
        sizes = self.gather_counts([idx.numel()]).view(-1).tolist()
        N = sum(sizes)
        if N == 0:
            return idx, val
        outgoing, incoming, kept, placed = {}, {}, None, {}
        for src, dst, at_src, at_dst, n in balance_plan(sizes, P):
            piece = idx[at_src : at_src + n], val[at_src : at_src + n]
            if src == me and dst == me:
                kept, placed[at_dst] = piece, me
            elif src == me:
                outgoing[dst] = piece
            elif dst == me:
                incoming[src], placed[at_dst] = n, src
        got = self.rotate(outgoing, incoming)
        pieces = [kept if placed[at] == me else got[placed[at]] for at in sorted(placed)]  # block order
        mine = (torch.cat([i for i, _ in pieces]), torch.cat([v for _, v in pieces])) if pieces else (idx[:0], val[:0])
        return self.gather_entries(*mine, block_length(N, P))
