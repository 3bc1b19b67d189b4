"""One rank's per-iteration rows: what a step records and where, for real and virtual ranks.

``step_row`` is the one builder of a step's row (``gtopk.train.worker.Worker.step`` for a
real rank, ``gtopk.simulated.worker.SimulatedWorker.aggregate`` for each virtual rank):
the same keys in the same order whichever ranks trained. ``RankRows`` is where one rank's
rows go: its ``iters.rank<i>.jsonl`` (each row flushed as it is written) and the list the
job's summary is computed from; ``RankRows.end_of_job`` adds what the rank knows only at
the end (its memory, ``gtopk.train.memory.rank_memory``) to its last row in that list,
which reaches the summary with the others. Nothing here is collective.
"""

from __future__ import annotations

import os
from pathlib import Path

from gtopk.host import dilation, heartbeat
from gtopk.records.rundir import JsonLines, RunDir, read_jsonl
from gtopk.reducers.outcome import ReduceRecord
from gtopk.train.memory import peak_rss_mb


def step_row(
    rec: ReduceRecord,
    *,
    t_data: float,
    t_compute: float,
    t_commu: float,
    t_commu_backward: float,
    t_update: float,
    t_iter: float,
    t_check: float,
    bad: list[int],
    action: str | None,
    loss: float | None,
    lr: float,
    density: float,
) -> dict:
    """One rank's row of one step: its times (``t_compr`` and ``t_merge`` from the
    reducer's record ``rec``), the step's non-finite verdict (``bad``: the ranks whose
    gradient held NaN or Inf; ``action``: what ``nonfinite`` did about it), its loss, the
    LR and density in force, and the record's traffic and diagnostics."""
    return {
        "t_data": t_data,
        "t_compute": t_compute,
        "t_compr": rec.t_compr,
        "t_commu": t_commu,
        "t_commu_backward": t_commu_backward,  # DDP: its all-reduce window inside backward, hidden or not
        "t_merge": rec.t_merge,
        "t_update": t_update,
        "t_iter": t_iter,
        "t_check": t_check,
        "nonfinite_ranks": bad,
        "nonfinite": action,
        "loss": loss,
        "lr": lr,
        "density": density,
        "bytes_sent": rec.bytes_sent,
        "bytes_recv": rec.bytes_recv,
        "messages_sent": rec.messages_sent,
        "selected": rec.selected,
        "update_nnz": rec.update_nnz,
        "residual_norm": rec.residual_norm,
        "lost_l1": rec.lost_l1,
        "payload_bytes": rec.payload_bytes,
    }


class RankRows:
    """Rank ``rank``'s rows: ``iters.rank<rank>.jsonl`` of ``run_dir`` (appended to: the
    attempts of a job share it) and ``rows``, those of this job that its summary counts."""

    def __init__(self, run_dir: Path, rank: int):
        self.rank = rank
        self.iters = JsonLines(RunDir(run_dir).iters(rank))
        self.rows: list[dict] = []

    def resume(self, before: int) -> None:
        """``rows``: the file's rows of iterations ``0 .. before - 1`` (the checkpointed
        epochs', the latest attempt of each), so that a resumed job summarises all its
        epochs, even one interrupted after its last epoch."""
        done = {r["iter"]: r for r in read_jsonl(self.iters.path) if -1 < r.get("iter", -1) < before}
        self.rows = [done[i] for i in sorted(done)]

    def write(self, row: dict, attempt: int, logger=None) -> None:
        """Complete ``row`` with what the process knows (attempt, pid, peak memory, time
        dilation), write it (flushed), keep it; ``logger`` (wandb) gets its numbers unless
        it is a warm-up step's."""
        row["attempt"] = attempt
        row["pid"] = os.getpid()  # the worker process (one group of workers runs a sweep's jobs of one P)
        row["rss_peak_mb"] = peak_rss_mb()  # this worker's peak resident memory in this job so far
        row["dilation"] = dilation()  # its t_* are wall seconds / this (gtopk.host: time dilation; 1: real time)
        self.iters.write(row)
        self.rows.append(row)
        heartbeat()
        if logger and not row.get("warmup"):
            logger.log({k: v for k, v in row.items() if isinstance(v, (int, float))})

    def end_of_job(self, facts: dict) -> None:
        """Add ``facts`` (the rank's memory at the end of the job) to its last row of this
        job, in ``rows`` only (its file keeps the step's row as written): the rows reach
        the summary (``gtopk.records.summary.summarize``) and carry them there."""
        if self.rows and facts:
            self.rows[-1].update(facts)

    def close(self) -> None:
        self.iters.close()
