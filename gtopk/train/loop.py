"""The one training loop shared by every reducer (runs in each worker process).

Per step: forward + backward (over ``grad_accum`` micro-batches), flatten the gradients
into one fp32 vector, ``reducer.reduce`` (collective), unflatten the update into ``.grad``,
SGD step (momentum and weight decay after aggregation). ``mode=benchmark`` times
``benchmark.warmup + benchmark.iters`` steps; ``mode=train`` runs epochs with evaluation,
LR and density schedules, and a checkpoint per epoch.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from gtopk.host import Clock, dilation, heartbeat, one_thread
from gtopk.records.identity import summary_fields
from gtopk.records.regime import coverage
from gtopk.records.reporting import Progress, WandbLogger
from gtopk.records.rundir import JsonLines, RunDir, read_jsonl, write_json_atomic
from gtopk.records.summary import environment, summarize
from gtopk.reducers.base import ReduceRecord
from gtopk.train.backward import Backward
from gtopk.train.budget import timed_steps
from gtopk.train.data import build_loader
from gtopk.train.device import pick_device as pick_device  # re-exported: simulated workers use it
from gtopk.train.faults import FaultInjector, FaultSpec, NonFiniteGuard
from gtopk.train.flatgrad import flat_grads, views_intact
from gtopk.train.memory import peak_rss_mb, reset_peak_rss
from gtopk.train.recipe import DensitySchedule, LRSchedule
from gtopk.train.state import Checkpoints, assert_identical, broadcast_and_check, weights_sha256


class Worker:
    """State of one rank: model, reducer, optimiser, loaders, clocks and record files."""

    def __init__(self, rank: int, world: int, cfg: DictConfig, run_dir: Path, device: torch.device):
        self.rank, self.world, self.cfg, self.run_dir, self.device = rank, world, cfg, run_dir, device
        torch.manual_seed(cfg.seed)
        self.model = instantiate(cfg.model.net).to(device)
        broadcast_and_check(self.model)  # same initial weights everywhere (collective)
        self.reducer = instantiate(cfg.reducer)
        self.reducer.diagnostics = cfg.mode == "train"  # rows: update_nnz, residual_norm, lost_l1
        self.net = self.reducer.wrap(self.model)  # DDP wraps; the others return the model
        # how backward runs: DDP's times the all-reduces it runs from its hooks
        self.backward: Backward = getattr(self.reducer, "hooked_backward", None) or Backward()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.m = sum(p.numel() for p in self.params)
        # one flat gradient; each p.grad is a view of it where possible (gtopk.train.flatgrad)
        self.flat = flat_grads(self.params, device)
        # fused: one kernel per step instead of ~4 ops per tensor (harness overhead: docs/performance.md)
        self.opt = torch.optim.SGD(
            self.params,
            lr=cfg.model.lr,
            momentum=cfg.model.momentum,
            weight_decay=cfg.model.weight_decay,
            fused=True if device.type in ("cpu", "cuda") else None,
        )
        self.clock = Clock(device)
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
        self.iters = JsonLines(RunDir(run_dir).iters(rank))
        self.rows: list[dict] = []  # this rank's per-iteration rows, for the summary
        self.faults = FaultInjector(FaultSpec.from_cfg(cfg.get("fault")), rank)  # fault.* (tests)
        self.guard = NonFiniteGuard(cfg.get("nonfinite", "stop"), rank, world)

    # -- one optimisation step ------------------------------------------------------
    def step(self, fetch, lr: float) -> dict:
        """One step; ``fetch()`` returns the list of micro-batches (timed as t_data)."""
        clock, t = self.clock, {}
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
        t.update(
            t_data=t_data,
            t_compute=t2 - t0 - t_data - in_backward.exposed,
            t_compr=rec.t_compr,
            t_commu=rec.t_commu + in_backward.exposed,  # + what backward could not hide
            t_commu_backward=in_backward.total,  # all-reduce window inside backward, hidden or not
            t_merge=rec.t_merge,
            t_update=(t4 - t3) + (t3 - t2 - t_check - rec.t_compr - rec.t_commu),
            t_iter=t4 - t0,
            t_check=t_check,
            nonfinite_ranks=bad,
            nonfinite=self.guard.action(bad),
            loss=loss_sum,
            lr=lr,
            density=self.reducer.density,
        )
        t.update(
            bytes_sent=rec.bytes_sent, bytes_recv=rec.bytes_recv, messages_sent=rec.messages_sent, selected=rec.selected
        )
        t.update(
            update_nnz=rec.update_nnz,
            residual_norm=rec.residual_norm,
            lost_l1=rec.lost_l1,
            payload_bytes=rec.payload_bytes,
        )
        return t

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

    def groups(self, epoch: int):
        """This epoch's stream of lists of ``grad_accum`` micro-batches."""
        self.sampler.set_epoch(epoch)
        group = []
        for b in self.train_loader:
            group.append(b)
            if len(group) == self.cfg.grad_accum:
                yield group
                group = []

    def endless(self):
        """Epochs chained (benchmark mode); empty batch lists when compute is replayed."""
        if self.train_loader is None:
            yield from itertools.repeat([])
        epoch = 0
        while True:
            yield from self.groups(epoch)
            epoch += 1

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


