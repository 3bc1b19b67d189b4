"""Model state across ranks: identical initial weights, and per-epoch checkpoints."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn

from gtopk.records.rundir import RunDir


def broadcast_and_check(model: nn.Module) -> None:
    """Collective. Copy rank 0's parameters and buffers to every rank, then check that all
    ranks hold identical weights (all_reduce of a checksum's min and max)."""
    tensors = list(model.parameters()) + list(model.buffers())
    with torch.no_grad():
        for t in tensors:
            dist.broadcast(t.data, src=0)
    assert_identical(model)


def checksum(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return (
            torch.stack([p.detach().double().sum() + (p.detach().double() ** 2).sum() for p in model.parameters()])
            .sum()
            .reshape(1)
        )


def assert_identical(model: nn.Module) -> None:
    """Collective: raise on every rank if the ranks' parameters differ."""
    c = checksum(model)
    lo, hi = c.clone(), c.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    if not torch.equal(lo, hi):
        raise RuntimeError(f"model weights differ across ranks (checksums {lo.item()} .. {hi.item()})")


class Checkpoints:
    """One file per rank (``RunDir.checkpoint(rank)``), rewritten each epoch: model,
    optimiser, the reducer's ``state_dict()`` (its error-feedback residual, which is per
    rank) and the epoch's metrics. Saved atomically; ``load`` returns the next epoch to
    run and leaves the restored epoch's metrics in ``metrics`` (so that a crash between
    saving an epoch and recording it loses no record). Files of the older format (the
    residual under ``"residual"``) load too."""

    def __init__(self, run: RunDir, rank: int):
        self.path, self.rank = run.checkpoint(rank), rank
        self.metrics: dict | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def save(self, w, epoch: int, metrics: dict | None = None) -> None:
        """Collective (a barrier after every rank saved)."""
        state = {
            "epoch": epoch,
            "model": w.model.state_dict(),
            "opt": w.opt.state_dict(),
            "reducer": w.reducer.state_dict(),
            "metrics": metrics,
        }
        tmp = self.path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.path)
        dist.barrier()  # every rank has its epoch saved before anyone moves on

    def load(self, w) -> int:
        """Collective. Resume from the last epoch all ranks saved; 0 if none."""
        state = torch.load(self.path, map_location=w.device) if self.path.exists() else None
        epoch = torch.tensor([state["epoch"] if state else -1], device=w.device)
        lowest = epoch.clone()
        dist.all_reduce(lowest, op=dist.ReduceOp.MIN)
        if state is None or lowest.item() != epoch.item():
            return 0 if lowest.item() < 0 else self._restore(w, state, lowest.item())
        return self._restore(w, state, epoch.item())

    def _restore(self, w, state: dict, epoch: int) -> int:
        if state["epoch"] != epoch:
            raise RuntimeError(
                f"rank {self.rank} holds a checkpoint of epoch {state['epoch']}, "
                f"others of epoch {epoch}; delete {self.path.parent} to start over"
            )
        w.model.load_state_dict(state["model"])
        w.opt.load_state_dict(state["opt"])
        w.reducer.load_state_dict(_reducer_state(state))
        self.metrics = state.get("metrics")
        assert_identical(w.model)
        return epoch + 1


def _reducer_state(state: dict) -> dict:
    """The reducer's state of a checkpoint; older files kept the residual (or None, for
    reducers without one) under ``"residual"``."""
    if "reducer" in state:
        return state["reducer"]
    return {} if state.get("residual") is None else {"residual": state["residual"]}
