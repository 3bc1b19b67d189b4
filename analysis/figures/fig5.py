"""Fig. 5: convergence of dense vs Top-k vs gTop-k (both put-backs), training loss and top-1
test accuracy against iterations, one line per reducer setting (reducer, put-back, rho) with
its seeds as a band, one row of two panels per (model, P), one legend below; the table beside it (final top-1 and
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
from analysis.reducers import display, exact_rows, of_label, palette

METRICS = (("train_loss", "training loss"), ("test_top1", "top-1 test accuracy"))
GAP_PANELS = (
    ("update_nnz", "coordinates the update touched", "log"),
    ("residual_norm", "residual L2 norm per worker (median, min-max)", "log"),
    ("lost_l1", "gradient L1 lost by the paper's put-back", "log"),
)


def _rows(frame: pd.DataFrame) -> list[tuple[str, int]]:
    pairs = {(m, int(p)) for m, p in zip(frame["model"], frame["nodes"])}
    return sorted(pairs, key=lambda mp: (model_rank(mp[0]), mp[1]))


def _curve(label: str) -> str:
    """A curve label without its P (``gtopk rho=0.001 P=4`` -> ``gtopk rho=0.001``): one colour
    and one legend entry across the rows of P."""
    return label.rsplit(" P=", 1)[0]


def seed_band(runs: pd.DataFrame, x: str, metric: str) -> tuple[pd.Series, pd.Series, pd.Series, int]:
    """One curve's runs (its seeds) -> the mean of ``metric`` over the seeds at each epoch,
    its min and max, each indexed by ``x`` (the first seed's iterations or the epoch), and
    the number of seeds. An epoch counts the seeds that recorded it (a run still training
    has fewer)."""
    by_epoch = runs.pivot_table(index="epoch", columns="run_dir", values=metric, aggfunc="first")
    where = runs.drop_duplicates("epoch").set_index("epoch", drop=False)[x].reindex(by_epoch.index)
    stats = [by_epoch.mean(axis=1), by_epoch.min(axis=1), by_epoch.max(axis=1)]
    return (*(st.set_axis(where.values) for st in stats), by_epoch.shape[1])


def plot_curves(curves: pd.DataFrame, width: float = 8.0) -> plt.Figure:
    """Training loss (log) and test top-1 against iterations, one row of two panels per
    (model, P), a curve per reducer setting with its seeds as a band (mean, min-max); one
    legend below (display names, ``analysis.reducers``), a colour per reducer setting across
    the rows. ``width`` inches at 150 dpi: about 800 px wide in the README leaves 10 pt legible."""
    rows = _rows(curves)
    colours = palette(_curve(lab) for lab in curves["label"].unique())
    with plt.rc_context({"font.size": 10, "axes.titlesize": 10, "legend.fontsize": 9}):
        fig, axes = plt.subplots(len(rows), len(METRICS), figsize=(width, 2.9 * len(rows)), squeeze=False)
        handles = {}
        for line, (model, nodes) in zip(axes, rows):
            g = curves[(curves["model"] == model) & (curves["nodes"] == nodes)]
            for ax, (metric, title) in zip(line, METRICS):
                for lab, runs in sorted(g.groupby("label"), key=lambda kv: (of_label(kv[0]).plot_order, kv[0])):
                    mean, low, high, seeds = seed_band(runs, "iterations", metric)
                    colour = colours[_curve(lab)]
                    (h,) = ax.plot(mean.index, mean.values, lw=1.4, color=colour)
                    if seeds > 1:
                        ax.fill_between(mean.index, low.values, high.values, alpha=0.2, color=colour, lw=0)
                    handles.setdefault(display(_curve(lab)), h)
                if metric == "train_loss":
                    ax.set_yscale("log")
                ax.set(xlabel="iterations", ylabel=title)
                ax.set_title(f"{model}, P = {nodes}")
                ax.grid(alpha=0.3)
        seeds = curves.groupby(["label"])["run_dir"].nunique().max()
        note = " (seeds: mean, band min-max)" if seeds > 1 else ""
        fig.tight_layout()
        fig.legend(
            handles.values(), list(handles), loc="upper center", bbox_to_anchor=(0.5, 0.0),
            ncol=min(4, len(handles)), title=f"reducer{note}", frameon=False,
        )  # fmt: skip  # below the panels: save's bbox_inches="tight" keeps it
    return fig


def plot_gap(gap: pd.DataFrame) -> plt.Figure:
    rows = _rows(gap)
    colours = palette(_curve(lab) for lab in gap["label"].unique())
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
                colour = colours[_curve(lab)]
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
        curves = pd.concat([curves, extra[exact_rows(extra)]], ignore_index=True) if len(extra) else curves
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
