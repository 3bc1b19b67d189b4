"""The one training loop, for real and simulated ranks alike.

``run`` drives the ranks a process hosts (``gtopk.train.ranks.Ranks``): one rank of a
distributed job (``RealRanks``; entry ``run_worker``, in each worker process) or all P
ranks of a ``cluster=simulated`` job in one process (``gtopk.simulated.ranks.
SimulatedRanks``; entry ``gtopk.simulated.ranks.run_simulated``). ``mode=benchmark`` times
``benchmark.warmup + benchmark.iters`` steps (``benchmark``); ``mode=train`` runs epochs
with the LR and density schedules, evaluation and a checkpoint per epoch (``train``). Both
write one row per rank and step (``iters.rank<i>.jsonl``, ``gtopk.train.rows``); ``run``
writes the job's metadata and ``summary.json`` (``job_meta``, ``summarize``).

Collective where the ranks' methods are (a distributed job: every rank runs the same
calls in the same order); a simulated job needs no process group.
"""

from __future__ import annotations

import os
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from gtopk.host import heartbeat
from gtopk.records.identity import quarantine, summary_fields
from gtopk.records.regime import coverage
from gtopk.records.reporting import Progress, WandbLogger
from gtopk.records.rundir import JsonLines, RunDir, read_jsonl, write_json_atomic
from gtopk.records.summary import environment, summarize
from gtopk.train.budget import timed_steps
from gtopk.train.device import pick_device
from gtopk.train.memory import rank_memory, reset_peak_rss
from gtopk.train.ranks import Ranks, RealRanks
from gtopk.train.recipe import schedules
from gtopk.train.worker import Worker


def run_worker(rank: int, world: int, cfg_dict: dict, run_dir: str) -> dict | None:
    """Entry point of one rank of a distributed job (after the process group exists).
    Collective. Returns the summary on rank 0 and None elsewhere."""
    cfg = OmegaConf.create(cfg_dict)
    device = pick_device(cfg, int(os.environ.get("LOCAL_RANK", rank)))
    reset_peak_rss()  # rows record this job's peak RSS (the process may have run other jobs)
    return run(RealRanks(Worker(rank, world, cfg, Path(run_dir), device)))


def job_meta(ranks: Ranks) -> dict:
    """What the summary (and wandb's run config) says about the job, whichever ranks run it."""
    cfg = ranks.cfg
    return {
        "reducer": cfg.reducer_name,
        "model": cfg.model_name,
        "data": cfg.data_name,
        "params": ranks.m,
        "nodes": ranks.world,
        "density": cfg.density,
        "mode": cfg.mode,
        "batch_per_worker": cfg.batch_size,
        "grad_accum_steps": cfg.grad_accum,
        "device": str(ranks.device),
        **ranks.describe(),  # backend, and the simulated cluster's own fields
        **summary_fields(cfg),  # the config's fingerprint: what a re-run compares
        **ranks.compute.describe(),
        **instantiate(cfg.cluster).describe(),
    }


def run(ranks: Ranks) -> dict | None:
    """Train or benchmark ``ranks`` as ``cfg.mode`` says, then write the summary where
    this process leads (returned; None elsewhere)."""
    cfg = ranks.cfg
    heartbeat()  # model and data are ready
    meta = job_meta(ranks)
    logger = WandbLogger(cfg, ranks.run_dir, meta) if ranks.lead else None
    progress = Progress(enabled=ranks.lead, every_s=cfg.logger.progress_every_s)
    try:
        if cfg.mode == "train":
            train(ranks, cfg, logger, progress)
        else:
            benchmark(ranks, cfg, logger, progress)
        memory = rank_memory()  # once per process (a simulated job's ranks share it): /proc/self/smaps_rollup
        for r in ranks.hosted:
            r.records.end_of_job(memory)
        rows = ranks.finish()  # collective in a distributed job
        if not ranks.lead:
            return None
        epochs = read_jsonl(RunDir(ranks.run_dir).epochs) if cfg.mode == "train" else None
        summary = summarize(rows, meta, cfg.batch_size * cfg.grad_accum, epochs)
        summary["weights_identical_across_ranks"] = True
        summary["weights_sha256"] = ranks.weights_sha256()
        summary["env"] = environment(str(ranks.device), meta["backend"])
        write_json_atomic(RunDir(ranks.run_dir).summary, summary)
        if logger:
            logger.summary(summary)
        return summary
    finally:
        ranks.close()
        if logger:
            logger.finish()


