"""Ok-Topk S-SGD (Li and Hoefler, PPoPP 2022): an O(k) sparse all-reduce with thresholds
re-used between exact selections, on plain ``torch.distributed`` (docs/oktopk.md)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from gtopk.host import Clock, one_thread
from gtopk.reducers.base import SparseReducer
from gtopk.reducers.costmodel import Network
from gtopk.reducers.oktopk.comm import Comm
from gtopk.reducers.oktopk.cost import Wire, oktopk_step_time, oktopk_time
from gtopk.reducers.oktopk.group import oktopk_group
from gtopk.reducers.oktopk.reference import OkTopKSpec
from gtopk.reducers.oktopk.regions import (
    boundaries,
    quantiles,
    region_sum,
    select_global,
    select_local,
    split,
)
from gtopk.reducers.outcome import ReduceRecord
from gtopk.reducers.selection import Selector
from gtopk.reducers.selection.exact import k_for
from gtopk.reducers.selection.sampled import MAX_REFINE, SAMPLE_RATIO
from gtopk.reducers.sparse import member_mask

#: the paper's periods (its code: thresholds every 32 iterations, regions every 64)
THRESHOLD_PERIOD, BOUNDARY_PERIOD = 32, 64
#: the model's largest step-0 / average ratio at the schedule check's m, k (docs/oktopk.md);
#: how far a recorded step 0 may stray from its balanced step model (``schedule_tolerance``)
STEP0_OVER_AVERAGE, DATA_SPREAD = 2.06, 0.4
STATE_KEYS = ("residual", "step", "k", "local_threshold", "global_threshold", "boundaries")


def _period(name: str, value, paper: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"reducer.{name}={value!r} must be an integer >= 1 ({what}); the paper uses {paper}, e.g. {name}={paper}"
        )
    return value


class OkTopKReducer(SparseReducer):
    """Ok-Topk: each rank selects locally by a threshold (exact top-k every
    ``threshold_period`` steps, re-used in between), the selections are reduced region by
    region (regions balanced on the ranks' selected positions, re-computed every
    ``boundary_period`` steps; region r is reduced on rank r), each region owner selects
    globally (exact top-k of all reduced entries every ``threshold_period`` steps, a
    re-used threshold in between) and the result is all-gathered. Collective as a whole
    (``gtopk.reducers.oktopk.comm``): every rank must call ``reduce``.

    Error feedback (the paper's Algorithm 2): ``acc = residual + grad``; a rank's selected
    entries whose index reached the global set are applied (summed over every rank that
    selected them, / P) and cleared; everything else stays in its residual. No gradient is
    lost: ``sum_i acc_i == P * update + sum_i residual_i`` up to float rounding.

    State across steps (``state_dict``): the residual, the step counter, the k the
    thresholds were chosen for (a new density makes the next step exact), this rank's
    local threshold, the global threshold and the regions' boundaries.
    Semantics: ``gtopk.reducers.oktopk.reference``; in one process: ``reduce_group``.
    ``selection`` (``gtopk.reducers.selection``): how the exact steps select locally.
    """

    display_name = "Ok-Topk"
    plot_order = 70
    #: The schedule check compares its one recorded step (step 0 of a fresh run: exact, new
    #: regions) with ``predict_commu(step=0)``, the model of that step under balanced data;
    #: on the check's random data a recorded step 0 strays up to 0.37 from it (measured
    #: P = 2..128, 2-3 seeds; docs/oktopk.md), bounded by ``DATA_SPREAD``.
    schedule_tolerance = DATA_SPREAD

    def reference(self, grads: list[Tensor], residuals: list[Tensor | None] | None = None):
        """Local. One step of the reference run of P = len(grads) ranks with these settings
        (``oktopk_reference.OkTopKSpec``): what they apply and keep. Ok-Topk's step depends
        on earlier steps (the step count, every rank's local threshold, the global
        threshold, the regions), so the reference keeps its own run (``reference_run``,
        apart from this reducer's state and never read from it): a call without residuals
        (None, or every entry None) starts a run at step 0; each later call is the run's
        next step, every rank's thresholds those the run's own earlier steps chose. Give it
        the residuals its previous call returned to follow P ranks step by step."""
        P = len(grads)
        accs = [g if r is None else r + g for g, r in zip(grads, residuals or [None] * P)]
        if residuals is None or all(r is None for r in residuals):
            self.reference_run = OkTopKSpec(P, self.density, self.threshold_period, self.boundary_period)
        elif self.reference_run is None or self.reference_run.P != P:
            raise ValueError(
                f"OkTopKReducer.reference: residuals given but no reference run of {P} ranks: "
                "start one with residuals=None (Ok-Topk's step depends on the run's earlier steps)"
            )
        self.reference_run.density = self.density  # a density change makes the next step exact, as in reduce
        return self.reference_run.step(accs)

    def __init__(
        self,
        density: float,
        threshold_period: int = THRESHOLD_PERIOD,
        boundary_period: int = BOUNDARY_PERIOD,
        selection: str = "exact",
        group: dist.ProcessGroup | None = None,
        align_timing: bool = False,
        sample_ratio: float = SAMPLE_RATIO,
        max_refine: int = MAX_REFINE,
        transport: str = "auto",
    ):
        self.selector = Selector(selection, sample_ratio, max_refine)  # gtopk.reducers.selection
        self.threshold_period = _period(
            "threshold_period", threshold_period, THRESHOLD_PERIOD, "tau': steps between exact selections"
        )
        self.boundary_period = _period(
            "boundary_period", boundary_period, BOUNDARY_PERIOD, "tau: steps between re-computed regions"
        )
        self.selection = selection
        super().__init__(density, group, align_timing)
        self._set_transport(transport)  # its rotations' sockets or the backend's calls (``SparseReducer``)
        self.step, self.k_chosen = 0, -1
        self.local_threshold: Tensor | None = None
        self.global_threshold: Tensor | None = None
        self.bounds: Tensor | None = None
        #: the last ``reduce``'s bytes of the tensors passed to collectives (entries, padding, metadata)
        self.wire = Wire()
        #: the reference's own run of P ranks (``reference``); not the reducer's state
        self.reference_run: OkTopKSpec | None = None

    @classmethod
    def predict_commu(
        cls,
        P: int,
        m: int,
        net: Network,
        density: float = 0.001,
        threshold_period: int = THRESHOLD_PERIOD,
        boundary_period: int = BOUNDARY_PERIOD,
        step: int | None = None,
        **_,
    ) -> float:
        """The balanced-data model (``oktopk_cost``): None, one step averaged over a run's
        periods (``oktopk_time``: what the performance model uses); ``step``, that step of a
        run from a fresh state (``oktopk_step_time``; step 0 is exact and re-computes the
        regions: the step the schedule check records)."""
        k, net = k_for(density, m), net.sparse  # its messages carry the sparse rounds' software cost
        if step is not None:
            return oktopk_step_time(P, k, m, net, step, threshold_period, boundary_period)
        return oktopk_time(P, k, m, net, threshold_period, boundary_period)

    # -- the schedule shared by every rank --------------------------------------------------
    def exact_step(self, k: int) -> bool:
        """Whether this step selects exactly (locally and globally) and re-sets the thresholds."""
        return self.step % self.threshold_period == 0 or k != self.k_chosen

    def boundary_step(self) -> bool:
        """Whether this step re-computes the regions."""
        return self.bounds is None or self.step % self.boundary_period == 0

    def advance(self, k: int, local: Tensor, glob: Tensor | None, bounds: Tensor) -> None:
        """Keep what the step chose for the next one."""
        self.step, self.k_chosen = self.step + 1, k
        self.local_threshold, self.global_threshold, self.bounds = local, glob, bounds

    def _reduce(self, grad: Tensor, rec: ReduceRecord, clock: Clock, out: Tensor | None = None) -> Tensor:
        P, m, me = self.world_size, grad.numel(), self.rank
        k = k_for(self.density, m)
        exact = self.exact_step(k)
        if self.bounds is not None and self.bounds.numel() != P + 1:
            regions = self.bounds.numel() - 1
            raise ValueError(
                f"the oktopk state holds regions for {regions} ranks, not {P}: resume it with nodes={regions}"
            )
        t0 = clock()
        acc = self.feedback.accumulate(grad)
        sel, local = select_local(acc, k, self.local_threshold, self.selector if exact else None)
        vals = acc[sel]
        t1 = clock()
        t1c = self._commu_start(clock)
        sockets = self.p2p_transport(grad.device)
        comm = Comm(rec, self.peer, self.group, P, me, m, grad.device, sockets, sockets is self._compiled_sockets())
        with one_thread(grad.device.type == "cpu"):  # short ops on k-sized tensors (as gTop-k's merges)
            (final_idx, final_val), glob, bounds = self._aggregate(comm, sel, vals, k, exact, rec, clock)
        t2 = self._commu_end(clock)  # every rank holds the final entries
        acc[sel[member_mask(final_idx, sel)]] = 0
        t3 = clock()
        update = torch.zeros_like(acc) if out is None else out.zero_()
        update[final_idx] = final_val / P
        self.advance(k, local, glob, bounds)
        self.wire = comm.wire
        rec.selected = sel.numel()
        rec.payload_bytes = comm.wire.payload
        rec.t_compr = (t1 - t0) + (t3 - t2)
        rec.t_commu = t2 - t1c
        if self.diagnostics:  # lossless: nothing dropped
            rec.update_nnz, rec.lost_l1 = final_idx.numel(), 0.0
            rec.residual_norm = float(torch.linalg.vector_norm(acc))
        return update

    def _aggregate(self, comm: Comm, sel: Tensor, vals: Tensor, k: int, exact: bool, rec: ReduceRecord, clock: Clock):
        """Collective: regions (on their steps), split and reduce, the global selection and
        its all-gather. Returns ((final indices, values), global threshold, boundaries)."""
        P, m, me = self.world_size, comm.m, self.rank
        bounds = self.bounds
        if self.boundary_step():
            proposal = quantiles(sel, P, m)
            bounds = boundaries(comm.sum_meta(proposal) if P > 1 else proposal, P, m)
        cuts = split(sel, bounds)
        parts = {r: (sel[a:b], vals[a:b]) for r, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])) if b > a}
        if P > 1:  # the part counts: rank i's in region r at [i, r]
            table = comm.gather_counts([b - a for a, b in zip(cuts[:-1], cuts[1:])])
            mine = comm.split_and_reduce(parts, table[:, me].tolist())
        else:
            mine = list(parts.values())
        tm = clock()
        reduced = region_sum(mine, sel.device)
        if not exact:  # the region owner's selection by the global threshold
            reduced, _ = select_global(*reduced, k, self.global_threshold, False)
        rec.t_merge = clock() - tm
        gathered = comm.gather_balanced(*reduced) if P > 1 else reduced
        glob = self.global_threshold
        if exact:  # every rank holds every reduced entry: the exact global top-k
            tm = clock()
            gathered, glob = select_global(*gathered, k, None, True)
            rec.t_merge += clock() - tm
        return gathered, glob, bounds

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Tensor | None]:
        """Local. Copies of: the residual, the step counter, the k of the thresholds, this
        rank's local threshold, the global threshold, the regions' boundaries (None before
        the first step)."""

        def copy(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.detach().clone()

        return {
            **self.feedback.state_dict(),
            "step": torch.tensor(self.step, dtype=torch.int64, device="cpu"),
            "k": torch.tensor(self.k_chosen, dtype=torch.int64, device="cpu"),
            "local_threshold": copy(self.local_threshold),
            "global_threshold": copy(self.global_threshold),
            "boundaries": copy(self.bounds),
        }

    def load_state_dict(self, state: dict[str, Tensor | None]) -> None:
        """Local. Restore what ``state_dict`` returned."""
        if set(state) != set(STATE_KEYS):
            raise ValueError(
                f"an oktopk state holds {', '.join(STATE_KEYS)}; got {sorted(state)}: "
                "load a checkpoint written with reducer=oktopk"
            )
        self.feedback.load_state_dict({"residual": state["residual"]})
        self.step, self.k_chosen = int(state["step"]), int(state["k"])
        self.local_threshold, self.global_threshold, self.bounds = (
            None if state[n] is None else state[n].detach().clone()
            for n in ("local_threshold", "global_threshold", "boundaries")
        )

    simulatable = True

    @classmethod
    def reduce_group(cls, workers, grads, accumulated=False):
        """Local: ``gtopk.reducers.oktopk.group.oktopk_group``."""
        return oktopk_group(workers, grads, accumulated)
