"""The paper's schedules: learning-rate warm-up and steps, density warm-up; ``schedules``
builds a config's (what the training loop runs), ``first_difference`` compares two configs'
(whether a run can be trained longer exactly: ``gtopk.records.extension``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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


def _setting(cfg: Any, dotted: str) -> Any:
    for head in dotted.split("."):
        cfg = cfg[head]
    return cfg


def schedules(cfg: Any, world: int | None = None) -> tuple[LRSchedule, DensitySchedule]:
    """The LR and density schedules the training loop runs (``gtopk.train.loop.train``) for
    ``cfg``: the job's config, or a plain dict of one (a recorded identity); ``world``: the
    job's ranks (default ``nodes``)."""
    lr = LRSchedule(
        _setting(cfg, "model.lr"),
        _setting(cfg, "nodes") if world is None else world,
        _setting(cfg, "model.lr_warmup_epochs"),
        tuple(_setting(cfg, "model.lr_milestones")),
    )
    density = DensitySchedule(
        _setting(cfg, "density"),
        _setting(cfg, "train.density_warmup.density"),
        _setting(cfg, "train.density_warmup.epochs"),
    )
    return lr, density


def first_difference(old: Any, new: Any, epochs: int, per_epoch: int) -> str | None:
    """Where the schedules of configs ``old`` and ``new`` (``schedules``) give another value
    in the first ``epochs`` epochs of ``per_epoch`` iterations each (every iteration's LR,
    every epoch's density); None when they agree on all of them."""
    (lr_a, density_a), (lr_b, density_b) = schedules(old), schedules(new)
    for epoch in range(epochs):
        if density_a(epoch) != density_b(epoch):
            return f"the density of epoch {epoch} ({density_a(epoch)} -> {density_b(epoch)})"
        for it in range(per_epoch):
            a, b = lr_a(epoch, it, per_epoch), lr_b(epoch, it, per_epoch)
            if a != b:
                return f"the learning rate of epoch {epoch}, iteration {it} ({a:g} -> {b:g})"
    return None
