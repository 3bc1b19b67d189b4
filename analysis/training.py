"""The convergence side of ``analysis.payoff``: finished training runs (``mode=train``), the
iterations each needed to reach a target top-1 accuracy, and the targets themselves.

Iterations are counted at epoch resolution: a run *reaches* a target at the end of the first
epoch whose ``test_top1`` (``epochs.jsonl``) is at least the target, and needed every
iteration up to that epoch's last (``iter`` + 1 of the last row of that epoch in
``iters.rank0.jsonl``; iterations are numbered globally from 0, resumed jobs included).
Nothing is interpolated between epochs, so it is an upper bound by less than one epoch.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from analysis.reducers import conf_reducers, declared
from gtopk.records.regime import accuracy_trend, coverage
from gtopk.records.rundir import RunDir, read_jsonl, run_dirs
from gtopk.records.summary import SIMULATED_BACKEND

#: t_data, t_compr and the rest of the iteration (update, flattening, check) per step
OVERHEADS = ("t_data", "t_compr", "t_update")


@dataclass
class TrainRun:
    """One finished training job: what identifies it, and its convergence curve."""

    run_dir: Path
    model: str
    data: str
    nodes: int
    reducer_name: str
    reducer_cfg: dict
    label: str  # reducer name + its settings that differ from conf/reducer/<name>.yaml
    density: float | None  # None for reducers that send every entry
    batch: int
    accum: int
    params: int
    curve: list[tuple[int, int, float]]  # (epoch, iterations done at its end, test_top1)
    overheads: dict = field(default_factory=dict)  # medians of its own post-warm-up steps
    seed: int | None = None
    coverage: float | None = None  # final coverage (gtopk.records.regime); None when unknown
    still_rising: bool | None = None  # the test top-1 trend at the end; None: too few epochs
    backend: str | None = None  # the summary's (``SIMULATED_BACKEND``: P virtual ranks in one process)

    @property
    def setup(self) -> tuple[str, str, int, int]:
        """Runs of one setup (model, data, per-worker batch, accumulation) are compared."""
        return (self.model, self.data, self.batch, self.accum)

    @property
    def exact_average(self) -> bool:
        """Its update is the exact average of the gradients (dense S-SGD, DDP: what the class
        its config names declares): its final accuracy is the relative target's, and the
        reference baseline borrows its iterations (the same update)."""
        return declared(self.reducer_name, self.reducer_cfg).exact_average

    @property
    def final_acc(self) -> float:
        return self.curve[-1][2]

    @property
    def best_acc(self) -> float:
        return max(acc for _, _, acc in self.curve)


def reducer_label(name: str, cfg: dict) -> str:
    """``name`` plus ``key=value`` for each setting (density aside) that differs from the
    reducer's default config, e.g. ``gtopk putback=exact``."""
    defaults = conf_reducers().get(name, {})
    diff = [
        f"{k}={v}"
        for k, v in sorted(cfg.items())
        if k not in ("_target_", "density") and (k not in defaults or defaults[k] != v)
    ]
    return " ".join([name, *diff])


def iterations_by_epoch(rows: Iterable[dict]) -> dict[int, int]:
    """Iterations done at the end of each epoch: 1 + the largest ``iter`` of the rows of
    that epoch or an earlier one."""
    last: dict[int, int] = {}
    for r in rows:
        if "epoch" in r and "iter" in r and int(r["iter"]) >= 0:
            last[int(r["epoch"])] = max(last.get(int(r["epoch"]), -1), int(r["iter"]))
    out, done = {}, 0
    for e in sorted(last):
        done = max(done, last[e] + 1)
        out[e] = done
    return out


def own_overheads(d: RunDir, summary: dict | None = None) -> dict:
    """Medians of t_data, t_compr and the rest of the step over rank 0's post-warm-up rows
    at the run's final density (the density warm-up epochs select more entries): rank 0's
    only, because an archived run keeps rank 0's rows alone (``gtopk.records.archive``), so
    a run folder and its restored archive give the same overheads, and so the same payoff. The
    rest is t_iter less the named parts, except in a simulated run (``cluster=simulated``),
    whose t_iter is the step of all P ranks: there it is the rows' ``t_update``, the step's
    aggregation and SGD step (t_iter less one rank's parts would count the other P - 1
    ranks' gradients as overhead). ``summary``: the run's, when the
    caller has read it."""
    rows = [r for r in read_jsonl(d.iters(0)) if not r.get("warmup") and "t_iter" in r]
    if not rows:
        return {}
    final = rows[-1].get("density")
    rows = [r for r in rows if r.get("density") == final]
    if summary is None:
        summary = d.summary_if_readable() or {}
    simulated = summary.get("backend") == SIMULATED_BACKEND
    if simulated:
        rest = [r["t_update"] for r in rows]
    else:
        rest = [r["t_iter"] - r["t_data"] - r["t_compute"] - r["t_compr"] - r["t_commu"] for r in rows]
    return {
        "t_data": statistics.median(r["t_data"] for r in rows),
        "t_compr": statistics.median(r["t_compr"] for r in rows),
        "t_update": max(0.0, statistics.median(rest)),
    }


