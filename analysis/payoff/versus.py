"""Every reducer against every payoff baseline, per trained P and network: the map's answer
cell by cell, with the source of each t_iter (``payoff_versus.{csv,md}`` of ``analysis.payoff``).

For each setup, trained P (never a borrowed one), network, compute profile and target, each
reducer that is not a payoff baseline (at its best trained density: ``payoff_best.csv``) is put
against each payoff baseline (``analysis.reducers.payoff_baselines``: DDP, DDP-fp16, PowerSGD)
that has a row there. ``ratio`` = the baseline's time to target / the reducer's (above 1: the
reducer is sooner); ``verdict`` says it only where it holds across the seeds (as
``analysis.payoff.verdict``): ``level`` where the two times are within ``verdict.LEVEL`` of each
other (dense against DDP: the same runs, t_iter apart by microseconds), else ``sooner`` where the
reducer's slowest seed beats the baseline's fastest, ``later`` the other way round, else ``within
the noise`` (with one seed on either side the plain comparison, its ``sooner`` or ``later`` marked
``, one seed: no noise band``); where either has no time,
the status that says why (``Top-k budget-limited``, ``PowerSGD no run``). ``t_iter_source`` and
``baseline_t_iter_source``: measured (a benchmark job, e.g. ``make validate-model``'s) or
modelled. Pure functions of payoff's tables; nothing here is collective.
"""

from __future__ import annotations

import math

import pandas as pd

from analysis.payoff.verdict import LEVEL, SETUP, no_band, spread
from analysis.reducers import display, payoff_baselines

KEYS = SETUP + ["nodes", "network", "compute_profile", "target"]


def _state(r: pd.Series) -> str | None:
    """None where the row has a time to target, else why not."""
    ok = r["status"] == "reached" and not math.isnan(r["time_to_target"])
    return None if ok else f"{display(r['reducer'])} {r['status']}"


def versus(best: pd.DataFrame) -> pd.DataFrame:
    """One row per (cell, reducer, payoff baseline) of ``best`` (payoff_best.csv's rows),
    trained P only; see the module docstring."""
    bases = payoff_baselines()
    best = best[~best["borrowed"].astype(bool) & (best["status"] != "no run")]
    lo, hi = spread(best)
    rows = []
    for key, g in best.groupby(KEYS, sort=True):
        for _, mine in g[~g["reducer"].isin(bases)].iterrows():
            for base in bases:
                theirs = g[g["reducer"] == base]
                if theirs.empty:
                    continue
                b = theirs.iloc[0]
                row = dict(zip(KEYS, key)) | {"bandwidth_gbps": mine["bandwidth_gbps"], "reducer": mine["reducer"]}
                row.update(rho=mine["rho"], baseline=base, seeds=mine["seeds"], baseline_seeds=b["seeds"])
                row.update(t_iter_source=mine["t_iter_source"], baseline_t_iter_source=b["t_iter_source"])
                why = _state(mine) or _state(b)
                if why is None:
                    i, j = mine.name, b.name
                    ratio = b["time_to_target"] / mine["time_to_target"]
                    word = "sooner" if hi[i] < lo[j] else "later" if hi[j] < lo[i] else "within the noise"
                    if abs(ratio - 1) < LEVEL:
                        word = f"level (within {LEVEL:.1%})"
                    elif word != "within the noise" and no_band(min(mine["seeds"], b["seeds"])):
                        word += ", one seed: no noise band"
                    row.update(ratio=ratio, verdict=word)
                else:
                    row.update(ratio=math.nan, verdict=why)
                rows.append(row)
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame, gbps: tuple[float, ...] = (0.1, 1.0, 10.0)) -> str:
    """The rows at the uncalibrated bandwidths ``gbps`` (the sweep's, at the calibrated alpha)
    and on every calibrated network, one line per (P, network, reducer, baseline)."""
    if table.empty:
        return "no reducer and payoff baseline both trained at one P\n"
    sweep = table["network"].isin([f"{g:g} Gbit/s" for g in gbps]) | ~table["network"].str.endswith(" Gbit/s")
    lines = [
        "| model | compute | target | P | network | reducer | against | ratio (its time / the reducer's) | "
        "across the seeds | t_iter (reducer / baseline) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in table[sweep].sort_values(["model", "compute_profile", "target", "nodes", "bandwidth_gbps"]).iterrows():
        ratio = "" if math.isnan(r["ratio"]) else f"{r['ratio']:.2f}x"
        seeds = f" ({r['seeds']:.0f} / {r['baseline_seeds']:.0f} seeds)"
        lines.append(
            f"| {r['model']} | {r['compute_profile']} | {r['target']} | {int(r['nodes'])} | {r['network']} | "
            f"{display(r['reducer'])} | {display(r['baseline'])} | {ratio} | {r['verdict']}{seeds} | "
            f"{r['t_iter_source']} / {r['baseline_t_iter_source']} |"
        )
    return "\n".join(lines) + "\n"
