"""What can go wrong inside a worker, on purpose or not: fault injection and non-finite
gradients. Both run in every rank's training loop (``gtopk.train.loop``).

Fault injection (``fault.kind`` on rank ``fault.rank`` at iteration ``fault.at_iter``;
off while ``fault.kind`` is null), so that every failure path is tested for real:

* ``raise``: the rank raises ``InjectedFault`` before the step;
* ``kill``: the rank SIGKILLs itself before the step (no traceback, no cleanup);
* ``hang``: the rank sleeps forever before the step, outside any collective (the others
  wait in the step's collective until ``collective_timeout_s``; with P = 1 the launcher's
  watchdog, ``timeout_s``, catches it);
* ``nan``: the rank's gradient gets a NaN after backward (``nonfinite`` decides).

Non-finite gradients: every step, ``NonFiniteGuard.check`` finds the ranks whose gradient
holds NaN or Inf with one all_reduce of P flags, so every rank takes the same decision
(a rank that skipped alone would desynchronise the reducer's collectives). ``nonfinite``:
``stop`` raises ``NonFiniteGradient`` on every rank; ``skip`` applies no update that step
(the reducer is not called, so its residual stays clean) and goes on. Either way the
iteration's record holds ``nonfinite_ranks`` and ``nonfinite`` (the action, or null).
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor


class InjectedFault(RuntimeError):
    """Raised by ``fault.kind=raise``."""


class NonFiniteGradient(FloatingPointError):
    """A gradient held NaN or Inf and ``nonfinite=stop``."""


def _raise(rank: int, it: int) -> None:
    raise InjectedFault(f"injected fault: fault.kind=raise on rank {rank} at iteration {it}")


def _kill(rank: int, it: int) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _hang(rank: int, it: int) -> None:
    while True:  # only a signal ends this
        time.sleep(3600)


def _poison(grad: Tensor) -> None:
    grad.view(-1)[0] = float("nan")


#: faults that strike before the step, and faults that strike the gradient after backward
BEFORE_STEP: dict[str, Callable[[int, int], None]] = {"raise": _raise, "kill": _kill, "hang": _hang}
ON_GRADIENT: dict[str, Callable[[Tensor], None]] = {"nan": _poison}
KINDS = (*BEFORE_STEP, *ON_GRADIENT)
NONFINITE = ("stop", "skip")


@dataclass(frozen=True)
class FaultSpec:
    """``cfg.fault``: which fault, on which rank, at which iteration (0-based; in train
    mode counted over all epochs). A rank that does not exist (e.g. fault.rank=3 in a
    job with nodes=2) never fires, so one sweep can fault some of its jobs only."""

    kind: str | None = None
    rank: int = 0
    at_iter: int = 0

    @classmethod
    def from_cfg(cls, node: Any) -> FaultSpec:
        node = node or {}
        kind = node.get("kind")
        if isinstance(kind, float) and math.isnan(kind):  # Hydra reads fault.kind=nan as a float
            kind = "nan"
        return cls(kind=kind, rank=node.get("rank", 0), at_iter=node.get("at_iter", 0))

    def problems(self) -> list[str]:
        """What is wrong with the settings, each naming the setting and the fix."""
        out = []
        if self.kind is not None and self.kind not in KINDS:
            out.append(f"fault.kind={self.kind!r} is unknown; choose one of {', '.join(KINDS)} (or null: no fault)")
        for key in ("rank", "at_iter"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                out.append(f"fault.{key}={value!r} must be an integer >= 0, e.g. fault.{key}=1")
        return out


class FaultInjector:
    """This rank's share of ``FaultSpec``: call ``before_step(it)`` before every step and
    ``on_gradient(grad)`` after backward (not collective)."""

    def __init__(self, spec: FaultSpec, rank: int):
        self.spec, self.rank = spec, rank
        self.armed = spec.kind is not None and spec.rank == rank
        self.it = -1

    def before_step(self, it: int) -> None:
        self.it = it
        if self.armed and it == self.spec.at_iter and self.spec.kind in BEFORE_STEP:
            BEFORE_STEP[self.spec.kind](self.rank, it)

    def on_gradient(self, grad: Tensor) -> None:
        if self.armed and self.it == self.spec.at_iter and self.spec.kind in ON_GRADIENT:
            ON_GRADIENT[self.spec.kind](grad)


def has_nonfinite(grad: Tensor) -> bool:
    """Whether ``grad`` holds a NaN or an Inf: the exact element-wise test, run only when
    the sum, one cheap pass, is not finite. A NaN or an Inf anywhere makes the sum NaN or
    Inf, so a finite sum proves every entry finite; a non-finite sum may also be finite
    values whose sum overflows, which the exact test then tells apart."""
    if torch.isfinite(grad.sum()):
        return False
    return bool((~torch.isfinite(grad)).any())


class NonFiniteGuard:
    """Detects NaN/Inf gradients consistently across ranks and applies ``nonfinite``."""

    def __init__(self, policy: str, rank: int, world: int):
        if policy not in NONFINITE:
            raise ValueError(f"nonfinite={policy!r} is unknown; choose one of {', '.join(NONFINITE)}")
        self.policy, self.rank, self.world = policy, rank, world

    def check(self, grad: Tensor) -> list[int]:
        """Collective (one all_reduce of P flags): the ranks whose ``grad`` is not all
        finite, identical on every rank."""
        flags = torch.zeros(self.world, device=grad.device)
        flags[self.rank] = float(has_nonfinite(grad))
        if self.world > 1:  # alone, there is nobody to agree with
            dist.all_reduce(flags)
        return flags.nonzero().flatten().tolist()

    def action(self, bad: list[int]) -> str | None:
        """What happens to a step whose non-finite ranks are ``bad`` (None: nothing)."""
        return self.policy if bad else None

    def enforce(self, row: dict) -> None:
        """After the row is recorded: raise on every rank if the step must stop the job."""
        if row.get("nonfinite") == "stop":
            raise NonFiniteGradient(
                f"non-finite gradient (NaN or Inf) on rank(s) {row['nonfinite_ranks']} at iteration "
                f"{row['iter']} and nonfinite=stop; pass nonfinite=skip to skip such steps instead "
                "(lower the learning rate if it keeps happening)"
            )