def regime(d: RunDir, rows: Sequence[dict] | None = None, epochs: Sequence[dict] | None = None) -> dict:
    """Where a training run stands (``gtopk.records.regime``): ``coverage``, final, from
    ``summary.json``, else the last ``epochs.jsonl`` row that carries it (coverage so far),
    else computed from the iteration rows' ``update_nnz`` (``rows``: rank 0's, read when not
    given) with ``params`` from the summary, else None (runs recorded before coverage, or
    without diagnostics); ``still_rising``: the summary's ``top1_still_rising``, else the
    trend of the epochs' test top-1 (None with fewer than 3 epochs)."""
    summary = d.summary_if_readable() or {}
    epochs = list(read_jsonl(d.epochs)) if epochs is None else list(epochs)
    cov = summary.get("coverage")
    if cov is None:
        cov = next((e["coverage"] for e in reversed(epochs) if e.get("coverage") is not None), None)
    if cov is None and summary.get("params"):
        rows = list(read_jsonl(d.iters(0))) if rows is None else rows
        if any(r.get("update_nnz") is not None for r in rows):
            cov = coverage([r for r in rows if "iter" in r], int(summary["params"]))
    if "top1_still_rising" in summary:
        rising = summary["top1_still_rising"]
    else:
        fit = accuracy_trend(epochs)
        rising = None if fit is None else bool(fit["rising"])
    return {"coverage": None if cov is None else float(cov), "still_rising": rising}


def trend_word(still_rising: bool | None) -> str:
    """The trend verdict in the tables: ``still rising``, ``flat`` or empty (too few epochs)."""
    return "" if still_rising is None else ("still rising" if still_rising else "flat")


def read_run(d: RunDir) -> TrainRun:
    """A finished training job's record; a ValueError names a record that is missing a part."""
    cfg, summary = d.read_config(), d.read_summary()
    epochs = {int(e["epoch"]): e for e in read_jsonl(d.epochs) if "test_top1" in e}
    if not epochs:
        raise ValueError(f"{d.epochs} holds no epoch with test_top1")
    done = iterations_by_epoch(read_jsonl(d.iters(0)))
    missing = sorted(set(epochs) - set(done))
    if missing:
        raise ValueError(f"{d.iters(0)} has no iteration rows of epochs {missing}: cannot count iterations")
    reducer_cfg = dict(cfg["reducer"])
    state = regime(d)
    return TrainRun(
        run_dir=d.path,
        model=cfg["model_name"],
        data=cfg["data_name"],
        nodes=int(cfg["nodes"]),
        reducer_name=cfg["reducer_name"],
        reducer_cfg=reducer_cfg,
        label=reducer_label(cfg["reducer_name"], reducer_cfg),
        density=float(reducer_cfg["density"]) if "density" in reducer_cfg else None,
        batch=int(cfg["batch_size"]),
        accum=int(cfg["grad_accum"]),
        params=int(summary["params"]),
        curve=[(e, done[e], float(epochs[e]["test_top1"])) for e in sorted(epochs)],
        overheads=own_overheads(d, summary),
        seed=None if cfg.get("seed") is None else int(cfg["seed"]),
        coverage=state["coverage"],
        still_rising=state["still_rising"],
        backend=summary.get("backend"),
    )


def load_train_runs(roots: Sequence[str | Path]) -> tuple[list[TrainRun], list[str]]:
    """Finished training jobs under ``roots``, and one line per training job left out
    (unfinished or failed: their curve may stop before the target)."""
    runs, skipped = [], []
    for d in run_dirs(roots):
        if not d.epochs.exists():
            continue
        if not d.is_finished:
            skipped.append(f"{d.path}: not finished ({'failed' if d.has_failed else 'running or interrupted'})")
            continue
        try:
            runs.append(read_run(d))
        except ValueError as e:  # a record with a part missing or unreadable (CorruptRecord too)
            skipped.append(f"{d.path}: {str(e).splitlines()[0]}")
    return runs, skipped


def iterations_to(run: TrainRun, acc: float) -> int | None:
    """Iterations done at the end of the first epoch with test_top1 >= ``acc``; None when
    no epoch reached it."""
    return next((it for _, it, a in run.curve if a >= acc), None)


@dataclass(frozen=True)
class Target:
    """A target top-1: ``relative`` x the final accuracy of the dense runs at the same
    setup and P, or an ``absolute`` accuracy."""

    relative: float | None = None
    absolute: float | None = None

    @property
    def name(self) -> str:
        if self.relative is not None:
            return f"{round(self.relative * 100, 6):g} % of dense"
        return f"top-1 {self.absolute:g}"

    def accuracy(self, runs: Sequence[TrainRun]) -> float | None:
        """The accuracy to reach among ``runs`` (one setup and P); None when relative and
        there is no dense run among them."""
        if self.absolute is not None:
            return self.absolute
        finals = [r.final_acc for r in runs if r.exact_average]
        return self.relative * statistics.median(finals) if finals else None
