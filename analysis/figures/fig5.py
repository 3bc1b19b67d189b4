"""Fig. 5: convergence of dense vs Top-k vs gTop-k (both put-backs), training loss and top-1
test accuracy against iterations and against epochs, one line per training run (reducer,
put-back, rho, P), one row of panels per (model, P); the table beside it (final top-1 and
iterations to 99 % of dense's final top-1 at the same P); and the gap, measured: per
iteration, the coordinates the update touched, the residual's norm per worker and the
gradient mass the paper's put-back lost.

    python -m analysis.figures.fig5 runs/fig5_quick
    python -m analysis.figures.fig5 runs/fig5_density --dense-from runs/fig5_full --stem density

Writes into ``<first root>/analysis/`` (or ``--out``): ``<stem>.{png,pdf,csv}`` (the curves;
the CSV has every epoch of every run), ``<stem>_table.{csv,md}`` (seeds together: spread of
the final top-1, iterations to target per seed, coverage, trend), ``<stem>_gap.{png,pdf,csv}``
(per-iteration diagnostics) and ``gap_coverage.{png,pdf,csv}`` (``<stem>_gap_coverage`` for
another stem: the gap to dense against coverage, ``analysis.figures.gapcov``). Epochs of runs
still training count.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from analysis.common import model_rank, out_dir, parser, save
from analysis.figures.curves import load_curves, load_gap, markdown, table
from analysis.figures.gapcov import gap_coverage, plot_gap_coverage
from analysis.training import DENSE

METRICS = (("train_loss", "training loss"), ("test_top1", "top-1 test accuracy"))
AXES = (("iterations", "iterations"), ("epoch", "epoch"))
GAP_PANELS = (
    ("update_nnz", "coordinates the update touched", "log"),
    ("residual_norm", "residual L2 norm per worker (median, min-max)", "log"),
    ("lost_l1", "gradient L1 lost by the paper's put-back", "log"),
)


def _rows(frame: pd.DataFrame) -> list[tuple[str, int]]:
    pairs = {(m, int(p)) for m, p in zip(frame["model"], frame["nodes"])}
    return sorted(pairs, key=lambda mp: (model_rank(mp[0]), mp[1]))


def _colours(labels) -> dict[str, tuple]:
    import seaborn as sns

    names = sorted({lab.rsplit(" P=", 1)[0] for lab in labels})
    return dict(zip(names, sns.color_palette("colorblind", len(names))))


def seed_band(runs: pd.DataFrame, x: str, metric: str) -> tuple[pd.Series, pd.Series, pd.Series, int]:
    """One curve's runs (its seeds) -> the mean of ``metric`` over the seeds at each epoch,
    its min and max, each indexed by ``x`` (the first seed's iterations or the epoch), and
    the number of seeds. An epoch counts the seeds that recorded it (a run still training
    has fewer)."""
    by_epoch = runs.pivot_table(index="epoch", columns="run_dir", values=metric, aggfunc="first")
    where = runs.drop_duplicates("epoch").set_index("epoch", drop=False)[x].reindex(by_epoch.index)
    stats = [by_epoch.mean(axis=1), by_epoch.min(axis=1), by_epoch.max(axis=1)]
    return (*(st.set_axis(where.values) for st in stats), by_epoch.shape[1])


def plot_curves(curves: pd.DataFrame) -> plt.Figure:
    rows = _rows(curves)
    colours = _colours(curves["label"])
    panels = [(m, x) for x in AXES for m in METRICS]
    fig, axes = plt.subplots(len(rows), len(panels), figsize=(4.2 * len(panels), 3.2 * len(rows)), squeeze=False)
    for line, (model, nodes) in zip(axes, rows):
        g = curves[(curves["model"] == model) & (curves["nodes"] == nodes)]
        for ax, ((metric, title), (x, xlabel)) in zip(line, panels):
            for lab, runs in sorted(g.groupby("label"), key=lambda kv: kv[0]):
                mean, low, high, seeds = seed_band(runs, x, metric)
                colour = colours[lab.rsplit(" P=", 1)[0]]
                name = lab if seeds == 1 else f"{lab} ({seeds} seeds: mean, min-max)"
                ax.plot(mean.index, mean.values, lw=1.3, label=name, color=colour)
                if seeds > 1:
                    ax.fill_between(mean.index, low.values, high.values, alpha=0.2, color=colour, lw=0)
            if metric == "train_loss":
                ax.set_yscale("log")
            ax.set(xlabel=xlabel, ylabel=title)
            ax.set_title(f"{model}, P = {nodes}: {title}", fontsize=9)
            ax.grid(alpha=0.3)
        line[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    return fig


def plot_gap(gap: pd.DataFrame) -> plt.Figure:
    rows = _rows(gap)
    colours = _colours(gap["label"])
    fig, axes = plt.subplots(
        len(rows), len(GAP_PANELS), figsize=(4.6 * len(GAP_PANELS), 3.2 * len(rows)), squeeze=False
    )
    for line, (model, nodes) in zip(axes, rows):
        g = gap[(gap["model"] == model) & (gap["nodes"] == nodes)]
        for ax, (col, title, scale) in zip(line, GAP_PANELS):
            for _, run in sorted(g.groupby("run_dir"), key=lambda kv: kv[1]["label"].iloc[0]):
                lab = run["label"].iloc[0]
                run = run.sort_values("iteration").dropna(subset=[col])
                if run.empty or not (run[col] > 0).any():
                    continue  # dense has no residual and loses nothing
                colour = colours[lab.rsplit(" P=", 1)[0]]
                ax.plot(run["iteration"], run[col], lw=1.0, label=lab, color=colour)
                if col == "residual_norm":
                    ax.fill_between(
                        run["iteration"], run["residual_norm_min"], run["residual_norm_max"], alpha=0.2, color=colour
                    )
            ax.set_yscale(scale)
            ax.set(xlabel="iteration", ylabel=col)
            ax.set_title(f"{model}, P = {nodes}: {title}", fontsize=9)
            ax.grid(alpha=0.3)
        handles = {h.get_label(): h for ax in line for h in ax.get_lines()}
        line[-1].legend(handles.values(), handles.keys(), fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__.split("\n\n")[0])
    ap.add_argument("--stem", default="fig5", help="output file name stem (default fig5)")
    ap.add_argument(
        "--dense-from", nargs="+", default=[], metavar="ROOT", help="folders whose dense runs join as the baseline"
    )
    args = ap.parse_args(argv)
    if args.wandb:
        raise SystemExit(
            "analysis.figures.fig5 reads run directories only (--wandb is not supported): pass their folders"
        )
    curves = load_curves(args.roots)
    if args.dense_from:
        extra = load_curves(args.dense_from)
        curves = pd.concat([curves, extra[extra["reducer"].isin(DENSE)]], ignore_index=True) if len(extra) else curves
    if curves.empty:
        raise SystemExit(f"no training epochs (epochs.jsonl) under {' '.join(args.roots)}")
    folder = out_dir(args.roots, args.out)
    save(plot_curves(curves), curves.sort_values(["model", "nodes", "label", "epoch"]), folder, args.stem)
    tab = table(curves)
    save(None, tab, folder, f"{args.stem}_table")
    (folder / f"{args.stem}_table.md").write_text(markdown(tab))
    print(f"wrote {folder / f'{args.stem}_table.md'}\n\n{markdown(tab)}")
    points = gap_coverage(curves)
    if not points.empty:
        name = "gap_coverage" if args.stem == "fig5" else f"{args.stem}_gap_coverage"
        save(plot_gap_coverage(points), points, folder, name)
    gap = load_gap(args.roots)
    if not gap.empty:
        save(plot_gap(gap), gap, folder, f"{args.stem}_gap")


if __name__ == "__main__":
    main()
