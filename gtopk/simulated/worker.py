"""P virtual ranks in one process: what each real rank holds, and one step of all of them.

``cluster=simulated`` runs a training job's P ranks in one process (the driver:
``gtopk.train.loop``, through ``gtopk.simulated.ranks.SimulatedRanks``). The parameters,
the optimiser (and its momentum) and the compute are shared: every real rank holds
identical copies of them and applies the same update (``gtopk.train.worker.Replica``).
What differs between real ranks is kept per ``VirtualRank``:

* its shard of the data: the same ``DistributedSampler`` partition (num_replicas=P,
  rank=i) through the same loaders (``build_loader``), read in this process (as
  ``train.loader_workers=0``);
* its torch RNG stream (augmentation, the DataLoader's seed draws, dropout): every rank
  starts from the state after seeding and building the model; ``SimulatedWorker.active``
  swaps rank i's state in around everything rank i does, so it draws what rank i draws;
* its BatchNorm running statistics (swapped in the same way; rank i's forward passes
  update rank i's, evaluation uses each rank's own on its own test shard, as
  ``Worker.evaluate`` does before its all_reduce);
* its reducer: error-feedback residual and records (``Reducer.reduce_group``:
  ``gtopk.reducers.inprocess``); the hook baselines' torch hook state, in an in-process
  group (``gtopk.simulated.hooks``);
* its records: ``iters.rank<i>.jsonl`` (``RankRows``) and checkpoint file, in the
  distributed format.

A step computes the P gradients one after another (the exact mode) or, with
``cluster.batched`` (``gtopk.simulated.batched``), in one vectorised pass per chunk of
ranks: each rank's batch is still fetched under its own RNG state, and its BatchNorm
statistics are then its slice of one stacked buffer (``VirtualRank.buffers`` are views
into it). Each rank's row is ``gtopk.train.rows.step_row``'s, as a real rank's.

Nothing here is collective: the process needs no process group.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from gtopk.host import heartbeat
from gtopk.records.rundir import RunDir
from gtopk.reducers.backward import Backward
from gtopk.reducers.inprocess import residual_matrix
from gtopk.reducers.outcome import ReduceRecord
from gtopk.simulated.batched import BatchedGradients, use_batched
from gtopk.train.checkpoint import Store
from gtopk.train.data import build_loader
from gtopk.train.faults import ON_GRADIENT, FaultInjector, FaultSpec, NonFiniteGuard, has_nonfinite
from gtopk.train.flatgrad import views_intact
from gtopk.train.rows import RankRows, step_row
from gtopk.train.state import rng_state, set_rng_state
from gtopk.train.worker import Replica, micro_batches


class VirtualRank:
    """Rank ``rank``'s own state (see the module docstring)."""

    def __init__(self, rank: int, world: int, cfg: DictConfig, run_dir: Path, sets, buffers, rng: dict):
        self.rank, self.cfg = rank, cfg
        self.reducer = instantiate(cfg.reducer)
        self.reducer.diagnostics = True
        train_set, test_set = sets
        self.train_loader, self.sampler = build_loader(train_set, cfg.batch_size, rank, world, True, cfg.seed, 0)
        self.test_loader, _ = build_loader(test_set, cfg.batch_size, rank, world, False, cfg.seed, 0)
        self.buffers = [b.detach().clone() for b in buffers]
        self.rng = rng
        self.grad: torch.Tensor | None = None  # this step's flat gradient
        self.records = RankRows(run_dir, rank)
        self.faults = FaultInjector(FaultSpec.from_cfg(cfg.get("fault")), rank)
        self.guard = NonFiniteGuard(cfg.get("nonfinite", "stop"), rank, world)

    def groups(self, epoch: int | None) -> Iterator[list]:
        """This epoch's stream of micro-batch lists (``None``: endless), as a real rank's."""
        return micro_batches(self.train_loader, self.sampler, epoch, self.cfg.grad_accum)


