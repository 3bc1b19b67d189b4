"""EF-signSGD (Karimireddy et al., 2019): a 1-bit quantizer with error feedback, the second
worked example of docs/new-reducer.md (a test-only reducer: not in ``conf/reducer``).

Every rank adds its gradient to its residual, p = residual + gradient, and sends
c = sign(p) * mean|p|: one bit per entry (p >= 0) and one float32 scale, in one
``dist.all_gather`` of ceil(m / 8) + 4 bytes per rank; it keeps p - c. The update is the
ranks' c summed in rank order, / P. It sends every entry (no ``density``)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from gtopk.host import Clock
from gtopk.reducers.base import ErrorFeedback, Reducer
from gtopk.reducers.costmodel import Network, Traffic
from gtopk.reducers.inprocess import residual_rows
from gtopk.reducers.outcome import ReduceRecord


def message_bytes(m: int) -> int:
    """One rank's message: the scale (4 bytes), then m sign bits packed 8 to a byte."""
    return 4 + -(-m // 8)


def encode(p: Tensor) -> Tensor:
    """Local. ``p``'s message (uint8): mean|p| as float32's 4 bytes, then bit i = p[i] >= 0."""
    bits = torch.nn.functional.pad((p >= 0).to(torch.uint8), (0, -p.numel() % 8))
    shifts = torch.arange(8, dtype=torch.uint8, device=p.device)
    packed = (bits.view(-1, 8) << shifts).sum(1, dtype=torch.uint8)
    return torch.cat([p.abs().mean().reshape(1).view(torch.uint8), packed])


def decode(msg: Tensor, m: int) -> Tensor:
    """Local. The c = +-scale vector (float32, m entries) a message stands for."""
    scale = msg[:4].clone().view(torch.float32)
    shifts = torch.arange(8, dtype=torch.uint8, device=msg.device)
    bits = ((msg[4:].unsqueeze(1) >> shifts) & 1).flatten()[:m].bool()
    return torch.where(bits, scale, -scale)


def mean_of(parts: list[Tensor], out: Tensor | None = None) -> Tensor:
    """The parts summed in rank order, / P (into ``out`` when given)."""
    total = parts[0].clone() if out is None else out.copy_(parts[0])
    for c in parts[1:]:
        total.add_(c)
    return total.div_(len(parts))


class SignSGDReducer(Reducer):
    """Error feedback, then one ``dist.all_gather`` (collective) of every rank's 1-bit message."""

    display_name = "EF-signSGD"
    plot_order = 90
    simulatable = True
    # c + (p - c) rounds in float32: applied + kept equals accumulated to float32 rounding
    feedback_tolerance = (1e-5, 1e-6)

    def __init__(self, group: dist.ProcessGroup | None = None, align_timing: bool = False):
        super().__init__(group, align_timing)
        self.feedback = ErrorFeedback()  # the residual, where reduce_group's helpers look for it

    def _reduce(self, grad: Tensor, rec: ReduceRecord, clock: Clock, out: Tensor | None = None) -> Tensor:
        P, m = self.world_size, grad.numel()
        t0 = clock()
        p = self.feedback.accumulate(grad)  # residual + gradient, in the residual's buffer
        mine = encode(p)
        t1 = self._commu_start(clock)
        msgs = [mine] if P == 1 else [torch.empty_like(mine) for _ in range(P)]
        if P > 1:
            dist.all_gather(msgs, mine, group=self.group)
        parts = [decode(msg, m) for msg in msgs]
        t2 = self._commu_end(clock)
        p.sub_(parts[self.rank])  # keep p - c
        t3 = clock()
        update = mean_of(parts, out)  # ``out`` may be ``grad``: the gradient is in p by now
        rec.selected, rec.t_compr, rec.t_commu = m, (t1 - t0) + (t3 - t2), t2 - t1
        rec.set_traffic(self.traffic(P, m))
        if self.diagnostics:
            rec.update_nnz, rec.lost_l1 = m, 0.0
            rec.residual_norm = float(torch.linalg.vector_norm(p))
        return update

    @staticmethod
    def traffic(P: int, m: int) -> Traffic:
        """Per rank: a ring all-gather, P - 1 messages of one rank's message each way."""
        n = (P - 1) * message_bytes(m)
        return Traffic(P - 1, n, n)

    @classmethod
    def predict_commu(cls, P: int, m: int, net: Network, **_) -> float:
        """The ring all-gather: P - 1 steps of one message (``Network.ring_msg``)."""
        return (P - 1) * net.ring_msg(message_bytes(m))

    def reference(self, grads: list[Tensor], residuals: list[Tensor | None] | None = None):
        """Local. What P = len(grads) ranks apply and keep (no wire format: sign and scale directly)."""
        ps = [g.clone() if r is None else r + g for g, r in zip(grads, residuals or [None] * len(grads))]
        cs = [torch.where(p >= 0, p.abs().mean(), -p.abs().mean()) for p in ps]
        return mean_of(cs), [p - c for p, c in zip(ps, cs)]

    @classmethod
    def reduce_group(cls, workers, grads, accumulated=False):
        """Local. P ranks' ``reduce`` in one process (``cluster=simulated``): the residuals are
        the rows of one [P, m] matrix (``residual_rows``; ``accumulated``: the batched pass has
        already added the gradients into it)."""
        P, m = len(workers), grads[0].numel()
        rows = residual_rows(workers, grads, accumulated)  # row i: rank i's p, its residual buffer
        parts = [decode(encode(p), m) for p in rows]
        for p, c in zip(rows, parts):
            p.sub_(c)
        update = mean_of(parts)
        recs = [ReduceRecord(selected=m) for _ in workers]
        norms = torch.linalg.vector_norm(rows, dim=1).tolist()
        for rec, norm in zip(recs, norms):
            rec.set_traffic(cls.traffic(P, m))
            if workers[0].diagnostics:
                rec.update_nnz, rec.residual_norm, rec.lost_l1 = m, norm, 0.0
        return update, recs

    def state_dict(self) -> dict[str, Tensor | None]:
        """Local. ``{"residual": a copy, or None before the first step}`` (the key the kit reads)."""
        return self.feedback.state_dict()

    def load_state_dict(self, state: dict[str, Tensor | None]) -> None:
        """Local. Restore what ``state_dict`` returned."""
        self.feedback.load_state_dict(state)
