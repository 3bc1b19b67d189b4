"""Deliberately wrong reducers for the kit's own tests. ScaledDense: dense S-SGD whose update is 1.5
times the mean gradient. Every rank applies the same update (replicas stay equal), so only
a comparison with the reference catches it."""

from __future__ import annotations

from gtopk.reducers import DenseReducer, TopKReducer


class ScaledDense(DenseReducer):
    def _reduce(self, grad, rec, clock, out=None):
        return super()._reduce(grad, rec, clock, out).mul_(1.5)


class UndividedTopK(TopKReducer):
    """Top-k whose shared scaling forgets the division by P in ``reduce``, ``reference`` and
    ``reduce_group`` alike: every reference check agrees with it; conservation does not."""

    def _reduce(self, grad, rec, clock, out=None):
        return super()._reduce(grad, rec, clock, out).mul_(self.world_size)

    def reference(self, grads, residuals=None):
        update, kept = super().reference(grads, residuals)
        return update * len(grads), kept

    @classmethod
    def reduce_group(cls, workers, grads, accumulated=False):
        update, recs = super().reduce_group(workers, grads, accumulated)
        return update.mul_(len(workers)), recs