def run_worker(rank: int, world: int, cfg_dict: dict, run_dir: str) -> dict | None:
    """Entry point of one rank (after the process group exists). Returns the summary on
    rank 0 and None elsewhere."""
    cfg = OmegaConf.create(cfg_dict)
    run_dir = Path(run_dir)
    device = pick_device(cfg, int(os.environ.get("LOCAL_RANK", rank)))
    reset_peak_rss()  # rows record this job's peak RSS (the process may have run other jobs)
    w = Worker(rank, world, cfg, run_dir, device)
    heartbeat()  # model and data are ready
    meta = {
        "reducer": cfg.reducer_name,
        "model": cfg.model_name,
        "data": cfg.data_name,
        "params": w.m,
        "nodes": world,
        "density": cfg.density,
        "mode": cfg.mode,
        "batch_per_worker": cfg.batch_size,
        "grad_accum_steps": cfg.grad_accum,
        "device": str(device),
        "backend": dist.get_backend(),
        **summary_fields(cfg),  # the config's fingerprint: what a re-run compares
        **w.compute.describe(),
        **instantiate(cfg.cluster).describe(),
    }
    logger = WandbLogger(cfg, run_dir, meta) if rank == 0 else None
    progress = Progress(enabled=rank == 0, every_s=cfg.logger.progress_every_s)
    try:
        if cfg.mode == "train":
            train(w, cfg, logger, progress)
        else:
            benchmark(w, cfg, logger, progress)
        assert_identical(w.model)  # collective: every reducer must keep the replicas equal
        rows = gather_rows(w)
        if rank != 0:
            return None
        epochs = read_jsonl(RunDir(run_dir).epochs) if cfg.mode == "train" else None
        summary = summarize(rows, meta, cfg.batch_size * cfg.grad_accum, epochs)
        summary["weights_identical_across_ranks"] = True
        summary["weights_sha256"] = weights_sha256(w.model)
        summary["env"] = environment(str(device), dist.get_backend())
        write_json_atomic(RunDir(run_dir).summary, summary)
        if logger:
            logger.summary(summary)
        return summary
    finally:
        w.iters.close()
        if logger:
            logger.finish()


def gather_rows(w: Worker) -> list[dict]:
    """Every rank's per-iteration rows, on rank 0 (collective: all_gather_object)."""
    everyone: list = [None] * w.world
    dist.all_gather_object(everyone, w.rows)
    return [row for rows in everyone for row in rows]


def _record(w: Worker, row: dict, logger) -> None:
    """Write the step's row (flushed), then stop the job if ``nonfinite=stop`` says so
    (every rank raises: the verdict was collective)."""
    row["attempt"] = w.cfg.get("attempt", 1)
    row["pid"] = os.getpid()  # the worker process (one group of workers runs a sweep's jobs of one P)
    row["rss_peak_mb"] = peak_rss_mb()  # this worker's peak resident memory in this job so far
    row["dilation"] = dilation()  # its t_* are wall seconds / this (gtopk.host: time dilation; 1: real time)
    w.iters.write(row)
    w.rows.append(row)
    heartbeat()
    if logger and not row.get("warmup"):
        logger.log({k: v for k, v in row.items() if isinstance(v, (int, float))})
    w.guard.enforce(row)


