"""A replayed step that runs through autograd, for reducers that hook into backward (DDP).

``compute=replay`` normally copies a fixed gradient into ``.grad`` and sleeps. A wrapped
model such as torch ``DistributedDataParallel`` only communicates from its autograd hooks
during ``backward``, so for it the replay has to be a backward pass: this module builds
a surrogate loss ``sum_i (p_i * g_i).sum()`` over the parameters (its gradient is exactly
the replay vector g), runs it through the wrapper's ``forward`` and ``backward``, and
spreads the replayed ``t_compute`` over that pass:

* the first ``FORWARD_SHARE`` of t_compute is slept before the surrogate forward (no
  gradient exists during a forward pass, so nothing can overlap it);
* the rest is the backward pass: every conv/linear weight (parameters with ndim >= 2)
  becomes ready an equal share later than the previous one, last layer first, as in a
  real backward; biases and norm parameters ride along with their layer. The p102
  profile has no per-layer times; equal shares per layer are close for VGG-16 and
  ResNet-20, whose conv layers do about equal work by design.

The wrapper's hooks see each gradient when its layer's share has passed and start their
bucketed all-reduce while the later shares are still being slept: the overlap DDP gets
from a real backward. The last gradient is ready ``t_compute`` after the start; what the
pass takes beyond that is the communication it could not hide (timed by the worker's
``gtopk.reducers.backward.Backward``, which the training loop reports as t_commu). Times are
the worker's virtual ones (``gtopk.host.now``/``sleep``): under time dilation D the pass
lasts D times as long on the wall.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from gtopk import host
from gtopk.reducers.costmodel import FORWARD_SHARE, ready_offsets


class _ReadyAt(torch.autograd.Function):
    """Identity on a scalar whose backward sleeps until ``deadline`` (``gtopk.host.now`` s)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, deadline: float) -> torch.Tensor:
        ctx.deadline = deadline
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        host.sleep(ctx.deadline - host.now())
        return grad, None


def ready_times(
    params: list[nn.Parameter], start: float, t_compute: float, forward_share: float = FORWARD_SHARE
) -> list[float]:
    """When each parameter's gradient is ready (``gtopk.host.now`` seconds), in parameter
    (forward) order: ``start`` plus the cost model's ``ready_offsets`` (the backward walks the
    layers in reverse, one equal share per parameter with ndim >= 2; other parameters share
    their layer's time), so that the model's overlap of DDP (``DDPReducer.predict_body``) is
    the one replayed here."""
    return [start + o for o in ready_offsets([p.dim() for p in params], t_compute, forward_share)]


def replay_backward(
    net: nn.Module,
    model: nn.Module,
    params: list[nn.Parameter],
    bank: torch.Tensor | Sequence[torch.Tensor],
    t_compute: float,
    backward: Callable[[torch.Tensor], None] = torch.Tensor.backward,
    factor: float = 1.0,
    forward_share: float = FORWARD_SHARE,
) -> None:
    """One replayed forward/backward through ``net`` (the wrapper of ``model``): every
    ``p.grad`` receives ``factor`` x its slice of ``bank`` (of the sum of the banks, when
    it is a sequence: ``gtopk.train.compute.ReplayedCompute.replayed``), and whatever the
    wrapper's hooks do to it, e.g. DDP's average over ranks. Takes about ``t_compute``
    seconds, plus whatever communication the wrapper does not hide. ``backward(loss)`` runs
    the backward pass (the worker's ``gtopk.reducers.backward.Backward.run``, which times
    DDP's all-reduces)."""
    start = host.now()
    banks = [bank] if isinstance(bank, torch.Tensor) else list(bank)
    deadlines = ready_times(params, start, t_compute, forward_share)
    slices, offset = [], 0
    for p in params:
        slices.append([b[offset : offset + p.numel()].view_as(p) for b in banks])
        offset += p.numel()

    def term(p: nn.Parameter, gs: list[torch.Tensor]) -> torch.Tensor:
        loss = sum((p * g).sum() for g in gs)  # its gradient: the sum of the slices
        return loss * factor if factor != 1.0 else loss

    def surrogate(*_: Any, **__: Any) -> torch.Tensor:
        terms = [_ReadyAt.apply(term(p, gs), d) for p, gs, d in zip(params, slices, deadlines)]
        return torch.stack(terms).sum()

    host.sleep(start + forward_share * t_compute - host.now())
    model.forward = surrogate  # the wrapper calls model(...) from its own forward
    try:
        loss = net(torch.zeros(()))
    finally:
        del model.forward
    backward(loss)
