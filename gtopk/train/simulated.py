"""``cluster=simulated``: a training job's P workers as virtual ranks of ONE process.

``run_simulated`` is the entry of the job's single worker process (``gtopk.run.cluster.
SimulatedCluster`` starts it through the same runner as P real ranks, with the intra-op
thread count a real rank would get). It trains as ``gtopk.train.loop.train`` does, step by
step the same schedule (LR warm-up over P, density warm-up, ``max_iters_per_epoch``),
evaluation, checkpoint per epoch and records: ``iters.rank<i>.jsonl`` per virtual rank,
``epochs.jsonl`` (rank 0's training loss, every rank's test shard), ``summary.json`` with
``weights_sha256`` (rank 0's BN statistics, as a distributed job's rank 0 writes it).
Each step computes the P gradients one after another (``gtopk.train.virtual``), or with
``cluster.batched`` in one vectorised pass per chunk of ranks (``gtopk.train.batched``);
the summary's ``batched`` says which ran.

The result is the distributed run's: in the exact mode (``cluster.batched=false``), for
Top-k and gTop-k the final weights (and every rank's BN statistics, residual and loss) are
bit-identical to ``cluster=local`` with the same seed, P, ``threads_per_worker`` and ``train.loader_workers=0`` (the simulation
always loads in-process; with loader processes a real rank draws its augmentation from
their RNG instead); dense agrees to float rounding (the all-reduce's summation order).
``tests/distributed/test_simulated.py`` checks it for P = 2, 3, 4. The batched mode
agrees to float rounding per step (``tests/unit/test_batched.py``).

Rows: t_data, t_compute, t_check, t_compr, loss and the diagnostics are the rank's own;
t_commu is 0 (nothing is sent; bytes_* and messages_sent are what the rank would send,
from the cost model; the hook baselines' also ``payload_bytes``, from the buckets their
hooks all-reduced, ``baselines.inprocess``); t_update is the step's shared part
(aggregation, the hooks included, and SGD step);
t_iter is the whole step, so ``images_per_s_per_worker`` is batch / step time and P times
it the job's throughput. Not collective: the process needs no process group.
"""

from __future__ import annotations

from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from gtopk.host import heartbeat
from gtopk.records.identity import summary_fields
from gtopk.records.regime import coverage
from gtopk.records.reporting import Progress, WandbLogger
from gtopk.records.rundir import JsonLines, RunDir, read_jsonl, write_json_atomic
from gtopk.records.summary import SIMULATED_BACKEND, environment, summarize
from gtopk.train.faults import NonFiniteGradient
from gtopk.train.loop import _record, pick_device
from gtopk.train.memory import reset_peak_rss
from gtopk.train.recipe import DensitySchedule, LRSchedule
from gtopk.train.state import weights_sha256
from gtopk.train.virtual import SimulatedWorker

BACKEND = SIMULATED_BACKEND  # what records say instead of a torch.distributed backend


def run_simulated(rank: int, world: int, cfg_dict: dict, run_dir: str) -> dict:
    """Entry point of a simulated job's one process (``rank`` 0 of ``world`` 1): trains
    ``cfg.nodes`` virtual ranks and returns the summary. Not collective."""
    cfg = OmegaConf.create(cfg_dict)
    run_dir = Path(run_dir)
    device = pick_device(cfg, 0)
    reset_peak_rss()
    w = SimulatedWorker(int(cfg.nodes), cfg, run_dir, device)
    heartbeat()  # model and data are ready
    meta = {
        "reducer": cfg.reducer_name,
        "model": cfg.model_name,
        "data": cfg.data_name,
        "params": w.m,
        "nodes": w.world,
        "density": cfg.density,
        "mode": cfg.mode,
        "batch_per_worker": cfg.batch_size,
        "grad_accum_steps": cfg.grad_accum,
        "device": str(device),
        "backend": BACKEND,
        "threads_per_worker": torch.get_num_threads(),
        "batched": w.batched is not None,  # the P gradients in one pass (cluster.batched), not one by one
        **summary_fields(cfg),  # the config's fingerprint: what a re-run compares
        **w.compute.describe(),
        **instantiate(cfg.cluster).describe(),
    }
    logger = WandbLogger(cfg, run_dir, meta)
    progress = Progress(enabled=True, every_s=cfg.logger.progress_every_s)
    try:
        train(w, cfg, logger, progress)
        rows = [row for vr in w.ranks for row in vr.rows]
        summary = summarize(rows, meta, cfg.batch_size * cfg.grad_accum, read_jsonl(RunDir(run_dir).epochs))
        summary["weights_identical_across_ranks"] = True  # one set of parameters for all ranks
        with w.active(w.ranks[0]):
            summary["weights_sha256"] = weights_sha256(w.model)
        summary["env"] = environment(str(device), BACKEND)
        write_json_atomic(RunDir(run_dir).summary, summary)
        if logger:
            logger.summary(summary)
        return summary
    finally:
        for vr in w.ranks:
            vr.iters.close()
        if logger:
            logger.finish()


