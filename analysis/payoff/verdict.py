"""The answer of ``analysis.payoff`` per cell and in words: the fastest reducer to the
target in each (setup, density, P, network, compute profile, target), and one verdict line
per (setup, density, network, compute profile, target), from the trained P only (never a
borrowed one), e.g. ``ResNet-20, rho 0.001, 1 Gbit/s, compute p102: gTop-k reaches 99 % of
dense 1.8x sooner than DDP at P = 32; no gain below P = 8``."""

from __future__ import annotations

import math

import pandas as pd

MODELS = {"resnet20": "ResNet-20", "vgg16": "VGG-16", "alexnet": "AlexNet", "resnet50": "ResNet-50"}
REDUCERS = {
    "gtopk": "gTop-k",
    "gtopk_exact": "gTop-k exact",
    "topk": "Top-k",
    "dense": "dense",
    "ddp": "DDP",
    "ddp_fp16": "DDP-fp16",
    "powersgd": "PowerSGD",
}
BASELINE = "ddp"
#: the stronger baselines a verdict also names, when they were trained (DDP-fp16 is payoff.csv's second column)
ALSO_AGAINST = ("ddp_fp16", "powersgd")
SETUP = ["model", "data", "batch_per_worker", "grad_accum"]
CELL = SETUP + ["density", "nodes", "network", "compute_profile", "target"]
#: a cell's state when no reducer reaches the target, by priority
STATES = ("not reached", "no time", "no run")


def display(label: str) -> str:
    """A reducer label for people: ``gtopk putback=exact`` -> ``gTop-k putback=exact``."""
    name, *rest = label.split(" ")
    return " ".join([REDUCERS.get(name, name), *rest])


def short(label: str) -> str:
    """For a map cell: ``gtopk putback=exact`` -> ``gTop-k exact``."""
    name, *rest = label.split(" ")
    return " ".join([REDUCERS.get(name, name), *(r.split("=", 1)[-1] for r in rest)])


def fastest(df: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: ``state`` (ok, or the first of ``STATES`` any reducer has),
    ``fastest`` reducer and its ``speedup`` over DDP (NaN without a DDP time),
    ``borrowed`` (iterations from another P), bandwidth and whether calibrated."""
    rows = []
    for key, g in df.groupby(CELL, sort=True):
        row = dict(zip(CELL, key))
        row.update(bandwidth_gbps=g["bandwidth_gbps"].iloc[0], calibrated=bool(g["calibrated"].iloc[0]))
        row["borrowed"] = bool(g["borrowed"].any())
        ok = g[g["status"] == "ok"].dropna(subset=["time_to_target"])
        if ok.empty:
            row.update(state=next(s for s in STATES if (g["status"] == s).any()), fastest=None, speedup=math.nan)
        else:
            best = ok.loc[ok["time_to_target"].idxmin()]
            row.update(state="ok", fastest=best["reducer"], speedup=best["speedup_vs_ddp"])
            row["time_to_target"] = best["time_to_target"]
        rows.append(row)
    return pd.DataFrame(rows)


def _ps(values) -> str:
    return ", ".join(str(int(p)) for p in values)


def verdict(cells: pd.DataFrame, rows: pd.DataFrame) -> str:
    """One line for the cells (over P) of one setup, density, network, compute and target;
    ``rows`` are payoff.csv's rows of the same."""
    c0 = cells.iloc[0]
    head = f"{MODELS.get(c0['model'], c0['model'])}, rho {c0['density']:g}, {c0['network']}, compute {c0['compute_profile']}: "
    target = c0["target"]
    trained = cells[~cells["borrowed"] & (cells["state"] != "no run")].sort_values("nodes")
    missed = rows[(rows["status"] == "not reached") & ~rows["borrowed"]]
    tail = "".join(
        f"; {display(lab)} did not reach it at P = {_ps(sorted(set(g['nodes'])))}"
        for lab, g in missed.groupby("reducer", sort=True)
    )
    both = trained[(trained["state"] == "ok") & trained["speedup"].notna()]
    if both.empty:
        states = ", ".join(f"P = {int(c['nodes'])}: {c['state']}" for _, c in trained.iterrows()) or "no trained P"
        return f"{head}no P where DDP and another reducer both have a time to {target} ({states}){tail}"
    gain = (both["fastest"] != BASELINE) & (both["speedup"] > 1)
    if not gain.any():
        return f"{head}DDP reaches {target} soonest at every trained P ({_ps(both['nodes'])}){tail}"
    best = both[gain].loc[both[gain]["speedup"].idxmax()]
    text = (
        f"{head}{display(best['fastest'])} reaches {target} {best['speedup']:.1f}x sooner than DDP "
        f"{against(rows, best['fastest'], int(best['nodes']))}at P = {int(best['nodes'])}"
    )
    losing = both[~gain]["nodes"]
    if losing.empty:
        text += f"; a gain at every trained P ({_ps(both['nodes'])})"
    elif losing.max() < both[gain]["nodes"].min():
        text += f"; no gain below P = {int(both[gain]['nodes'].min())}"
    else:
        text += f"; no gain at P = {_ps(losing)}"
    return text + tail


def against(rows: pd.DataFrame, label: str, P: int) -> str:
    """``"and 1.4x as soon as DDP-fp16 and 0.9x as soon as PowerSGD "``: ``label``'s time to
    target at P against each of ``ALSO_AGAINST`` that has one there (their time / its time;
    nothing for a baseline without a time there, e.g. not trained)."""
    ok = rows[(rows["nodes"] == P) & (rows["status"] == "ok")].dropna(subset=["time_to_target"])
    mine = ok[ok["reducer"] == label]["time_to_target"]
    parts = []
    for other in ALSO_AGAINST:
        theirs = ok[ok["reducer"] == other]["time_to_target"]
        if other != label and not mine.empty and not theirs.empty:
            parts.append(f"{theirs.min() / mine.min():.1f}x as soon as {display(other)}")
    return "".join(f"and {p} " for p in parts)


def verdicts(df: pd.DataFrame, cells: pd.DataFrame) -> list[tuple[bool, str]]:
    """(calibrated network?, line) per setup, density, network, compute and target."""
    keys = SETUP + ["density", "network", "compute_profile", "target"]
    rows = dict(iter(df.groupby(keys, sort=False)))
    return [(bool(g["calibrated"].iloc[0]), verdict(g, rows[key])) for key, g in cells.groupby(keys, sort=False)]