def benchmark(w: Worker, cfg: DictConfig, logger, progress: Progress) -> None:
    warmup, timed = cfg.benchmark.warmup, cfg.benchmark.iters
    stream, it = w.endless(), 0
    while it < warmup + timed:
        w.faults.before_step(it)
        row = w.step(stream.__next__, cfg.model.lr)
        row.update(rank=w.rank, iter=it, warmup=it < warmup)
        _record(w, row, logger)
        if it == warmup:  # the first timed step: how many fit in benchmark.budget_s (collective if set)
            timed = timed_steps(row["t_iter"], cfg.benchmark, w.device)
        it += 1
        progress.show(
            f"iter {it}/{warmup + timed} t_iter {row['t_iter']:.3f}s "
            f"{cfg.batch_size * cfg.grad_accum / row['t_iter']:.1f} img/s/worker"
        )


def train(w: Worker, cfg: DictConfig, logger, progress: Progress) -> None:
    lr_at = LRSchedule(cfg.model.lr, w.world, cfg.model.lr_warmup_epochs, tuple(cfg.model.lr_milestones))
    density_at = DensitySchedule(cfg.density, cfg.train.density_warmup.density, cfg.train.density_warmup.epochs)
    run = RunDir(w.run_dir)
    ckpt = Checkpoints(run, w.rank, w.world, cfg.get("fingerprint"))  # generations (gtopk.train.checkpoint)
    start = ckpt.load(w)  # collective: the next epoch to run (0 when starting fresh)
    if start:
        progress.show(f"resuming from the checkpoint of epoch {start - 1}", force=True)
    per_epoch = len(w.train_loader) // cfg.grad_accum
    if cfg.train.max_iters_per_epoch:
        per_epoch = min(per_epoch, cfg.train.max_iters_per_epoch)
    epochs_log = JsonLines(run.epochs) if w.rank == 0 else None
    recorded = {e.get("epoch") for e in read_jsonl(run.epochs)} if epochs_log else set()
    if epochs_log and ckpt.metrics and ckpt.metrics["epoch"] not in recorded:
        epochs_log.write(ckpt.metrics)  # saved, but the last run stopped before recording it
    it_global = start * per_epoch
    # the checkpointed epochs' rows (latest attempt of each iteration) count in the summary,
    # so a resumed job summarises all its epochs, even one interrupted after its last epoch
    done = {r["iter"]: r for r in read_jsonl(w.iters.path) if -1 < r.get("iter", -1) < it_global}
    w.rows = [done[i] for i in sorted(done)]
    for epoch in range(start, cfg.train.epochs):
        w.reducer.density = density_at(epoch)  # dense and DDP ignore it
        stream, losses = w.groups(epoch), []
        for it in range(per_epoch):
            w.faults.before_step(it_global)
            row = w.step(stream.__next__, lr_at(epoch, it, per_epoch))
            row.update(rank=w.rank, iter=it_global, epoch=epoch, warmup=it_global < cfg.benchmark.warmup)
            _record(w, row, logger)
            losses.append(row["loss"])
            it_global += 1
            progress.show(f"epoch {epoch + 1}/{cfg.train.epochs} iter {it + 1}/{per_epoch} loss {row['loss']:.3f}")
        metrics = {"epoch": epoch, "train_loss": sum(losses) / max(1, len(losses)), **w.evaluate()}
        metrics["coverage"] = coverage(w.rows, w.m)  # so far: this rank's rows of every epoch run
        ckpt.save(w, epoch, metrics)  # complete before the epoch is recorded: a recorded epoch is never re-run
        if epochs_log:
            epochs_log.write(metrics)
            progress.show(f"epoch {epoch + 1} done: {metrics}", force=True)
        if logger:
            logger.log(metrics)
    if epochs_log:
        epochs_log.close()