class SimulatedWorker(Replica):
    """The shared model, optimiser and compute, and the P ``VirtualRank`` s."""

    def __init__(self, world: int, cfg: DictConfig, run_dir: Path, device: torch.device):
        self.rank, self.world, self.cfg, self.run_dir, self.device = 0, world, cfg, run_dir, device
        torch.manual_seed(cfg.seed)  # as every real rank: then the same initial weights and RNG
        self.model = instantiate(cfg.model.net).to(device)
        self.net = self.model
        self.backward = Backward()
        self.replicate(cfg, device)  # params, m, flat, opt (fused SGD), clock: as a real rank's
        self.compute = instantiate(cfg.compute)
        self.compute.prepare(self)
        data = instantiate(cfg.data)
        sets = data.datasets()
        self.buffers = list(self.model.buffers())
        start = rng_state(device)
        self.ranks = [VirtualRank(i, world, cfg, run_dir, sets, self.buffers, start) for i in range(world)]
        self.reducer = self.ranks[0].reducer  # settings (density) as the job reports them
        prepare = getattr(type(self.reducer), "prepare_group", None)  # the hook baselines: DDP's buckets
        if prepare is not None:
            prepare([vr.reducer for vr in self.ranks], self.model, data.sample_shape() or tuple(sets[0][0][0].shape))
        self.store = Store(RunDir(run_dir), world)  # checkpoint generations (SimulatedRanks.save, .load)
        self.batched: BatchedGradients | None = None
        self.accumulated = False  # this step's gradients went straight into the residuals
        setting = cfg.cluster.get("batched", False)
        if use_batched(setting, world, int(cfg.batch_size), self.model, device):
            self.batched = BatchedGradients(self.model, world, int(cfg.cluster.get("chunk") or world))
            for i, vr in enumerate(self.ranks):
                vr.buffers = self.batched.rank_buffers(i)  # each rank's slice of the stacked statistics

    @contextlib.contextmanager
    def active(self, vr: VirtualRank) -> Iterator[None]:
        """Rank ``vr``'s RNG state and BatchNorm statistics in force while the block runs
        (what it draws and updates there is kept as rank ``vr``'s)."""
        set_rng_state(vr.rng, self.device)
        with torch.no_grad():
            for b, mine in zip(self.buffers, vr.buffers):
                b.copy_(mine)
        try:
            yield
        finally:
            vr.rng = rng_state(self.device)
            with torch.no_grad():
                for b, mine in zip(self.buffers, vr.buffers):
                    mine.copy_(b)

    @contextlib.contextmanager
    def drawing(self, vr: VirtualRank) -> Iterator[None]:
        """Rank ``vr``'s RNG state in force while the block runs (kept as its state after)."""
        set_rng_state(vr.rng, self.device)
        try:
            yield
        finally:
            vr.rng = rng_state(self.device)

    def step(self, fetches: list, lr: float) -> list[dict]:
        """One step of every rank: P gradients (one after another, or batched), their
        aggregate (the reducers' semantics), the SGD step. One row per rank; t_iter is the
        whole step."""
        t0 = self.clock()
        self.accumulated = False
        rows = self.gradients(fetches) if self.batched is None else self.batched_gradients(fetches)
        return self.aggregate(rows, t0, lr)

    def gradients(self, fetches: list) -> list[dict]:
        """The exact mode: each rank's forward and backward in turn (``compute.gradient``),
        with its RNG state and BN statistics swapped in."""
        clock, rows = self.clock, []
        for vr, fetch in zip(self.ranks, fetches):
            ta = clock()
            with self.active(vr):
                self.opt.zero_grad(set_to_none=False)
                t_data, loss = self.compute.gradient(self, fetch)
            tb = clock()
            if not views_intact(self.params, self.flat):
                torch.cat([p.grad.reshape(-1) for p in self.params], out=self.flat)
            vr.faults.on_gradient(self.flat)
            vr.grad = self.flat.clone() if vr.grad is None else vr.grad.copy_(self.flat)
            bad = has_nonfinite(vr.grad)
            rows.append({"t_data": t_data, "t_compute": tb - ta - t_data, "t_check": clock() - tb, "loss": loss})
            rows[-1]["bad"] = bad
            heartbeat()
        return rows

    def batched_gradients(self, fetches: list) -> list[dict]:
        """The batched mode: each rank's micro-batches fetched under its RNG state, then
        all ranks' gradients in one pass per chunk (``BatchedGradients``); t_compute is
        each rank's share (the passes' time / P)."""
        clock, rows, batches = self.clock, [], []
        for vr, fetch in zip(self.ranks, fetches):
            ta = clock()
            with self.drawing(vr):
                batches.append([(x.to(self.device), y.to(self.device)) for x, y in fetch()])
            rows.append({"t_data": clock() - ta})
        ta = clock()
        into = self.fusable_residuals()
        if into is None:
            losses, self.accumulated = self.batched.compute(batches, heartbeat).tolist(), False
        else:
            got, self.accumulated = self.batched.accumulate(batches, into, heartbeat)
            losses = got.tolist()
        share = (clock() - ta) / self.world
        if self.accumulated:  # every gradient finite and already in its rank's residual
            for vr, row, loss in zip(self.ranks, rows, losses):
                vr.grad = None
                row.update(t_compute=share, t_check=0.0, loss=loss, bad=False)
            return rows
        tb = clock()
        for i, vr in enumerate(self.ranks):
            vr.grad = self.batched.grads[i]
            vr.faults.on_gradient(vr.grad)
        sums = self.batched.grads.sum(1).tolist()  # a NaN or Inf in a row makes its sum one
        t_check = (clock() - tb) / self.world
        for vr, row, loss, total in zip(self.ranks, rows, losses, sums):
            bad = not math.isfinite(total) and has_nonfinite(vr.grad)  # the exact test where the sum says so
            row.update(t_compute=share, t_check=t_check, loss=loss, bad=bad)
        return rows

    def fusable_residuals(self) -> torch.Tensor | None:
        """The ranks' residuals as one [P, m] matrix when the batched pass may add the
        gradients into them directly (``BatchedGradients.accumulate``): error-feedback
        reducers past their first step, and no rank poisons its gradient this step."""
        if any(vr.faults.armed and vr.faults.spec.kind in ON_GRADIENT for vr in self.ranks):
            return None
        return residual_matrix([vr.reducer for vr in self.ranks])

    def aggregate(self, rows: list[dict], t0: float, lr: float) -> list[dict]:
        """The ranks' gradients (``vr.grad``) aggregated and applied; ``rows`` completed."""
        clock = self.clock
        bad = [i for i, row in enumerate(rows) if row.pop("bad")]  # every rank's verdict, as the guard's
        t2 = clock()
        recs = [ReduceRecord() for _ in self.ranks]
        reducers = [vr.reducer for vr in self.ranks]
        # DDP's hooks communicate inside backward, before the check: then on such a step too
        if not bad or getattr(type(reducers[0]), "overlaps_backward", False):
            # accumulated: the rows of the residual matrix give the shapes
            grads = list(residual_matrix(reducers).unbind(0)) if self.accumulated else [vr.grad for vr in self.ranks]
            update, done = type(reducers[0]).reduce_group(reducers, grads, self.accumulated)
            if not bad:  # a step with a non-finite gradient applies nothing (nonfinite=skip)
                recs = done
                self.apply(update, lr)
        t4 = clock()
        shared = t4 - t2 - sum(rec.t_compr for rec in recs)  # aggregating (not one rank's) + SGD step
        return [
            step_row(
                rec,
                t_data=row["t_data"],
                t_compute=row["t_compute"],
                t_commu=0.0,  # nothing is sent: the traffic in rec is what the ranks would send
                t_commu_backward=0.0,
                t_update=shared,  # t_merge (rec): the merges this rank makes, part of t_update here
                t_iter=t4 - t0,
                t_check=row["t_check"],
                bad=bad,
                action=vr.guard.action(bad),
                loss=row["loss"],
                lr=lr,
                density=vr.reducer.density,
            )
            for vr, row, rec in zip(self.ranks, rows, recs)
        ]
