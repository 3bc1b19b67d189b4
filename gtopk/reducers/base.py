"""The reducer interface shared by dense, Top-k and gTop-k S-SGD.

A reducer turns this worker's flat fp32 gradient into the update every worker applies
(already divided by P), owns its error-feedback residual, and reports what it did in a
``ReduceRecord``. ``reduce`` is a collective call: every rank of the process group must
call it, in the same order, with a gradient of the same size.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import Tensor

from gtopk.host import Clock

if TYPE_CHECKING:
    from gtopk.reducers.costmodel import Network


@dataclass
class ReduceRecord:
    """What one ``reduce`` call did on this rank.

    selected: entries this worker selected (m for dense).
    bytes_sent / bytes_recv / messages_sent: this rank's traffic (see gtopk.reducers.costmodel
        for which counts are exact and which nominal).
    t_compr: seconds in local work on the residual (add, top-k selection, put-back).
    t_commu: seconds in the collective: from the selected entries to every rank holding the
        aggregated ones (packing, messages, unpacking, merges). Scattering them into the
        dense update (and summing Top-k's P sets) is applying it: the training loop counts
        it in t_update. (The paper's t_commu includes that scatter.)
    t_merge: the part of t_commu spent in gTop-k's merges.
    """

    selected: int = 0
    bytes_sent: int = 0
    bytes_recv: int = 0
    messages_sent: int = 0
    t_compr: float = 0.0
    t_commu: float = 0.0
    t_merge: float = 0.0  # part of t_commu spent merging sparse vectors (gTop-k)

    def as_dict(self) -> dict:
        return asdict(self)

    def set_traffic(self, traffic) -> None:
        """Copy a ``gtopk.reducers.costmodel.Traffic`` (nominal counts of a backend collective)."""
        self.messages_sent = traffic.messages_sent
        self.bytes_sent = traffic.bytes_sent
        self.bytes_recv = traffic.bytes_recv


def validate_density(density: float) -> float:
    """Return density as float, or raise a ValueError naming the setting and the fix."""
    try:
        d = float(density)
    except (TypeError, ValueError):
        raise ValueError(
            f"density={density!r} is not a number; set density to a value in (0, 1], e.g. density=0.001"
        ) from None
    if not 0.0 < d <= 1.0:
        raise ValueError(f"density={density!r} is outside (0, 1]; set density to a value in (0, 1], e.g. density=0.001")
    return d


class Reducer(ABC):
    """Base class: input validation, world info, timing; subclasses implement ``_reduce``.

    ``align_timing`` (a benchmark setting, off in training): ``reduce`` adds a barrier
    (collective) before its communication starts and one after it ends, outside the timed
    span, so that t_commu times the collective alone: every rank starts it together (no
    waiting for a slower rank's selection) and no rank's post-processing competes with
    ranks still communicating (it would on an emulated cluster, where the ranks share
    CPU cores). ``commu_span`` holds the last call's (start, end) clock readings of the
    communication (``time.perf_counter``: comparable between processes of one host), from
    which a benchmark takes the collective's time from the last rank's start to the last
    rank's end, free of the barrier's exit skew.
    """

    def __init__(self, group: dist.ProcessGroup | None = None, align_timing: bool = False):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is not initialised; call dist.init_process_group first "
                "(run.py does this), or use gtopk.reducers.reference for a single-process computation"
            )
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._m: int | None = None
        self.align_timing = bool(align_timing)
        self.commu_span: tuple[float, float] = (0.0, 0.0)

    def _commu_start(self, clock: Clock) -> float:
        """Collective when ``align_timing``. The clock reading that starts t_commu."""
        if self.align_timing:
            dist.barrier(group=self.group)
        t = clock()
        self.commu_span = (t, t)
        return t

    def _commu_end(self, clock: Clock) -> float:
        """Collective when ``align_timing``. The clock reading that ends t_commu (every
        rank then holds the aggregated entries)."""
        t = clock()
        self.commu_span = (self.commu_span[0], t)
        if self.align_timing:
            dist.barrier(group=self.group)
        return t

    def peer(self, group_rank: int) -> int:
        """Global rank of a rank of this reducer's group (for point-to-point calls)."""
        return group_rank if self.group is None else dist.get_global_rank(self.group, group_rank)

    @classmethod
    def predict_commu(cls, P: int, m: int, net: Network, **settings) -> float:
        """Alpha-beta time of one ``reduce``'s communication for P ranks and m entries,
        with this reducer's config ``settings`` (no process group needed)."""
        raise NotImplementedError(f"{cls.__name__} has no communication model")

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module the training loop runs forward/backward on (DDP wraps it)."""
        return model

    def reduce(self, grad: Tensor) -> tuple[Tensor, ReduceRecord]:
        """Collective. Aggregate this worker's gradient; return (update, record)."""
        self._validate(grad)
        rec = ReduceRecord()
        return self._reduce(grad, rec, Clock(grad.device)), rec

    @abstractmethod
    def _reduce(self, grad: Tensor, rec: ReduceRecord, clock: Clock) -> Tensor: ...

    def _validate(self, grad: Tensor) -> None:
        """On the first call, a collective check that all ranks pass the same kind of
        gradient, so every rank raises the same error instead of hanging; later calls
        check locally against the first."""
        mine = _describe(grad)
        if self._m is not None:
            if mine != ("torch.float32", 1, self._m):
                raise ValueError(
                    f"reducer got a gradient {mine} on rank {self.rank} after {self._m} "
                    "entries of torch.float32 on the first call; the model must not change"
                )
            return
        everyone: list = [None] * self.world_size
        dist.all_gather_object(everyone, mine, group=self.group)
        bad = {r: d for r, d in enumerate(everyone) if d[0] != "torch.float32" or d[1] != 1}
        if bad:
            raise TypeError(
                "reducer input must be one flat (1-D) torch.float32 gradient per rank; got "
                + ", ".join(f"rank {r}: dtype {d[0]}, {d[1]}-D" for r, d in bad.items())
                + ". Fix: flatten the parameters' gradients and cast them with .float()"
            )
        sizes = {d[2] for d in everyone}
        if len(sizes) > 1:
            raise ValueError(
                "gradient sizes differ across ranks ("
                + ", ".join(f"rank {r}: {d[2]}" for r, d in enumerate(everyone))
                + " entries); every rank must build the same model"
            )
        self._m = mine[2]


def _describe(grad: object) -> tuple[str, int, int]:
    if not isinstance(grad, Tensor):
        return (type(grad).__name__, -1, -1)
    return (str(grad.dtype), grad.dim(), grad.numel())


class ErrorFeedback:
    """The residual of one worker (paper's steps 1 and 3), lazily sized to the gradient."""

    def __init__(self) -> None:
        self.residual: Tensor | None = None

    def accumulate(self, grad: Tensor) -> Tensor:
        """acc = residual + grad, computed in place: the returned tensor IS the residual
        buffer, which the caller then masks to leave what stays local."""
        if self.residual is None:
            self.residual = grad.detach().clone()
        else:
            self.residual.add_(grad)
        return self.residual
