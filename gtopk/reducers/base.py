"""The reducer interface shared by dense, Top-k and gTop-k S-SGD (and the DDP baseline).

Contract (what a newcomer needs):

* **Construction** validates every setting (density, algorithm, put-back, bucket size)
  first, with a one-line ``ValueError`` naming the setting and the fix, and communicates
  nothing. Without a process group (``torch.distributed`` not initialised and no
  ``group``) the reducer is one worker: ``world_size`` 1, rank 0, nothing to send.
* ``reduce(grad, out=None) -> (update, record)`` turns this worker's flat fp32 gradient
  into the update every worker applies (already divided by P) and a ``ReduceRecord``;
  with ``out`` (same size, dtype and device; ``grad`` itself allowed: the gradient is
  read before the update is written) the update is written into ``out`` and returned,
  so a large model needs no second update-sized buffer per worker. It is
  **collective** when a process group exists: every rank of the group calls it, in the
  same order, with a gradient of the same size (the first call checks this with an
  ``all_gather_object``). With one worker it is local, with the semantics of
  ``gtopk.reducers.reference`` at P=1: dense returns the gradient; Top-k/gTop-k add it to
  the residual, return the exact top-k entries and keep the rest in the residual.
* **State**: the error-feedback residual (Top-k, gTop-k), one per rank, is the only state
  that lives across steps. ``state_dict()`` returns a copy of it (``{}`` for dense and
  DDP) and ``load_state_dict`` restores it; both are local.
* **density** (in (0, 1]) may be changed between steps (the density warm-up schedule); the
  setter validates it and the next ``reduce`` selects ``k = max(1, int(density * m))``.
  Reducers that send everything (dense, DDP) accept any valid value, ignore it and
  report 1.0.
* ``wrap(model)`` gives the module the loop runs forward/backward on (DDP wraps it);
  ``predict_commu`` is the alpha-beta model of one ``reduce``'s communication.
* ``reduce_group(workers, grads)`` (``simulatable`` reducers): P ranks' ``reduce`` in one
  process, bit for bit for Top-k and gTop-k (``gtopk.reducers.inprocess``).
* ``diagnostics`` (on in ``mode=train``): records also carry update_nnz, residual_norm and
  lost_l1 (``ReduceRecord``), from what the rank holds: no extra communication.

Declarations (class attributes, read without building the reducer or any process group;
``declared(settings)`` returns them for one config's settings, which is what the analyses,
``make payoff`` and the figures read: they keep no list of reducer names):

* ``display_name``: the reducer's name for people (verdicts, payoff maps); None: the name
  of its ``conf/reducer/<name>.yaml``.
* ``plot_order``: where it comes in figures and tables (ascending; ties and undeclared
  ones, ``inf``, by config name).
* ``color``: a matplotlib colour for its lines; None: the colour-blind palette's colour
  of its position in plot order among the reducers drawn.
* ``exact_average``: the update is exactly the mean of the P gradients (dense S-SGD,
  DDP): its final accuracy is the relative target of ``make payoff``, and reducers with
  this update borrow each other's iterations to a target.
* ``overlaps_backward``: its communication runs inside backward (DDP's hooks): its
  ``predict_body`` hides what the backward pass still running allows.
* ``hooked_backward``: set by ``wrap`` when ``overlaps_backward`` (the backward passes that
  run and time that communication, ``gtopk.reducers.backward.Backward``); None otherwise.
* ``simulatable``: ``reduce_group`` gives its semantics in one process
  (``cluster=simulated``).
* ``payoff_baseline``: a method users pick instead of compressing (DDP, DDP-fp16,
  PowerSGD): ``make payoff`` gives speedups against each (``speedup_vs_<name>``); the
  payoff baseline with ``exact_average`` (DDP) is the one every verdict is against.
* ``reference(grads, residuals)``: the executable semantics (``gtopk.reducers.reference``)
  with this instance's settings: what P = len(grads) ranks apply and keep (local); the
  attribute is None where there is none (the hook baselines).
* ``tolerance``: (rtol, atol) within which its update may differ between real ranks and
  its reference or ``reduce_group`` (summation order of a backend's all-reduce, fp16
  rounding); None: bit for bit where it selects (``uses_density``), else float32 rounding
  (rtol 1e-5, atol 1e-6) (``gtopk.perf.schedulecheck.same_update``).
* ``feedback_tolerance``: (rtol, atol) within which what one worker applied plus what it kept
  may differ from what it accumulated (a quantizing compressor's ``c + (p - c)`` rounds in
  float32); None: bit for bit (a selection moves entries and rounds none).
* ``conserves``: every accumulated entry is applied (summed into P x the update) or kept in a
  residual, so over any steps P x the sum of the updates plus the residuals is the sum of
  the gradients (error feedback without loss; gTop-k's paper put-back loses what an early
  merge dropped, so it declares False). Checked by the conformance kit on P ranks through
  ``reduce_group``, independently of the reducer's reference.
* ``schedule_tolerance``: the relative error its ``predict_commu`` may have against one
  recorded step (0: equal; a model averaged over steps, or assuming balanced data, states
  how far one step may stray).
* ``predict_commu(P, m, net, **settings)``: the alpha-beta time of one ``reduce`` (above);
  a reducer whose messages are this package's own sparse rounds gives its formulas
  ``net.sparse`` (alpha + the measured software cost per message), a backend collective ``net``.
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist
from torch import Tensor

from gtopk.host import Clock
from gtopk.reducers import native
from gtopk.reducers import transport as tcp
from gtopk.reducers.outcome import ReduceRecord
from gtopk.reducers.transport import TRANSPORTS, SocketTransport, uses_sockets

if TYPE_CHECKING:
    from gtopk.reducers.backward import Backward
    from gtopk.reducers.costmodel import Network

#: ``Reducer.reference``: (each rank's gradient, its residual before the step or None) ->
#: (the update every rank applies, each rank's residual after the step)
Reference = Callable[[list[Tensor], list[Tensor | None] | None], tuple[Tensor, list[Tensor]]]


@dataclass(frozen=True)
class Declared:
    """What a reducer class declares for one config's settings (``Reducer.declared``);
    the fields are the class attributes of the same names (see the module docstring)."""

    display_name: str | None
    plot_order: float
    color: str | None
    exact_average: bool
    overlaps_backward: bool
    simulatable: bool
    payoff_baseline: bool
    has_reference: bool


def validate_density(density: float) -> float:
    """Return density as float, or raise a ValueError naming the setting and the fix."""
    if isinstance(density, bool | str) or not isinstance(density, numbers.Real):  # true is not 1.0, '0.01' not 0.01
        raise ValueError(
            f"density={density!r} is not a number; set density to a value in (0, 1], unquoted, e.g. density=0.001"
        )
    d = float(density)
    if not 0.0 < d <= 1.0:
        raise ValueError(f"density={density!r} is outside (0, 1]; set density to a value in (0, 1], e.g. density=0.001")
    return d


class Reducer(ABC):
    """Base class: world info, density, state, input validation, timing; subclasses
    implement ``_reduce`` (and, when they keep a residual, ``state_dict``/``load_state_dict``).

    ``uses_density``: whether ``density`` changes what is sent (Top-k, gTop-k). When False
    (dense, DDP) every entry is sent: setting ``density`` validates the value and
    ignores it, and ``density`` reads 1.0.

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

    uses_density: bool = False
    _density: float = 1.0
    #: records carry update_nnz, residual_norm and lost_l1 (``ReduceRecord``)
    diagnostics: bool = False
    # -- declarations (module docstring); the defaults are those of a new reducer --
    display_name: ClassVar[str | None] = None
    plot_order: ClassVar[float] = math.inf
    color: ClassVar[str | None] = None
    exact_average: ClassVar[bool] = False
    overlaps_backward: ClassVar[bool] = False
    #: ``reduce_group`` gives this reducer's semantics in one process (``cluster=simulated``)
    simulatable: ClassVar[bool] = False
    payoff_baseline: ClassVar[bool] = False
    #: a method ``reference(grads, residuals)`` where the reducer has one (``Reference``)
    reference: ClassVar[Reference | None] = None
    hooked_backward: Backward | None = None
    tolerance: ClassVar[tuple[float, float] | None] = None
    feedback_tolerance: ClassVar[tuple[float, float] | None] = None
    conserves: ClassVar[bool] = True
    schedule_tolerance: ClassVar[float] = 0.0

    @classmethod
    def declared(cls, settings: Mapping[str, Any] | None = None) -> Declared:
        """Local; no instance needed. The declarations for a config's ``settings`` (its
        ``conf/reducer`` yaml or a record's ``reducer`` node; None: the class's own). A
        class whose variants differ (gTop-k's put-back) overrides this."""
        return Declared(
            display_name=cls.display_name,
            plot_order=float(cls.plot_order),
            color=cls.color,
            exact_average=bool(cls.exact_average),
            overlaps_backward=bool(cls.overlaps_backward),
            simulatable=bool(cls.simulatable),
            payoff_baseline=bool(cls.payoff_baseline),
            has_reference=cls.reference is not None,
        )

    def __init__(self, group: dist.ProcessGroup | None = None, align_timing: bool = False):
        self.group = group
        #: a process group exists: ``reduce`` is collective; otherwise one worker
        self.distributed = group is not None or (dist.is_available() and dist.is_initialized())
        self.world_size = dist.get_world_size(group) if self.distributed else 1
        self.rank = dist.get_rank(group) if self.distributed else 0
        self._m: int | None = None
        self.align_timing = bool(align_timing)
        self.commu_span: tuple[float, float] = (0.0, 0.0)

    @property
    def density(self) -> float:
        """Fraction of the m entries the next ``reduce`` selects (1.0 when ``uses_density``
        is False). Settable between steps; a value outside (0, 1] is a ValueError."""
        return self._density

    @density.setter
    def density(self, value: float) -> None:
        d = validate_density(value)
        if self.uses_density:
            self._density = d

    def state_dict(self) -> dict[str, Tensor | None]:
        """Local. A copy of the state this rank carries across steps (``{}``: none)."""
        return {}

    def load_state_dict(self, state: dict[str, Tensor | None]) -> None:
        """Local. Restore what ``state_dict`` returned (on this rank, for this model)."""
        if state:
            raise ValueError(
                f"{type(self).__name__} keeps no state but was given {sorted(state)}; "
                "load a checkpoint written with the same reducer"
            )

    def _commu_start(self, clock: Clock) -> float:
        """Collective when ``align_timing``. The clock reading that starts t_commu."""
        if self.align_timing and self.distributed:
            self._align()
        t = clock()
        self.commu_span = (t, t)
        return t

    def _commu_end(self, clock: Clock) -> float:
        """Collective when ``align_timing``. The clock reading that ends t_commu (every
        rank then holds the aggregated entries)."""
        t = clock()
        self.commu_span = (self.commu_span[0], t)
        if self.align_timing and self.distributed:
            self._align()
        return t

    def _align(self) -> None:
        """Collective. The barrier of ``align_timing`` (the backend's)."""
        dist.barrier(group=self.group)

    def peer(self, group_rank: int) -> int:
        """Global rank of a rank of this reducer's group (for point-to-point calls)."""
        return group_rank if self.group is None else dist.get_global_rank(self.group, group_rank)

    @classmethod
    def predict_commu(cls, P: int, m: int, net: Network, **settings) -> float:
        """Alpha-beta time of one ``reduce``'s communication for P ranks and m entries,
        with this reducer's config ``settings`` (no process group needed)."""
        raise NotImplementedError(f"{cls.__name__} has no communication model")

    @classmethod
    def predict_body(cls, P: int, m: int, net: Network, t_compute: float, **settings) -> float:
        """Alpha-beta time of a step's forward/backward (``t_compute``) and communication
        together: here one after the other; a reducer that communicates inside backward
        (``overlaps_backward``) overrides it with the part it hides."""
        return t_compute + cls.predict_commu(P, m, net, **settings)

    @classmethod
    def check_job(cls, cfg, backend: str) -> None:
        """Settings that depend on the job (mode, warm-up, backend) rather than on the
        reducer alone: raise a one-line ValueError naming the setting and the fix. Called
        in the parent before any process starts (``gtopk.run.checks.reducer_settings``)."""
        return None

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module the training loop runs forward/backward on (DDP wraps it)."""
        return model

    def reduce(self, grad: Tensor, out: Tensor | None = None) -> tuple[Tensor, ReduceRecord]:
        """Collective (local with one worker and no process group). Aggregate this
        worker's gradient; return (update, record). ``out``: write the update there (it
        may be ``grad``), else into a new tensor."""
        self._validate(grad)
        if out is not None and (out.shape != grad.shape or out.dtype != grad.dtype or out.device != grad.device):
            raise ValueError(
                f"reduce(out=...) must match the gradient ({tuple(grad.shape)}, {grad.dtype}, {grad.device}); "
                f"got ({tuple(out.shape)}, {out.dtype}, {out.device})"
            )
        rec = ReduceRecord()
        return self._reduce(grad, rec, Clock(grad.device), out), rec

    @abstractmethod
    def _reduce(self, grad: Tensor, rec: ReduceRecord, clock: Clock, out: Tensor | None = None) -> Tensor:
        """The update, written into ``out`` when given (``out`` may alias ``grad``)."""

    @classmethod
    def reduce_group(
        cls, workers: list[Reducer], grads: list[Tensor], accumulated: bool = False
    ) -> tuple[Tensor, list[ReduceRecord]]:
        """Local. What rank i's ``reduce(grads[i])`` returns in a group of P = len(workers)
        ranks, rank i's state being ``workers[i]``'s (updated as ``reduce`` would).
        ``accumulated``: the gradients were already added into the ranks' error-feedback
        residuals, held as one matrix (``gtopk.reducers.inprocess.residual_matrix``)."""
        raise NotImplementedError(f"{cls.__name__} cannot run its P workers in one process")

    def _validate(self, grad: Tensor) -> None:
        """On the first call, a collective check (local without a process group) that all
        ranks pass the same kind of gradient, so every rank raises the same error instead
        of hanging; later calls check locally against the first."""
        mine = _describe(grad)
        if self._m is not None:
            if mine != ("torch.float32", 1, self._m):
                raise ValueError(
                    f"reducer got a gradient {mine} on rank {self.rank} after {self._m} "
                    "entries of torch.float32 on the first call; the model must not change"
                )
            return
        everyone: list = [mine]
        if self.distributed:
            everyone = [None] * self.world_size
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

    def state_dict(self) -> dict[str, Tensor | None]:
        """A copy of the residual (None before the first step)."""
        return {"residual": None if self.residual is None else self.residual.detach().clone()}

    def load_state_dict(self, state: dict[str, Tensor | None]) -> None:
        if set(state) != {"residual"}:
            raise ValueError(
                f"an error-feedback state holds 'residual', got {sorted(state)}; "
                "load a checkpoint written with a Top-k or gTop-k reducer"
            )
        residual = state["residual"]
        self.residual = None if residual is None else residual.detach().clone()


class SparseReducer(Reducer):
    """A reducer that sends a ``density`` fraction of the entries and keeps the rest in
    an error-feedback residual (``feedback``), its state across steps (Top-k, gTop-k)."""

    uses_density = True

    def __init__(self, density: float, group: dist.ProcessGroup | None = None, align_timing: bool = False):
        self.density = density  # validated by the setter, before anything else
        super().__init__(group, align_timing)
        self.feedback = ErrorFeedback()
        self._sockets: SocketTransport | None = None

    #: the transport of a reducer's own point-to-point rounds (gTop-k's, Ok-Topk's): ``auto``
    #: (sockets for CPU tensors on a gloo group, gTop-k's tree compiled where it builds, else
    #: the backend's calls), ``native`` (sockets, gTop-k's tree compiled: ``gtopk.reducers.native``),
    #: ``socket`` (sockets, every round in Python) or ``backend`` (``torch.distributed``'s
    #: send/recv); ``gtopk.reducers.transport``
    transport: str = "auto"

    def _set_transport(self, transport: str) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(
                f"reducer.transport={transport!r} is unknown; choose one of {', '.join(TRANSPORTS)} "
                "(auto: sockets for CPU tensors on gloo, compiled rounds where they build; the backend's calls on NCCL)"
            )
        self.transport = transport

    def _compiled_sockets(self) -> SocketTransport | None:
        """Local. The rounds' sockets where compiled code may use them now (``transport`` auto
        or native, the library built, nothing posted on them), else None."""
        s = self._sockets
        if s is None or self.transport not in ("auto", "native") or not s.idle() or native.why_unavailable():
            return None
        return s

    def _align(self) -> None:
        """Collective. The barrier of ``align_timing``: over the rounds' sockets, compiled
        (``gtopk.reducers.native.barrier``: its ranks leave it together, where gloo's barrier
        lets them go up to hundreds of microseconds apart, all counted in t_commu), once they
        exist and where the compiled rounds may be used; else the backend's."""
        s = self._compiled_sockets()
        if s is None:
            return super()._align()
        native.barrier(
            s.fds(),
            s.rank,
            timeout_s=tcp.TIMEOUT_S,
            spin_s=native.spin_seconds(s.world),
        )

    def p2p_transport(self, device: torch.device) -> SocketTransport | None:
        """The ``SocketTransport`` the rounds of a reduce on ``device`` use, None for the
        backend's own calls. Collective the first time it makes one (its constructor): every
        rank of the group calls it at the same point of the same ``reduce``."""
        if device.type != "cpu":
            return None
        if self._sockets is None:  # made once, on the first reduce that takes it
            if not self.distributed or not uses_sockets(self.transport, self.group):
                return None
            self._sockets = SocketTransport(self.group)
        return self._sockets

    def state_dict(self) -> dict[str, Tensor | None]:
        """Local. ``{"residual": copy of this rank's residual, or None before the first step}``."""
        return self.feedback.state_dict()

    def load_state_dict(self, state: dict[str, Tensor | None]) -> None:
        """Local. Restore this rank's residual (a copy of ``state["residual"]``)."""
        self.feedback.load_state_dict(state)