def benchmark(ranks: Ranks, cfg: DictConfig, logger, progress: Progress) -> None:
    """``benchmark.warmup`` steps, then ``benchmark.iters`` timed ones (or as many as fit in
    ``benchmark.budget_s``), over the shards' epochs chained."""
    warmup, timed = cfg.benchmark.warmup, cfg.benchmark.iters
    ranks.start(None)
    it = 0
    while it < warmup + timed:
        ranks.before_step(it)
        rows = ranks.step(cfg.model.lr)
        for r, row in zip(ranks.hosted, rows):
            row.update(rank=r.rank, iter=it, warmup=it < warmup)
        ranks.record(rows, logger)
        if it == warmup:  # the first timed step: how many fit in benchmark.budget_s (collective if set)
            timed = timed_steps(rows[0]["t_iter"], cfg.benchmark, ranks.device)
        it += 1
        progress.show(
            f"iter {it}/{warmup + timed} t_iter {rows[0]['t_iter']:.3f}s "
            f"{cfg.batch_size * cfg.grad_accum / rows[0]['t_iter']:.1f} img/s/worker"
        )


def train(ranks: Ranks, cfg: DictConfig, logger, progress: Progress) -> None:
    """Epochs from the last checkpoint on: steps under the LR and density schedules, then
    evaluation, the checkpoint generation, and the epoch's row in ``epochs.jsonl``."""
    lr_at, density_at = schedules(cfg, ranks.world)  # what a job trained longer compares (gtopk.records.extension)
    run_dir = RunDir(ranks.run_dir)
    start, saved = ranks.load()  # the next epoch to run (0 when starting fresh; gtopk.train.checkpoint)
    if start:
        progress.show(f"resuming from the checkpoint of epoch {start - 1}", force=True)
    per_epoch = ranks.steps_per_epoch()
    epochs_log = JsonLines(run_dir.epochs) if ranks.lead else None
    recorded = {e.get("epoch") for e in read_jsonl(run_dir.epochs)} if epochs_log else set()
    stale = sorted(e for e in recorded if isinstance(e, int) and e >= start)
    if epochs_log and stale:  # epochs whose checkpoint is unreadable: they run again, recorded once
        kept = [e for e in read_jsonl(run_dir.epochs) if isinstance(e.get("epoch"), int) and e["epoch"] < start]
        epochs_log.close()
        quarantine(run_dir.epochs, f"{run_dir.epochs} records epochs {stale} that no readable checkpoint holds")
        epochs_log = JsonLines(run_dir.epochs)
        for e in kept:
            epochs_log.write(e)
        recorded = {e["epoch"] for e in kept}
    if epochs_log and saved and saved["epoch"] not in recorded:
        epochs_log.write(saved)  # saved, but the last run stopped before recording it
    it_global = start * per_epoch
    # the checkpointed epochs' rows (latest attempt of each iteration) count in the summary,
    # so a resumed job summarises all its epochs, even one interrupted after its last epoch
    ranks.resume_rows(it_global)
    for epoch in range(start, cfg.train.epochs):
        ranks.set_density(density_at(epoch))
        ranks.start(epoch)
        losses = []
        for it in range(per_epoch):
            ranks.before_step(it_global)
            rows = ranks.step(lr_at(epoch, it, per_epoch))
            for r, row in zip(ranks.hosted, rows):
                row.update(rank=r.rank, iter=it_global, epoch=epoch, warmup=it_global < cfg.benchmark.warmup)
            ranks.record(rows, logger)
            losses.append(rows[0]["loss"])  # the first hosted rank's (rank 0's where this process leads)
            it_global += 1
            progress.show(f"epoch {epoch + 1}/{cfg.train.epochs} iter {it + 1}/{per_epoch} loss {losses[-1]:.3f}")
        metrics = {"epoch": epoch, "train_loss": sum(losses) / max(1, len(losses)), **ranks.evaluate()}
        metrics["coverage"] = coverage(ranks.rows, ranks.m)  # so far: the first hosted rank's rows of every epoch
        ranks.save(epoch, metrics)  # complete before the epoch is recorded: a recorded epoch is never re-run
        if epochs_log:
            epochs_log.write(metrics)
            progress.show(f"epoch {epoch + 1} done: {metrics}", force=True)
        if logger:
            logger.log(metrics)
    if epochs_log:
        epochs_log.close()
