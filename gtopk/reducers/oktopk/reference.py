"""Executable specification of Ok-Topk: one process, no torch.distributed, dense vectors
and full sorts, written for clarity and sharing no code with the reducer (only its rules).

``OkTopKSpec(P, density, threshold_period, boundary_period).step(accs)`` takes the P
ranks' accumulated vectors ``acc_i = residual_i + g_i`` of one step and returns
``(update, residuals)``; it keeps the state that lives across steps. Rules:

* Step t (from 0) is *exact* when t is a multiple of ``threshold_period`` or k changed
  since the last step. Exact: rank i selects its k largest |acc_i| (ties: the smaller
  index) and keeps the k-th largest |acc_i| as its threshold; otherwise it selects every
  entry with |acc_i| >= its kept threshold.
* Every selected entry is summed over the ranks that selected it, in rank order (0 + a_0
  + a_1 + ...): ``summed``; ``union`` is the set of selected indices.
* Exact step: the global set is the k entries of the union with the largest |summed|
  (ties: the smaller index), and the global threshold becomes the k-th largest. Otherwise
  the global set is every index of the union with |summed| >= the kept global threshold.
* ``update = summed / P`` on the global set, 0 elsewhere; rank i's residual is acc_i with
  the entries it selected that are in the global set cleared. Nothing is lost.
* Regions (communication only: the update does not depend on them) are re-computed at
  steps that are multiples of ``boundary_period``: rank i proposes the indices
  ``sel_i[floor(r n_i / P)]`` (r = 1..P-1; ``floor(r m / P)`` when it selected nothing), and
  boundary r is the sum of the proposals divided by P, rounded down; region r is
  [b_r, b_{r+1}) with b_0 = 0, b_P = m.

``messages()`` lists the point-to-point messages (source, destination, entries) the step
needs: each rank's part of region r to rank r, then the moves that give rank q the q-th
block of ceil(N / P) entries of the entries held for the all-gather (in rank order).
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import Tensor


def _order(values: Tensor) -> Tensor:
    """Positions sorted by |value| descending, ties by position ascending."""
    return sorted(range(values.numel()), key=lambda i: (-abs(float(values[i])), i))


class OkTopKSpec:
    """The reference state machine of Ok-Topk over P ranks."""

    def __init__(self, P: int, density: float, threshold_period: int = 32, boundary_period: int = 64):
        self.P, self.density = P, density
        self.threshold_period, self.boundary_period = threshold_period, boundary_period
        self.t, self.k = 0, None
        self.local = [None] * P
        self.glob = None
        self.bounds: list[int] | None = None
        self.last: dict = {}

    def step(self, accs: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
        P, m = self.P, accs[0].numel()
        k = min(m, max(1, int(self.density * m)))
        exact = self.t % self.threshold_period == 0 or k != self.k
        sels = []
        for i, acc in enumerate(accs):
            if exact:
                chosen = sorted(_order(acc)[:k])
                self.local[i] = min(abs(float(acc[j])) for j in chosen)
            else:
                chosen = [j for j in range(m) if abs(float(acc[j])) >= self.local[i]]
            sels.append(chosen)
        if self.t % self.boundary_period == 0 or self.bounds is None:
            proposals = [[s[r * len(s) // P] if s else r * m // P for r in range(1, P)] for s in sels]
            self.bounds = [0] + [sum(p[r] for p in proposals) // P for r in range(P - 1)] + [m]
        summed = torch.zeros(m, dtype=accs[0].dtype)
        for acc, sel in zip(accs, sels):  # rank order
            for j in sel:
                summed[j] = summed[j] + acc[j]
        union = sorted(set().union(*sels))
        if exact:
            ranked = _order(summed[union]) if union else []
            final = sorted(union[p] for p in ranked[:k])
            self.glob = min(abs(float(summed[j])) for j in final)
        else:
            final = [j for j in union if abs(float(summed[j])) >= self.glob]
        update = torch.zeros(m, dtype=accs[0].dtype)
        residuals = []
        chosen = set(final)
        for j in final:
            update[j] = summed[j] / P
        for acc, sel in zip(accs, sels):
            r = acc.clone()
            for j in sel:
                if j in chosen:
                    r[j] = 0
            residuals.append(r)
        self.last = {"sels": sels, "union": union, "final": final, "exact": exact, "k": k}
        self.t, self.k = self.t + 1, k
        return update, residuals

    def region(self, j: int) -> int:
        """The region of index j (the last region whose start is <= j, among non-empty ones)."""
        b = self.bounds
        return max(r for r in range(self.P) if b[r] <= j < b[r + 1])

    def messages(self) -> Counter:
        """The last step's point-to-point messages, (source, destination, entries): one per
        pair with entries to move (none on one rank)."""
        P, c = self.P, Counter()
        if P == 1:
            return c
        for i, sel in enumerate(self.last["sels"]):
            for r, n in Counter(self.region(j) for j in sel).items():
                if r != i:
                    c[(i, r, n)] += 1
        held = self.last["union"] if self.last["exact"] else self.last["final"]
        owners = [self.region(j) for j in held]  # ascending indices: rank order of the owners
        L = -(-len(owners) // P)
        moves = Counter((src, pos // L) for pos, src in enumerate(owners))
        for (src, dst), n in moves.items():
            if src != dst:
                c[(src, dst, n)] += 1
        return c
