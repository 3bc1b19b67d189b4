"""The payoff map of ``analysis.payoff``: per setup (model, data, batch) and compute
profile, one heatmap per (density, target) over P (columns) x network (rows: the
calibrated profiles, then the bandwidth sweep). A cell names the reducer that reaches the
target soonest and its speedup over DDP, coloured by that speedup (log scale, white = 1x,
blue = faster than DDP, red = slower: only DDP or dense reach it); grey cells say why there is
no answer: ``no run`` (no training run at that P), ``budget-limited`` (no run reached the
target, and they stopped while still rising or below coverage 5: ``analysis.payoff.cells``),
``not reached`` (no run reached the target), ``no time`` (no t_iter: the compute profile lacks
the model). ``~`` marks a cell whose iterations are borrowed from another P (``--borrow``);
``(noise)`` a cell whose fastest reducer is within the noise of the seeds of the next
(``analysis.payoff.verdict``), ``(1 seed)`` one where a reducer had a single seed (a plain
comparison, no noise band). The first row of panels is each reducer at its best trained
density (``payoff_best.csv``), its cells naming the rho picked."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.payoff.verdict import MODELS, SETUP, no_band  # noqa: E402
from analysis.reducers import reference_display, short  # noqa: E402

GREY = {"no run": 0.80, "budget-limited": 0.72, "not reached": 0.65, "no time": 0.90}
SPAN = 3.0  # colour scale: log2(speedup) in [-SPAN, SPAN]


def cell_text(c: pd.Series) -> str:
    if c["state"] != "ok":
        return ("~" if c["borrowed"] else "") + c["state"].replace(" ", "\n").replace("-", "-\n")
    name = short(c["fastest"])
    if not pd.isna(c.get("fastest_rho", math.nan)):
        name += f" {c['fastest_rho']:g}"
    text = f"{name}\nno {reference_display()}" if math.isnan(c["speedup"]) else f"{name}\n{c['speedup']:.2g}x"
    if not c.get("separated", True):
        text += "\n(noise)"
    elif no_band(c.get("min_seeds", 2)):
        text += "\n(1 seed)"
    return ("~" if c["borrowed"] else "") + text


def panel(ax: plt.Axes, cells: pd.DataFrame, title: str, labels: bool = True) -> matplotlib.image.AxesImage:
    """One heatmap: rows networks (calibrated first, then by bandwidth), columns P."""
    nets = cells.drop_duplicates("network").sort_values(["calibrated", "bandwidth_gbps"], ascending=[False, True])
    nodes = sorted(cells["nodes"].unique())
    value = np.full((len(nets), len(nodes)), np.nan)
    rgb = np.ones((len(nets), len(nodes), 3))
    where = {(n, int(p)): (i, j) for i, n in enumerate(nets["network"]) for j, p in enumerate(nodes)}
    cmap = plt.get_cmap("RdBu")
    for _, c in cells.iterrows():
        i, j = where[(c["network"], int(c["nodes"]))]
        if c["state"] != "ok":
            rgb[i, j] = GREY[c["state"]]
        elif not math.isnan(c["speedup"]):
            value[i, j] = float(np.clip(math.log2(c["speedup"]), -SPAN, SPAN))
            rgb[i, j] = cmap(0.5 + value[i, j] / (2 * SPAN))[:3]
        dark = not math.isnan(value[i, j]) and abs(value[i, j]) >= 2  # 4x or more either way
        ax.text(j, i, cell_text(c), ha="center", va="center", fontsize=5.5, color="white" if dark else "black")
    ax.imshow(rgb, aspect="auto")
    image = ax.imshow(value, aspect="auto", cmap=cmap, vmin=-SPAN, vmax=SPAN, alpha=0.0)
    ax.set_xticks(range(len(nodes)), [str(int(p)) for p in nodes])
    ax.set_yticks(range(len(nets)), list(nets["network"]) if labels else [])
    ax.set_xlabel("workers P")
    ax.set_title(title, fontsize=9)
    return image


def plot(cells: pd.DataFrame, name: str, best: pd.DataFrame | None = None) -> plt.Figure:
    """The map of one setup and compute profile: rows densities (first, with ``best``,
    each reducer at its best trained density), columns targets."""
    densities, targets = sorted(cells["density"].unique()), sorted(cells["target"].unique())
    if best is not None and not best.empty:
        cells = pd.concat([best.assign(density=-1.0), cells], ignore_index=True)
        densities = [-1.0, *densities]
    n_nodes, n_nets = cells["nodes"].nunique(), cells["network"].nunique()
    fig, axes = plt.subplots(
        len(densities),
        len(targets),
        figsize=(0.75 * n_nodes * len(targets) + 2.5, (0.45 * n_nets + 1.6) * len(densities)),
        squeeze=False,
    )
    fig.subplots_adjust(hspace=0.55)  # a panel's title clear of the workers-P label above it
    image = None
    for row, d in zip(axes, densities):
        for col, (ax, t) in enumerate(zip(row, targets)):
            sel = cells[(cells["density"] == d) & (cells["target"] == t)]
            rho = "best rho per reducer" if d < 0 else f"rho {d:g}"
            image = panel(
                ax, sel, f"{name}, {rho}: fastest to {t}, speedup over {reference_display()}", labels=col == 0
            )
    bar = fig.colorbar(image, ax=axes, shrink=0.8, ticks=range(-int(SPAN), int(SPAN) + 1))
    bar.solids.set_alpha(1.0)
    bar.ax.set_yticklabels([f"{2.0**k:g}x" for k in range(-int(SPAN), int(SPAN) + 1)])
    bar.set_label(f"time to target: {reference_display()} / fastest")
    fig.text(
        0.01,
        1.0,
        "~: iterations borrowed from the nearest trained P (--borrow); grey: no run (no training run at that P), "
        "budget-limited (not reached, but stopped while rising or below coverage 5), "
        "not reached (no run reached the target), no time (no t_iter for this compute profile); "
        "(noise): within the seeds' spread of the next fastest; (1 seed): a plain comparison, no noise band",
        fontsize=7,
        va="bottom",
    )
    return fig


def write_maps(cells: pd.DataFrame, folder: Path, best: pd.DataFrame | None = None) -> list[Path]:
    """``payoff_<model>_<compute>.png`` per setup and compute profile (the setup's data and
    batch join the name when a model has several setups); ``best``: the cells of each
    reducer at its best density (``fastest`` of ``payoff_best.csv``), the maps' first row."""
    paths = []
    several = cells.drop_duplicates(SETUP).groupby("model").size()
    for key, g in cells.groupby(SETUP + ["compute_profile"], sort=True):
        model, data, batch, accum, comp = key
        setup = f"_{data}_b{batch}x{accum}" if several[model] > 1 else ""
        name = f"{MODELS.get(model, model)}{setup}, compute {comp}"
        path = folder / f"payoff_{model}{setup}_{Path(str(comp)).stem}.png"
        mine = None
        if best is not None and not best.empty:
            mine = best[
                (best[SETUP + ["compute_profile"]] == pd.Series(dict(zip(SETUP + ["compute_profile"], key)))).all(
                    axis=1
                )
            ]
        fig = plot(g, name, mine)
        fig.savefig(path, dpi=150, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths
