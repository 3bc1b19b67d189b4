"""How a step runs ``loss.backward()``, and how much communication backward could not hide.

The computes (``gtopk.train.compute``) run every backward pass through the worker's
``Backward``: ``MeasuredCompute`` once per micro-batch, the replayed backward of a hooked
model (``gtopk.train.replay_backward``) once per step. The plain one just calls
``loss.backward()`` and communicates nothing. A reducer that communicates from autograd
hooks while backward runs (``baselines.ddp.DDPReducer``) provides its own as
``hooked_backward`` after ``wrap``; it times that communication, and the training loop
moves the part backward could not hide from t_compute to t_commu (``BackwardCommu``).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class BackwardCommu:
    """Communication done inside the backward passes since the last ``Backward.take``.

    exposed: seconds the passes went on after their last gradient bucket was ready (the
        gradient computation was over): waiting for the all-reduces still in flight, and
        copying their results into ``.grad``. Summed over passes.
    total: seconds from each pass's first bucket ready to its last all-reduce completed
        (hidden behind backward or not), summed over passes.
    """

    exposed: float = 0.0
    total: float = 0.0


class Backward:
    """Plain ``loss.backward()``: nothing communicated inside it (not collective)."""

    def run(self, loss: Tensor) -> None:
        loss.backward()

    def take(self) -> BackwardCommu:
        """The communication inside the passes run since the last call (then forgotten).
        Call it after a syncing clock reading (``gtopk.host.Clock``)."""
        return BackwardCommu()
