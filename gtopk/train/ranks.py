"""The ranks one process trains, as the driver (``gtopk.train.loop``) sees them.

``Ranks`` is what the one training loop needs of them: step, evaluate, save and load a
checkpoint generation, write the rows, gather them for the summary. Two kinds:

* ``RealRanks``: one rank of a distributed job (``Worker``), one process per rank; its
  methods are collective where the ``Worker``'s are;
* ``gtopk.simulated.ranks.SimulatedRanks``: all P ranks of a job as virtual ranks of one
  process (``cluster=simulated``); nothing is collective.

Each hosted rank (a ``Worker``, or a ``gtopk.simulated.worker.VirtualRank``) has ``rank``,
``reducer``, ``train_loader``, ``groups(epoch)``, ``records`` (``RankRows``), ``faults``
and ``guard``: what the base class's methods use.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from gtopk.records.rundir import RunDir
from gtopk.train.faults import NonFiniteGradient
from gtopk.train.state import Checkpoints, assert_identical, weights_sha256
from gtopk.train.worker import Worker


class Ranks(ABC):
    """The ranks this process hosts (``hosted``, in rank order) of a job of ``world``
    ranks. ``lead``: this process hosts rank 0 and writes the job's records (epochs,
    summary, wandb). Set by subclasses: ``cfg``, ``run_dir``, ``device``, ``world``, ``m``
    (parameters), ``compute``, ``hosted``."""

    cfg: DictConfig
    run_dir: Path
    device: torch.device
    world: int
    m: int
    compute: Any  # the config's compute (measured, or replayed): its ``describe()`` goes into the summary
    hosted: list
    streams: list[Iterator[list]]

    @property
    def lead(self) -> bool:
        return self.hosted[0].rank == 0

    @property
    def rows(self) -> list[dict]:
        """The first hosted rank's rows so far (rank 0's where this process leads)."""
        return self.hosted[0].records.rows

    @property
    def extends(self) -> str | None:
        """The fingerprint of the finished run this job trains longer (``cfg.extends``, set
        by ``gtopk.run.execute``: ``gtopk.records.extension``), whose checkpoint it resumes from;
        None for any other job."""
        node = self.cfg.get("extends")
        return None if node is None else node.get("fingerprint")

    # -- what every kind does alike (local) ---------------------------------------------
    def steps_per_epoch(self) -> int:
        """Steps of one epoch: whole ``grad_accum`` groups of a shard, at most
        ``train.max_iters_per_epoch``."""
        per_epoch = len(self.hosted[0].train_loader) // self.cfg.grad_accum
        cap = self.cfg.train.max_iters_per_epoch
        return min(per_epoch, cap) if cap else per_epoch

    def set_density(self, density: float) -> None:
        for r in self.hosted:
            r.reducer.density = density  # dense and DDP ignore it

    def start(self, epoch: int | None) -> None:
        """The hosted ranks' streams of epoch ``epoch`` (``None``: endless, benchmarks)."""
        self.streams = [r.groups(epoch) for r in self.hosted]

    def before_step(self, it: int) -> None:
        """Fault injection (``fault.*``, tests) before step ``it``."""
        for r in self.hosted:
            r.faults.before_step(it)

    def resume_rows(self, before: int) -> None:
        """Each hosted rank's rows of iterations before ``before`` (checkpointed), from its file."""
        for r in self.hosted:
            r.records.resume(before)

    def record(self, rows: list[dict], logger) -> None:
        """Every hosted rank's row written (rank 0's to wandb), then the step's non-finite
        verdict enforced (``nonfinite=stop``: raised once all are written; the verdict is
        the same on every rank, collective in a distributed job)."""
        stop = None
        attempt = self.cfg.get("attempt", 1)
        for r, row in zip(self.hosted, rows):
            r.records.write(row, attempt, logger if r.rank == 0 else None)
            try:
                r.guard.enforce(row)
            except NonFiniteGradient as e:
                stop = stop or e
        if stop:
            raise stop

    def close(self) -> None:
        for r in self.hosted:
            r.records.close()

    # -- what each kind does its own way --------------------------------------------------
    @abstractmethod
    def describe(self) -> dict:
        """The summary's fields of this kind (``backend`` first)."""

    @abstractmethod
    def step(self, lr: float) -> list[dict]:
        """One step of every hosted rank from its stream (``start``): one row each."""

    @abstractmethod
    def evaluate(self) -> dict:
        """Test loss and top-1 over every rank's test shard."""

    @abstractmethod
    def load(self) -> tuple[int, dict | None]:
        """Resume from the newest complete checkpoint generation: (next epoch, the metrics
        saved with it), or (0, None) when there is none."""

    @abstractmethod
    def save(self, epoch: int, metrics: dict) -> None:
        """Generation ``epoch``: every rank's file, then the manifest."""

    @abstractmethod
    def finish(self) -> list[dict] | None:
        """After the last step: check the ranks' weights agree and return every rank's
        rows where this process leads (None elsewhere)."""

    @abstractmethod
    def weights_sha256(self) -> str:
        """The final weights' fingerprint, with rank 0's buffers (BN statistics)."""


class RealRanks(Ranks):
    """One rank of a distributed job, ``worker``; collective methods: ``step``,
    ``evaluate``, ``load``, ``save``, ``finish`` (every rank calls them in the same order)."""

    def __init__(self, worker: Worker):
        self.w = worker
        self.cfg, self.run_dir, self.device = worker.cfg, worker.run_dir, worker.device
        self.world, self.m, self.compute = worker.world, worker.m, worker.compute
        self.hosted = [worker]
        self.ckpt: Checkpoints | None = None

    def describe(self) -> dict:
        return {"backend": dist.get_backend()}

    def step(self, lr: float) -> list[dict]:
        return [self.w.step(self.streams[0].__next__, lr)]

    def evaluate(self) -> dict:
        return self.w.evaluate()

    def load(self) -> tuple[int, dict | None]:
        """Collective (``Checkpoints.load``)."""
        w = self.w
        self.ckpt = Checkpoints(RunDir(w.run_dir), w.rank, w.world, self.cfg.get("fingerprint"), self.extends)
        start = self.ckpt.load(w)
        return start, self.ckpt.metrics

    def save(self, epoch: int, metrics: dict) -> None:
        """Collective (``Checkpoints.save``); after ``load``."""
        self.ckpt.save(self.w, epoch, metrics)

    def finish(self) -> list[dict] | None:
        """Collective: every reducer must keep the replicas equal (``assert_identical``);
        every rank's rows gathered on rank 0 (all_gather_object)."""
        assert_identical(self.w.model)
        everyone: list = [None] * self.world
        dist.all_gather_object(everyone, self.w.records.rows)
        return [row for rows in everyone for row in rows] if self.lead else None

    def weights_sha256(self) -> str:
        return weights_sha256(self.w.model)
