"""Where a training run stands: how much of its gradient it could have applied
(``coverage``) and whether its accuracy was still rising when it stopped (``trend``).

* **Coverage** = the sum over iterations of ``update_nnz / m``, ``m`` the model's parameter
  count: how many times, on average, each coordinate could have been updated. A sparse
  reducer with error feedback applies per step only the coordinates its update holds
  (gTop-k: k = rho * m; Top-k: the union of the P selections) and keeps the rest in the
  residuals, so at coverage below 1 most of what it held back has not been applied yet.
  Dense and DDP write every coordinate: their coverage is the number of iterations. A
  step skipped for a non-finite gradient applied nothing and adds 0; a row without
  ``update_nnz`` (records taken without diagnostics) counts as a dense step.
* **Trend** = the least-squares slope of a metric against the epoch over the last part of
  training (``accuracy_trend``: test top-1 over the last third of the epochs, at least 3),
  with its standard error and the residual noise; ``rising`` says the slope is positive
  beyond noise: its two-sided 95 % t-interval (n - 2 degrees of freedom) lies above 0.
  ``trend`` itself takes any series, e.g. the accuracy gap to a dense run per epoch.

Pure functions of the records; nothing here is collective.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

#: the part of the epochs the accuracy trend looks at (the last third), and the fewest points
TREND_PART = 1 / 3
TREND_MIN_POINTS = 3
CONFIDENCE = 0.95


def step_coverage(row: dict, m: int) -> float:
    """One iteration's ``update_nnz / m`` (see the module docstring for skipped steps and
    rows without ``update_nnz``)."""
    if row.get("nonfinite"):
        return 0.0
    nnz = row.get("update_nnz")
    return 1.0 if nnz is None else nnz / m


def coverage(rows: Iterable[dict], m: int) -> float:
    """Coverage of the iterations in ``rows`` (one or more ranks' rows, warm-up included;
    each iteration counted once, from its lowest rank's row: every rank applies the same
    update)."""
    if m <= 0:
        raise ValueError(f"coverage needs the parameter count m > 0, got {m}")
    first: dict = {}
    for row in rows:
        key = row.get("iter")
        if key not in first or row.get("rank", 0) < first[key].get("rank", 0):
            first[key] = row
    return sum(step_coverage(row, m) for row in first.values())


def trend(xs: Sequence[float], ys: Sequence[float], confidence: float = CONFIDENCE) -> dict | None:
    """Least-squares line of ``ys`` on ``xs``: {slope, se (standard error of the slope),
    noise (residual standard deviation), points, rising (slope - t * se > 0, t the
    two-sided ``confidence`` quantile of Student's t with points - 2 degrees of freedom)}.
    None with fewer than 3 points or all ``xs`` equal (no slope, or no error, to estimate)."""
    n = len(xs)
    if n != len(ys):
        raise ValueError(f"trend: {n} x values but {len(ys)} y values")
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    residuals = [y - my - slope * (x - mx) for x, y in zip(xs, ys)]
    noise = math.sqrt(sum(r * r for r in residuals) / (n - 2))
    se = noise / math.sqrt(sxx)
    from scipy.special import stdtrit  # Student's t quantile (scipy.stats takes 2 s to import)

    t = float(stdtrit(n - 2, 0.5 + confidence / 2))
    return {"slope": slope, "se": se, "noise": noise, "points": n, "t": t, "rising": slope - t * se > 0}


def accuracy_trend(epochs: Iterable[dict], key: str = "test_top1", part: float = TREND_PART) -> dict | None:
    """``trend`` of ``key`` per epoch over the last ``part`` of the recorded epochs (at
    least ``TREND_MIN_POINTS``; each epoch once, its last row), with ``from_epoch`` /
    ``to_epoch``; None when fewer epochs carry ``key``."""
    last = {e["epoch"]: e[key] for e in epochs if e.get(key) is not None and e.get("epoch") is not None}
    if len(last) < TREND_MIN_POINTS:
        return None
    ordered = sorted(last)
    window = ordered[-max(TREND_MIN_POINTS, math.ceil(len(ordered) * part)) :]
    fit = trend([float(e) for e in window], [float(last[e]) for e in window])
    if fit is not None:
        fit.update(from_epoch=window[0], to_epoch=window[-1])
    return fit


def summary_fields(rows: Iterable[dict], m: int, epochs: Iterable[dict] | None) -> dict:
    """What a training run's ``summary.json`` carries: ``coverage`` (final), and with the
    epoch rows the test top-1 trend as flat fields ``top1_trend_{slope,se,noise,points,
    from_epoch,to_epoch}`` (per epoch, as a fraction) and ``top1_still_rising`` (None
    when there are too few epochs to tell)."""
    out: dict = {"coverage": coverage(rows, m)}
    if epochs is None:
        return out
    fit = accuracy_trend(epochs)
    for name in ("slope", "se", "noise", "points", "from_epoch", "to_epoch"):
        out[f"top1_trend_{name}"] = None if fit is None else fit[name]
    out["top1_still_rising"] = None if fit is None else fit["rising"]
    return out
