"""One real rank: its model, reducer, optimiser, data shard, clocks and records, and its step.

Per step: forward + backward (over ``grad_accum`` micro-batches), flatten the gradients
into one fp32 vector, ``reducer.reduce`` (collective), unflatten the update into ``.grad``,
SGD step (momentum and weight decay after aggregation). The driver that runs the steps,
epochs and records is ``gtopk.train.loop`` (through ``gtopk.train.ranks.RealRanks``).

``Replica`` (the parameters, flat gradient and SGD step every rank holds alike) and
``micro_batches`` (a rank's stream of micro-batch lists) are shared with the simulated
cluster's virtual ranks (``gtopk.simulated.worker``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import DictConfig

from gtopk.host import Clock, heartbeat, one_thread
from gtopk.reducers.backward import Backward
from gtopk.reducers.outcome import ReduceRecord
from gtopk.train.data import build_loader
from gtopk.train.faults import FaultInjector, FaultSpec, NonFiniteGuard
from gtopk.train.flatgrad import flat_grads, views_intact
from gtopk.train.rows import RankRows, step_row
from gtopk.train.state import broadcast_and_check


def micro_batches(loader, sampler, epoch: int | None, grad_accum: int) -> Iterator[list]:
    """A rank's stream of lists of ``grad_accum`` micro-batches: epoch ``epoch`` of its
    shard, or (``None``: benchmarks) epochs chained without end; empty lists when it has
    no loader (replayed compute). Local."""
    if loader is None:
        yield from itertools.repeat([])
    for e in itertools.count() if epoch is None else (epoch,):
        sampler.set_epoch(e)
        group = []
        for b in loader:
            group.append(b)
            if len(group) == grad_accum:
                yield group
                group = []


class Replica:
    """What every rank holds alike: the trainable parameters of ``self.model``, one flat
    gradient whose views they use, the fused SGD optimiser and the clock (``replicate``),
    and the SGD step (``apply``). Local."""

    model: torch.nn.Module

    def replicate(self, cfg: DictConfig, device: torch.device) -> None:
        """Set ``params``, ``m``, ``flat``, ``opt`` and ``clock`` for ``self.model``."""
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.m = sum(p.numel() for p in self.params)
        # one flat gradient; each p.grad is a view of it where possible (gtopk.train.flatgrad)
        self.flat = flat_grads(self.params, device)
        # fused: one kernel per step instead of ~4 ops per tensor (harness overhead: docs/performance.md)
        self.opt = torch.optim.SGD(
            self.params,
            lr=float(cfg.model.lr),  # floats: an integer beyond int64 (e.g. 10**29) is a valid setting
            momentum=float(cfg.model.momentum),
            weight_decay=float(cfg.model.weight_decay),
            fused=True if device.type in ("cpu", "cuda") else None,
        )
        self.clock = Clock(device)

    def apply(self, update: torch.Tensor, lr: float) -> None:
        """Unflatten ``update`` into the gradients and take the SGD step (on one intra-op
        thread for models under 2^22 parameters: its ops are too short to gain from more,
        and on a busy CPU each one could stall for a descheduled thread, up to 0.3 s per
        step for ResNet-20 on 2 cores)."""
        with one_thread(self.m < 1 << 22):
            offset = 0
            in_grads = update is self.flat and views_intact(self.params, self.flat)  # nothing to copy
            for p in [] if in_grads else self.params:
                n = p.numel()
                p.grad.copy_(update[offset : offset + n].view_as(p))
                offset += n
            for group in self.opt.param_groups:
                group["lr"] = lr
            self.opt.step()


class Worker(Replica):
    """State of one rank: model, reducer, optimiser, loaders, clocks and record file."""

    def __init__(self, rank: int, world: int, cfg: DictConfig, run_dir: Path, device: torch.device):
        """Collective: the initial weights are checked (and broadcast) across the ranks."""
        self.rank, self.world, self.cfg, self.run_dir, self.device = rank, world, cfg, run_dir, device
        torch.manual_seed(cfg.seed)
        self.model = instantiate(cfg.model.net).to(device)
        broadcast_and_check(self.model)  # same initial weights everywhere (collective)
        self.reducer = instantiate(cfg.reducer)
        self.reducer.diagnostics = cfg.mode == "train"  # rows: update_nnz, residual_norm, lost_l1
        self.net = self.reducer.wrap(self.model)  # DDP wraps; the others return the model
        if world == 1 and hasattr(self.reducer, "time_hook_alone"):  # PowerSGD: its hook's arithmetic, timed
            self.reducer.time_hook_alone(self.model, instantiate(cfg.data).sample_shape())
        # how backward runs: DDP's times the all-reduces it runs from its hooks
        self.backward: Backward = getattr(self.reducer, "hooked_backward", None) or Backward()
        self.replicate(cfg, device)
        self.compute = instantiate(cfg.compute)  # measured forward/backward, or a replay
        self.compute.prepare(self)
        self.train_loader = self.test_loader = self.sampler = None
        if self.compute.needs_data:
            train_set, test_set = instantiate(cfg.data).datasets()
            workers = cfg.train.loader_workers if cfg.mode == "train" else 0
            pin = device.type == "cuda"  # page-locked batches only for a GPU
            self.train_loader, self.sampler = build_loader(
                train_set, cfg.batch_size, rank, world, True, cfg.seed, workers, pin
            )
            self.test_loader, _ = build_loader(test_set, cfg.batch_size, rank, world, False, cfg.seed, workers, pin)
        self.records = RankRows(run_dir, rank)  # this rank's iters.rank<i>.jsonl and rows
        self.faults = FaultInjector(FaultSpec.from_cfg(cfg.get("fault")), rank)  # fault.* (tests)
        self.guard = NonFiniteGuard(cfg.get("nonfinite", "stop"), rank, world)

    def step(self, fetch, lr: float) -> dict:
        """Collective (the non-finite check, the reduce). One step; ``fetch()`` returns the
        list of micro-batches (timed as t_data). Returns the step's row (``step_row``)."""
        clock = self.clock
        t0 = clock()
        self.opt.zero_grad(set_to_none=False)
        t_data, loss_sum = self.compute.gradient(self, fetch)  # forward/backward or its replay
        t2 = clock()
        if not views_intact(self.params, self.flat):
            torch.cat([p.grad.reshape(-1) for p in self.params], out=self.flat)
        self.faults.on_gradient(self.flat)
        bad = self.guard.check(self.flat)  # collective: the same verdict on every rank
        t_check = clock() - t2
        update, rec = (None, ReduceRecord()) if bad else self.reducer.reduce(self.flat, out=self.flat)
        t3 = clock()
        if not bad:  # a step with a non-finite gradient applies nothing, on every rank
            self.apply(update, lr)
        t4 = clock()
        in_backward = self.backward.take()  # communication inside the backward passes (DDP)
        return step_row(
            rec,
            t_data=t_data,
            t_compute=t2 - t0 - t_data - in_backward.exposed,
            t_commu=rec.t_commu + in_backward.exposed,  # + what backward could not hide
            t_commu_backward=in_backward.total,
            t_update=(t4 - t3) + (t3 - t2 - t_check - rec.t_compr - rec.t_commu),
            t_iter=t4 - t0,
            t_check=t_check,
            bad=bad,
            action=self.guard.action(bad),
            loss=loss_sum,
            lr=lr,
            density=self.reducer.density,
        )

    def groups(self, epoch: int | None) -> Iterator[list]:
        """This epoch's stream of lists of ``grad_accum`` micro-batches (``None``: endless)."""
        return micro_batches(self.train_loader, self.sampler, epoch, self.cfg.grad_accum)

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Test loss and top-1 over all ranks' partitions (collective: all_reduce)."""
        self.net.eval()
        sums = torch.zeros(3, device=self.device, dtype=torch.float64)
        for x, y in self.test_loader:
            x, y = x.to(self.device), y.to(self.device)
            out = self.net(x)
            sums += torch.tensor(
                [F.cross_entropy(out, y, reduction="sum").item(), (out.argmax(1) == y).sum().item(), y.numel()],
                device=self.device,
                dtype=torch.float64,
            )
            heartbeat()
        self.net.train()
        dist.all_reduce(sums)
        return {"test_loss": (sums[0] / sums[2]).item(), "test_top1": (sums[1] / sums[2]).item()}