def record_step(w: SimulatedWorker, rows: list[dict], logger) -> None:
    """Every rank's row written (``gtopk.train.loop._record``; rank 0's to wandb), then the
    step's non-finite verdict enforced (it is the same for every rank)."""
    stop = None
    for vr, row in zip(w.ranks, rows):
        try:
            _record(vr, row, logger if vr.rank == 0 else None)
        except NonFiniteGradient as e:
            stop = stop or e
    if stop:
        raise stop


def train(w: SimulatedWorker, cfg: DictConfig, logger, progress: Progress) -> None:
    """``gtopk.train.loop.train`` for the virtual ranks (same schedule, records, resume)."""
    lr_at = LRSchedule(cfg.model.lr, w.world, cfg.model.lr_warmup_epochs, tuple(cfg.model.lr_milestones))
    density_at = DensitySchedule(cfg.density, cfg.train.density_warmup.density, cfg.train.density_warmup.epochs)
    run = RunDir(w.run_dir)
    start, saved = w.load()  # next epoch to run (0 when starting fresh)
    if start:
        progress.show(f"resuming from the checkpoint of epoch {start - 1}", force=True)
    per_epoch = len(w.ranks[0].train_loader) // cfg.grad_accum
    if cfg.train.max_iters_per_epoch:
        per_epoch = min(per_epoch, cfg.train.max_iters_per_epoch)
    epochs_log = JsonLines(run.epochs)
    if saved and saved["epoch"] not in {e.get("epoch") for e in read_jsonl(run.epochs)}:
        epochs_log.write(saved)  # saved, but the last run stopped before recording it
    it_global = start * per_epoch
    for vr in w.ranks:  # the checkpointed epochs' rows count in the summary
        done = {r["iter"]: r for r in read_jsonl(vr.iters.path) if -1 < r.get("iter", -1) < it_global}
        vr.rows = [done[i] for i in sorted(done)]
    for epoch in range(start, cfg.train.epochs):
        for vr in w.ranks:
            vr.reducer.density = density_at(epoch)
        streams, losses = [vr.groups(epoch) for vr in w.ranks], []
        for it in range(per_epoch):
            for vr in w.ranks:
                vr.faults.before_step(it_global)
            rows = w.step([s.__next__ for s in streams], lr_at(epoch, it, per_epoch))
            for vr, row in zip(w.ranks, rows):
                row.update(rank=vr.rank, iter=it_global, epoch=epoch, warmup=it_global < cfg.benchmark.warmup)
            record_step(w, rows, logger)
            losses.append(rows[0]["loss"])
            it_global += 1
            progress.show(f"epoch {epoch + 1}/{cfg.train.epochs} iter {it + 1}/{per_epoch} loss {losses[-1]:.3f}")
        metrics = {"epoch": epoch, "train_loss": sum(losses) / max(1, len(losses)), **w.evaluate()}
        metrics["coverage"] = coverage(w.ranks[0].rows, w.m)  # so far: rank 0's rows of every epoch run
        w.save(epoch, metrics)  # complete (manifest) before the epoch is recorded: never re-run once recorded
        epochs_log.write(metrics)
        progress.show(f"epoch {epoch + 1} done: {metrics}", force=True)
        if logger:
            logger.log(metrics)
    epochs_log.close()
