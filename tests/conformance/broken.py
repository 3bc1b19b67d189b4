"""A deliberately wrong reducer for the kit's own test: dense S-SGD whose update is 1.5
times the mean gradient. Every rank applies the same update (replicas stay equal), so only
a comparison with the reference catches it."""

from __future__ import annotations

from gtopk.reducers import DenseReducer


class ScaledDense(DenseReducer):
    def _reduce(self, grad, rec, clock, out=None):
        return super()._reduce(grad, rec, clock, out).mul_(1.5)
