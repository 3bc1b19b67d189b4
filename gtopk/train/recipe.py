"""The paper's schedules: learning-rate warm-up and steps, density warm-up."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LRSchedule:
    """Linear warm-up from lr/P to lr over ``warmup_epochs`` (per iteration), then x0.1 at
    each milestone epoch. lr is not scaled with P."""

    lr: float
    world_size: int
    warmup_epochs: float
    milestones: tuple[int, ...]

    def __call__(self, epoch: int, it: int, iters_per_epoch: int) -> float:
        t = epoch + it / max(1, iters_per_epoch)
        if t < self.warmup_epochs:
            start = self.lr / self.world_size
            return start + (self.lr - start) * t / self.warmup_epochs
        return self.lr * 0.1 ** sum(epoch >= m for m in self.milestones)


@dataclass(frozen=True)
class DensitySchedule:
    """``warmup_density`` for the first ``warmup_epochs`` epochs, then ``density``."""

    density: float
    warmup_density: float
    warmup_epochs: int

    def __call__(self, epoch: int) -> float:
        return self.warmup_density if epoch < self.warmup_epochs else self.density
