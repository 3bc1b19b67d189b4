"""The gap to dense against coverage along training, for several training budgets at once.

    python -m analysis.figures.budgets grid=analysis/results/fig5_scale/runs \\
        paper_length=analysis/results/fig5_paper_length/runs runs/fig5_paper_length \\
        [--nodes 4 32] [--reducers gtopk gtopk_exact topk] [--out DIR] [--stem fig5_budgets]

Each argument is ``LABEL=FOLDER`` (a budget: the training runs under FOLDER) or a bare FOLDER
(more runs of the budget before it; a run found twice, archived and in progress, counts
once: the one with more epochs). For every sparse run, the gap to dense (top-1 points) at
each of its epochs against dense's run of the same seed and budget at the same epoch
(``gapcov.gap_coverage``), against the coverage so far (log x): a panel per P, a colour per
reducer setting, a line style per budget; seeds are thin lines, and a run still training
(no ``summary.json`` yet) is drawn dotted and named so in the CSV (``state``). Runs of other
settings than the budget's dense ones are left out by ``gap_coverage`` (same model, data,
image size, batch per worker and P).

Outputs in ``--out`` (default ``<first folder>/analysis``): ``<stem>.{png,pdf,csv}``, one CSV
row per (run, epoch). Nothing here is collective.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from analysis.common import save
from analysis.figures.curves import load_curves
from analysis.figures.gapcov import gap_coverage
from analysis.reducers import display, palette
from gtopk.records.rundir import RunDir

STYLES = ("-", "--", "-.", ":")


def budgets(args: list[str]) -> dict[str, list[str]]:
    """``LABEL=FOLDER`` and bare ``FOLDER`` arguments as {label: folders}, in order."""
    out: dict[str, list[str]] = {}
    label = None
    for a in args:
        if "=" in a and not Path(a).exists():
            label, folder = a.split("=", 1)
            out.setdefault(label, []).append(folder)
        elif label is None:
            raise SystemExit(f"{a}: give the first folder a budget's label, e.g. grid={a}")
        else:
            out[label].append(a)
    return out


def _one_per_cell(curves: pd.DataFrame) -> pd.DataFrame:
    """Where the same run is found twice (archived, and in progress under runs/), the copy
    with the most epochs."""
    if curves.empty:
        return curves
    key = ["model", "data", "image_size", "nodes", "batch", "label", "seed"]
    size = curves.groupby("run_dir")["epoch"].transform("max")
    best = curves.assign(_n=size).sort_values("_n").groupby(key, dropna=False)["run_dir"].transform("last")
    best = best.reindex(curves.index)
    return curves[curves["run_dir"] == best].reset_index(drop=True)


def points(
    folders: dict[str, list[str]], nodes: list[int] | None = None, reducers: list[str] | None = None
) -> pd.DataFrame:
    """Per budget, ``gap_coverage``'s per-epoch points, with ``budget``, ``state``
    (finished or training) and the run's ``epochs`` so far."""
    parts = []
    for label, roots in folders.items():
        curves = _one_per_cell(load_curves(roots))
        if curves.empty:
            continue
        if nodes:
            curves = curves[curves["nodes"].isin(nodes)]
        got = gap_coverage(curves)
        if got.empty:
            continue
        got = got[~got["final"] & (got["curve"].isin(reducers) if reducers else True)].copy()
        got["budget"] = label
        got["state"] = got["run_dir"].map(lambda d: "finished" if RunDir(Path(d)).is_finished else "training")
        got["epochs"] = got.groupby("run_dir")["epoch"].transform("max") + 1
        parts.append(got)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def plot(pts: pd.DataFrame) -> plt.Figure:
    """A panel per P: gap (points) against coverage (log x), colour per reducer setting,
    line style per budget, dotted where the run is still training."""
    Ps = sorted(pts["nodes"].unique())
    colours = palette(pts["curve"].unique())
    styles = {b: STYLES[i % len(STYLES)] for i, b in enumerate(pts["budget"].unique())}
    with plt.rc_context({"font.size": 9, "legend.fontsize": 8}):
        fig, axes = plt.subplots(1, len(Ps), figsize=(5.2 * len(Ps), 4.2), squeeze=False, sharey=True)
        for ax, P in zip(axes[0], Ps):
            mine = pts[pts["nodes"] == P]
            for (budget, curve, _), run in mine.groupby(["budget", "curve", "run_dir"]):
                run = run.sort_values("coverage")
                training = run["state"].iloc[0] == "training"
                ax.plot(
                    run["coverage"], 100 * run["gap"], color=colours[curve], lw=1.0, alpha=0.8,
                    ls=":" if training else styles[budget],
                )  # fmt: skip
            ax.axhline(0, color="grey", lw=0.8)
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(plt.NullFormatter())
            ax.set(title=f"P = {P}", xlabel="coverage so far (sum over iterations of update_nnz / m)")
            ax.grid(alpha=0.3, which="both")
        axes[0][0].set_ylabel("gap to dense at the same epoch: top-1 points")
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], color=c, label=display(n)) for n, c in colours.items()]
        handles += [Line2D([], [], color="k", ls=s, label=f"budget: {b}") for b, s in styles.items()]
        if (pts["state"] == "training").any():
            handles.append(Line2D([], [], color="k", ls=":", label="still training (so far)"))
        axes[0][-1].legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
        fig.suptitle("gap to dense against coverage along training, per training budget (a line per seed)")
        fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", help="LABEL=FOLDER (a budget) or FOLDER (more of the budget before it)")
    ap.add_argument("--nodes", nargs="*", type=int, default=[], help="the P to draw (default: every P found)")
    ap.add_argument("--reducers", nargs="*", default=[], help="the sparse reducers to draw (default: every one found)")
    ap.add_argument("--out", help="output folder (default: <first folder>/analysis)")
    ap.add_argument("--stem", default="fig5_budgets")
    args = ap.parse_args(argv)
    folders = budgets(args.folders)
    pts = points(folders, args.nodes, args.reducers)
    if pts.empty:
        raise SystemExit(
            "no sparse training run with a dense run of the same budget, P and seed in " + " ".join(args.folders)
        )
    out = Path(args.out) if args.out else Path(next(iter(folders.values()))[0]) / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    cols = ["budget", "nodes", "curve", "seed", "state", "epochs", "epoch", "iterations", "coverage", "top1"]
    cols += ["dense_top1", "gap", "run_dir"]
    save(plot(pts), pts[cols].sort_values(["budget", "nodes", "curve", "seed", "epoch"]), out, args.stem)
    print(f"wrote {out / args.stem}.png")


if __name__ == "__main__":
    main()
