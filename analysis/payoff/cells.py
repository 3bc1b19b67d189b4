"""The convergence side of one payoff cell, over seeds, and the density each reducer is best at.

* **Seeds.** A reducer's runs at one setup, density and P that differ only in their seed
  each give their own iterations to the target (``iterations_per_seed``); the cell's
  ``iterations_to_target`` is their median (not reached when half or more did not reach
  it), ``iterations_min`` / ``iterations_max`` their spread (``inf`` where a seed did not
  reach it). ``time_min`` / ``time_max`` (in ``payoff.csv``) are these x t_iter.
* **Status.** ``reached`` (the median reached it); otherwise ``budget-limited`` where the
  runs stopped before they could tell: any of them still rising at the end
  (``gtopk.records.regime``: the top-1 trend over the last third of the epochs, slope above
  0 beyond its 95 % interval) or its final coverage below ``BUDGET_COVERAGE`` (most of what
  a sparse reducer held back had not been applied); else ``not reached``.
* **Density.** Per reducer, the trained density that reaches the target soonest at each
  (setup, P, network, compute profile, target) is ``picked`` (``best_rows``: one row per
  reducer with that ``rho``); time to target = iterations x t_iter, both at that density
  (t_iter depends on it through k). Where no density reaches it, the one with the best
  status (budget-limited before not reached), then the highest coverage, is picked.

Pure functions of records and tables; nothing here is collective.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import pandas as pd

from analysis.training import TrainRun, iterations_to
from gtopk.records.summary import SIMULATED_BACKEND

#: below this final coverage a run that did not reach the target is budget-limited
BUDGET_COVERAGE = 5.0
#: a reducer's rows at one cell but for the density: the density is what is picked
PICK = ["model", "data", "batch_per_worker", "grad_accum", "nodes", "network", "compute_profile", "target", "reducer"]
RANK = {"reached": 0, "budget-limited": 1, "not reached": 2, "no time": 3, "no run": 4}


def _seed(r: TrainRun) -> str:
    return "?" if r.seed is None else str(r.seed)


def budget_limited(runs: Sequence[TrainRun]) -> bool:
    """Whether a run that did not reach the target stopped too soon to say so: still rising
    at the end, or final coverage below ``BUDGET_COVERAGE``."""
    return any(r.still_rising or (r.coverage is not None and r.coverage < BUDGET_COVERAGE) for r in runs)


def one_per_seed(runs: Sequence[TrainRun]) -> list[TrainRun]:
    """``runs`` with one run per seed, in seed order: runs of one seed are the same experiment
    however they were run (``cluster=simulated`` and ``cluster=local`` give the same bits in the
    exact mode), so they count once: the one trained longest, real ranks before simulated
    ones on a tie. Runs without a seed are kept, each on its own."""

    def preference(r: TrainRun) -> tuple[int, bool]:
        return (r.curve[-1][1] if r.curve else 0, r.backend != SIMULATED_BACKEND)

    best: dict[int, TrainRun] = {}
    for r in runs:
        if r.seed is not None and (r.seed not in best or preference(r) > preference(best[r.seed])):
            best[r.seed] = r
    return [best[s] for s in sorted(best)] + [r for r in runs if r.seed is None]


def seeds_reach(runs: Sequence[TrainRun], acc: float) -> dict:
    """Iterations to ``acc`` of ``runs`` (one reducer, density, P; one per seed,
    ``one_per_seed``): the median, min, max (inf where a seed did not reach it), per seed, the
    status, the lowest final coverage and whether any was still rising, and a note."""
    runs = one_per_seed(runs)
    its = [iterations_to(r, acc) for r in runs]
    finite = [math.inf if i is None else i for i in its]
    med = statistics.median(finite)
    covs = [r.coverage for r in runs if r.coverage is not None]
    out = {
        "iterations_to_target": med,
        "iterations_min": min(finite),
        "iterations_max": max(finite),
        "iterations_per_seed": "; ".join(f"seed {_seed(r)}: {'-' if i is None else i}" for r, i in zip(runs, its)),
        "seeds": len(runs),
        "coverage": min(covs) if covs else math.nan,
        "still_rising": any(bool(r.still_rising) for r in runs),
    }
    if not math.isinf(med):
        out.update(status="reached", note=f"{sum(i is not None for i in its)}/{len(runs)} runs reached it")
        return out
    note = f"best top-1 {max(r.best_acc for r in runs):.4f} < {acc:.4f}"
    if budget_limited(runs):
        cov = f"coverage {out['coverage']:.3g}" if covs else "coverage unknown"
        rising = "still rising" if out["still_rising"] else "not rising"
        out.update(status="budget-limited", note=f"{note}; {cov}, {rising} at the end")
    else:
        out.update(status="not reached", note=note)
    return out


def pick_density(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (payoff.csv's rows) with ``picked``: True on the row of each reducer's best
    trained density per cell (see the module docstring). A reducer without a density
    (dense, DDP) repeats one row per density; its first is picked."""
    key = df.assign(
        _rank=df["status"].map(RANK).fillna(len(RANK)),
        _time=df["time_to_target"].fillna(math.inf),
        _cov=-df["coverage"].fillna(-math.inf) if "coverage" in df else 0.0,
    )
    order = key.sort_values(["_rank", "_time", "_cov", "density"], kind="stable")
    best = order.groupby(PICK, sort=False, dropna=False).head(1).index
    out = df.copy()
    out["picked"] = out.index.isin(best)
    return out


def best_rows(df: pd.DataFrame) -> pd.DataFrame:
    """``payoff_best.csv``: the picked rows, with ``rho`` (the picked density; empty for a
    reducer that does not sparsify) and ``densities`` (those it was trained at)."""
    trained = df.groupby(PICK, dropna=False)["density"].apply(lambda s: ", ".join(f"{d:g}" for d in sorted(set(s))))
    best = df[df["picked"]].copy()
    best["rho"] = best["density"].where(best["reducer_density"].notna())
    best = best.merge(trained.rename("densities").reset_index(), on=PICK, how="left")
    return best.drop(columns=["density", "picked"])
