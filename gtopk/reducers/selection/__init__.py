"""The local selection of the sparse reducers, ``reducer.selection=exact|sampled``: one
entry point, ``select(x, k, method)``, and what a rank sends of it (``Selector.pick``).

* ``exact`` (the default): the k largest ``|x|``, ties to the smaller index
  (``gtopk.reducers.selection.exact.topk_indices``).
* ``sampled``: Deep Gradient Compression's sampled threshold
  (``gtopk.reducers.selection.sampled``): the ``n <= k`` largest ``|x|``, exactly k whenever at
  least k entries pass the threshold.

Both return ascending int64 indices and are local (no collective calls), deterministic
(no random draw) and run on the tensor's own device.

The wire format carries exactly k entries per rank, so a rank that selected ``n < k``
pads its message (``gtopk.reducers.sparse.pad_to``): the ``k - n`` smallest indices it did
not select, with the value 0.0. Padding adds nothing to any sum, and its rank keeps those
entries in its residual (``Picks.own``): what a rank sent plus what it kept is what it
accumulated, with either method.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from gtopk.reducers.selection.exact import topk_indices, topk_rows
from gtopk.reducers.selection.sampled import MAX_REFINE, SAMPLE_RATIO, sampled_indices
from gtopk.reducers.sparse import pad_to

METHODS = ("exact", "sampled")


class Picks(NamedTuple):
    """What ranks send from their accumulated vectors: 1-D for one rank (``pick``), one
    row per rank for P ranks held as a matrix (``pick_rows``).

    idx: the k indices on the wire, ascending (per row); val: the accumulated values there
    (0.0 at padding); pad: bool like ``idx``, True at padding (sent as 0.0, not selected,
    kept in the residual), or None when there is none (always so with ``exact``).
    """

    idx: Tensor
    val: Tensor
    pad: Tensor | None

    def own(self, row: int | None = None) -> Tensor:
        """The selected indices (of ``row`` for P ranks), ascending: ``idx`` less padding.
        These are the entries the rank clears from its residual once they are applied."""
        idx = self.idx if row is None else self.idx[row]
        if self.pad is None:
            return idx
        return idx[~(self.pad if row is None else self.pad[row])]

    def counts(self) -> list[int]:
        """Entries selected, per rank (one number for one rank)."""
        k = self.idx.shape[-1]
        if self.pad is None:
            return [k] * (self.idx.shape[0] if self.idx.dim() == 2 else 1)
        return (k - self.pad.view(-1, k).sum(1)).tolist()


@dataclass(frozen=True)
class Selector:
    """A reducer's selection settings, checked when it is built (one-line errors naming
    the setting and the fix). ``sample_ratio`` and ``max_refine`` are ``sampled``'s
    (DGC's defaults: 0.01 and 10); ``exact`` ignores them."""

    method: str = "exact"
    sample_ratio: float = SAMPLE_RATIO
    max_refine: int = MAX_REFINE

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"reducer.selection={self.method!r} is unknown; choose one of {', '.join(METHODS)}")
        ratio = self.sample_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio <= 1 or math.isnan(ratio):
            raise ValueError(
                f"reducer.sample_ratio={ratio!r} must be a number in (0, 1], the fraction of entries sampled "
                f"for the threshold; DGC's default is reducer.sample_ratio={SAMPLE_RATIO}"
            )
        refine = self.max_refine
        if isinstance(refine, bool) or not isinstance(refine, int) or refine < 0:
            raise ValueError(
                f"reducer.max_refine={refine!r} must be an integer >= 0, the most times the threshold is "
                f"lowered; DGC's default is reducer.max_refine={MAX_REFINE}"
            )

    def indices(self, x: Tensor, k: int) -> Tensor:
        """Ascending int64 indices of the selection from the 1-D ``x``: k (``exact``), or
        at most k (``sampled``). Local."""
        if self.method == "exact":
            return topk_indices(x, k)
        return sampled_indices(x, k, self.sample_ratio, self.max_refine)

    def pick(self, acc: Tensor, k: int) -> Picks:
        """One rank's message from its accumulated 1-D ``acc``: k entries, padded when
        fewer were selected. Local."""
        sel = self.indices(acc, k)
        return Picks(*pad_to(sel, acc[sel], k))

    def pick_rows(self, acc: Tensor, k: int) -> Picks:
        """``pick`` of every row of ``acc`` [P, m] (``cluster=simulated``): [P, k] each;
        row i is ``pick(acc[i], k)`` exactly. Local."""
        if self.method == "exact":
            idx = topk_rows(acc, k)
            return Picks(idx, acc.gather(1, idx), None)
        rows = [self.pick(row, k) for row in acc]
        pads = [p.pad if p.pad is not None else torch.zeros(k, dtype=torch.bool, device=acc.device) for p in rows]
        pad = torch.stack(pads) if any(p.pad is not None for p in rows) else None
        return Picks(torch.stack([p.idx for p in rows]), torch.stack([p.val for p in rows]), pad)


def select(
    x: Tensor, k: int, method: str = "exact", sample_ratio: float = SAMPLE_RATIO, max_refine: int = MAX_REFINE
) -> Tensor:
    """The selection from the 1-D ``x``: ascending int64 indices, exactly ``k`` with
    ``exact``, at most ``k`` with ``sampled`` (the n largest ``|x|``, n <= k). Local."""
    return Selector(method, sample_ratio, max_refine).indices(x, k)
