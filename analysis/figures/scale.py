"""Fig. 5 at scale (``experiment=fig5_scale``): one table and two figures across P, from the
finished training runs of a grid of P x reducer x seed, on a partial grid too.

    python -m analysis.figures.scale runs/fig5_scale [--nodes 4 16 32] [--reducers dense topk ...]
        [--seeds 0 1 2] [--publish analysis/results/fig5_scale]

* ``fig5_scale.{png,pdf,csv}``: training loss and test top-1 against iterations, a row per P,
  every reducer, its seeds as a band (mean, min-max): ``analysis.figures.fig5.plot_curves``.
* ``fig5_scale_table.{csv,md}``: per P and reducer, ``curves.table``'s row (final top-1 mean
  and min-max over the seeds, seeds done, iterations to 99 % of dense's final top-1 at that P
  per seed, coverage, the trend at the end) with the gap to dense (top-1 points: per seed
  against dense's run of the same seed where it exists, ``gapcov.gap_coverage``; mean, min, max).
* ``fig5_scale_gap_coverage.{png,pdf,csv}``: that gap against the coverage, a colour per
  reducer, a marker per P, bars over the seeds.
* ``fig5_scale_cells.csv``: every cell of the expected grid (``--nodes`` x ``--reducers`` x
  ``--seeds``; default: what was found) with its state: ``finished``, ``running`` (epochs
  recorded, no summary yet), ``failed`` or ``missing``. Only finished runs are in the table
  and the figures; the markdown table ends with the cells that are not.

``--publish DIR`` copies the CSV, PNG and markdown files into DIR with ``provenance.md``: the
commit and machine that made them, the date, the cells done, and the commits and machines of
the runs (their ``summary.json``'s ``env``). Nothing here is collective.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from analysis.common import out_dir, parser, save
from analysis.figures.curves import load_curves, table
from analysis.figures.fig5 import plot_curves
from analysis.figures.gapcov import MARKERS, gap_coverage
from analysis.reducers import display, of_label, palette
from analysis.reproduce.publish import copy, machine, origin, run_origins, section, sections
from analysis.training import reducer_label
from gtopk.records.rundir import run_dirs

STEM = "fig5_scale"
ROOT = Path(__file__).resolve().parents[2]


def _curve(label: str, rho: str | None = None) -> str:
    """The reducer setting of a curve label: ``gtopk_exact rho=0.001 P=16`` -> ``gtopk_exact``;
    its ``rho=`` kept where it is not ``rho`` (the grid's): ``oktopk rho=0.02``."""
    words = str(label).split(" ")
    return " ".join(w for w in words if not w.startswith("P=") and not (w.startswith("rho=") and w[4:] == rho))


def _rho(label: str) -> str | None:
    return next((w[4:] for w in str(label).split(" ") if w.startswith("rho=")), None)


def _cell_setting(cfg: dict, grid_density: float | None) -> str:
    """A cell's reducer setting: its label's reducer and settings (``reducer_label``), with
    ``rho=`` where its density is not the grid's (``oktopk rho=0.02``), so that a variant of
    a reducer is a cell of its own, not a duplicate of the plain one."""
    setting = reducer_label(str(cfg["reducer_name"]), dict(cfg.get("reducer") or {}))
    density = cfg.get("density")
    return setting if density is None or density == grid_density else f"{setting} rho={density}"


def cells(roots: Sequence[str | Path], nodes=(), reducers=(), seeds=()) -> pd.DataFrame:
    """One row per (P, reducer, seed) of the grid: ``state`` (finished | running | failed |
    missing) and ``run_dir``; the grid is ``nodes`` x ``reducers`` x ``seeds``, each
    defaulting to the values found, plus any cell found outside it."""
    found = {}
    runs = [(d, d.read_config()) for d in run_dirs(roots) if d.config.exists()]
    densities = pd.Series([cfg.get("density") for _, cfg in runs], dtype=object).dropna()
    grid_density = densities.mode().iloc[0] if len(densities) else None  # the grid's: the commonest
    for d, cfg in runs:
        setting = _cell_setting(cfg, grid_density)
        key = (int(cfg["nodes"]), setting, None if cfg.get("seed") is None else int(cfg["seed"]))
        state = "finished" if d.is_finished else "failed" if d.has_failed else "running" if d.epochs.exists() else ""
        if state and (key not in found or state == "finished"):
            found[key] = (state, str(d.path))
    want_p = sorted({int(p) for p in nodes} or {k[0] for k in found})
    want_r = list(reducers) or sorted({k[1] for k in found}, key=lambda r: (of_label(r).plot_order, r))
    want_s = sorted({int(s) for s in seeds} or {k[2] for k in found if k[2] is not None})
    grid = [(p, r, s) for p in want_p for r in want_r for s in want_s]
    grid += sorted((k for k in found if k not in set(grid)), key=str)
    states = [found.get(key, ("missing", "")) for key in grid]
    return pd.DataFrame(
        [{"nodes": p, "reducer": r, "seed": s, "state": st, "run_dir": d} for (p, r, s), (st, d) in zip(grid, states)]
    )


def scale_table(curves: pd.DataFrame, points: pd.DataFrame, relative: float = 0.99) -> pd.DataFrame:
    """``curves.table`` of the finished runs, in P then plot order, with ``curve`` (the
    reducer setting), ``reducer_display`` and the gap to dense over the seeds (``gap_mean``,
    ``gap_min``, ``gap_max``: top-1 fractions; empty for dense and where P has no dense run)."""
    tab = table(curves, relative)
    rhos = tab["label"].map(_rho)
    grid_rho = rhos.mode().iloc[0] if rhos.notna().any() else None  # the grid's rho: the commonest
    tab.insert(tab.columns.get_loc("label") + 1, "curve", tab["label"].map(lambda lab: _curve(lab, grid_rho)))
    tab.insert(tab.columns.get_loc("curve") + 1, "reducer_display", tab["curve"].map(display))
    if not points.empty:
        ends = points[points["final"]].groupby(["nodes", "label"])["gap"].agg(["mean", "min", "max"])
        ends.columns = ["gap_mean", "gap_min", "gap_max"]
        tab = tab.merge(ends.reset_index(), on=["nodes", "label"], how="left")
    for col in ("gap_mean", "gap_min", "gap_max"):
        tab[col] = tab[col] if col in tab else float("nan")
    order = tab["curve"].map(lambda c: of_label(c).plot_order)
    return tab.assign(_o=order).sort_values(["model", "nodes", "_o", "curve"]).drop(columns="_o").reset_index(drop=True)


def gap_summary(points: pd.DataFrame) -> pd.DataFrame:
    """Per model, P and sparse reducer setting: the seeds, the mean final coverage and the gap
    to dense at the end of training (mean, min, max over the seeds; top-1 fractions)."""
    ends = points[points["final"]]
    agg = ends.groupby(["model", "nodes", "curve"]).agg(
        seeds=("seed", "nunique"),
        coverage=("coverage", "mean"),
        gap_mean=("gap", "mean"),
        gap_min=("gap", "min"),
        gap_max=("gap", "max"),
    )
    return agg.reset_index()


def plot_gap(summary: pd.DataFrame, width: float = 8.0) -> plt.Figure:
    """Gap to dense (top-1 points) against coverage (log x): a colour per reducer setting, a
    marker per P, a vertical bar over the seeds (min-max)."""
    colours = palette(summary["curve"].unique())
    marks = {p: MARKERS[i % len(MARKERS)] for i, p in enumerate(sorted(summary["nodes"].unique()))}
    with plt.rc_context({"font.size": 10, "legend.fontsize": 9}):
        fig, ax = plt.subplots(figsize=(width, 4.6))
        for _, r in summary.iterrows():
            low, high = 100 * (r["gap_mean"] - r["gap_min"]), 100 * (r["gap_max"] - r["gap_mean"])
            ax.errorbar(
                r["coverage"], 100 * r["gap_mean"], yerr=[[low], [high]], marker=marks[r["nodes"]], ms=7,
                color=colours[r["curve"]], capsize=3, lw=1.2, ls="none",
            )  # fmt: skip
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set(xlabel="coverage (sum over iterations of update_nnz / m)", ylabel="gap to dense: top-1 points")
        ax.grid(alpha=0.3, which="both")
        from matplotlib.lines import Line2D

        by_colour = [Line2D([], [], color=c, marker="o", ls="none", label=display(n)) for n, c in colours.items()]
        by_marker = [Line2D([], [], color="k", marker=m, ls="none", label=f"P = {p}") for p, m in marks.items()]
        ax.legend(handles=by_colour + by_marker, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
        ax.set_title("gap to dense at the end of training (seeds: mean, bar min-max)")
        fig.tight_layout()
    return fig


def _pct(x) -> str:
    return "" if pd.isna(x) else f"{100 * x:.1f}"


def markdown(tab: pd.DataFrame, grid: pd.DataFrame) -> str:
    """The table across P as markdown (top-1 in %), then the grid's cells not finished."""
    lines = [
        "| P | reducer | seeds done (which) | final top-1 %, mean (min-max) | gap to dense, points, mean (min-max) | "
        "iterations to 99 % of dense, per seed | coverage | top-1 at the end |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for _, r in tab.iterrows():
        top1 = f"{_pct(r['final_top1'])} ({_pct(r['final_top1_min'])}-{_pct(r['final_top1_max'])})"
        gap = "" if pd.isna(r["gap_mean"]) else f"{_pct(r['gap_mean'])} ({_pct(r['gap_min'])} to {_pct(r['gap_max'])})"
        cov = "" if pd.isna(r["coverage"]) else f"{r['coverage']:.3g}"
        per_seed = "" if pd.isna(r["iterations_to_target_per_seed"]) else r["iterations_to_target_per_seed"]
        lines.append(
            f"| {int(r['nodes'])} | {r['reducer_display']} | {r['runs']} ({r['seeds']}) | {top1} | {gap} | {per_seed} | {cov} | "
            f"{r['trend']} |"
        )
    rest = grid[grid["state"] != "finished"]
    done = f"{int((grid['state'] == 'finished').sum())} of {len(grid)} cells (P x reducer x seed) finished"
    lines += ["", done + (":" if len(rest) else ".")]
    for state, g in rest.groupby("state", sort=True):
        items = "; ".join(
            f"P = {p} {display(r)}: seed{'s' if len(s) > 1 else ''} {', '.join(str(x) for x in s['seed'])}"
            for (p, r), s in g.groupby(["nodes", "reducer"], sort=False)
        )
        lines.append(f"* {state}: {items}")
    return "\n".join(lines) + "\n"


def provenance(grid: pd.DataFrame) -> str:
    """provenance.md: the commit and machine of this analysis, the date, the cells done, and
    the commits and machines the finished runs record (``summary.json``'s ``env``), from
    ``analysis.reproduce.publish``'s ``origin`` and ``run_origins``."""
    o = origin()
    dirty = " with uncommitted changes" if o["dirty"] else ""
    made = run_origins(grid.loc[grid["state"] == "finished", "run_dir"])
    lines = [
        "# Provenance of the Fig. 5 at scale outputs",
        "",
        f"* made by `python -m analysis.figures.scale` at commit {o['commit']}{dirty}",
        f"* machine: {machine(o)}; {o['date']}",
        f"* cells: {int((grid['state'] == 'finished').sum())} of {len(grid)} finished "
        f"({', '.join(f'{n} {s}' for s, n in grid['state'].value_counts().sort_index().items())})",
        "* the runs were trained at (commit, host, CPU, CPUs):",
        *(f"  * {', '.join(r)}" for r in made),
    ]
    return "\n".join(lines) + "\n"


def publish(folder: Path, dest: Path, grid: pd.DataFrame, stem: str = STEM) -> list[Path]:
    """Copy this analysis's CSV, PNG and markdown files from ``folder`` to ``dest``, with
    ``provenance.md``; its sections (``## files``) of other files in ``dest`` are kept."""
    sources = {src.name: src for src in sorted(folder.glob(f"{stem}*")) if src.suffix in (".csv", ".png", ".md")}
    path = dest / "provenance.md"
    before = sections(path.read_text()) if path.exists() else []
    copied = copy(sources, dest)
    # the sections of files published beside these by another command (make payoff's) stay
    kept = [(f, b) for f, b in before if not set(f) & set(sources) and all((dest / n).exists() for n in f)]
    path.write_text("\n".join([provenance(grid), *(section(f, [b]) for f, b in kept)]))
    return [*copied, path]


def tables(roots: Sequence[str | Path], nodes=(), reducers=(), seeds=()) -> dict[str, pd.DataFrame]:
    """What the outputs hold, figures aside: ``grid`` (``cells``), ``curves`` (the finished
    runs' epochs), ``points`` (``gapcov.gap_coverage``), ``table`` (``scale_table``) and
    ``gap`` (``gap_summary``; empty without a sparse run beside a dense one)."""
    missing = [str(r) for r in roots if not Path(r).is_dir()]
    if missing:
        raise SystemExit(f"{missing[0]} is not a folder: give the folder of the grid's runs (e.g. runs/fig5_scale)")
    grid = cells(roots, nodes, reducers, seeds)
    if grid.empty:
        raise SystemExit(
            f"no training run under {' '.join(map(str, roots))}: train some first (make reproduce-scale, make reproduce-paper-length), or give their folder"
        )
    done = set(grid.loc[grid["state"] == "finished", "run_dir"])
    curves = load_curves(roots)
    curves = curves[curves["run_dir"].isin(done)] if len(curves) else curves
    if curves.empty:
        raise SystemExit(
            f"no finished training run under {' '.join(map(str, roots))}: train some (make reproduce-scale)"
        )
    points = gap_coverage(curves)
    gap = gap_summary(points) if not points.empty else pd.DataFrame()
    return {"grid": grid, "curves": curves, "points": points, "table": scale_table(curves, points), "gap": gap}


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", nargs="*", type=int, default=[], help="the grid's P (default: those found)")
    ap.add_argument("--reducers", nargs="*", default=[], help="the grid's reducers (default: those found)")
    ap.add_argument("--seeds", nargs="*", type=int, default=[], help="the grid's seeds (default: those found)")
    ap.add_argument("--publish", metavar="DIR", help="copy the CSV, PNG and markdown here, with provenance.md")
    ap.add_argument("--stem", default=STEM, help=f"the outputs' file names (default {STEM})")
    args = ap.parse_args(argv)
    stem = args.stem
    if args.wandb:
        raise SystemExit("analysis.figures.scale reads run directories only (--wandb is not supported)")
    out = tables(args.roots, args.nodes, args.reducers, args.seeds)
    folder = out_dir(args.roots, args.out)
    save(plot_curves(out["curves"]), out["curves"].sort_values(["model", "nodes", "label", "epoch"]), folder, stem)
    save(None, out["table"], folder, f"{stem}_table")
    text = markdown(out["table"], out["grid"])
    (folder / f"{stem}_table.md").write_text(text)
    save(None, out["grid"], folder, f"{stem}_cells")
    if not out["gap"].empty:
        save(plot_gap(out["gap"]), out["gap"], folder, f"{stem}_gap_coverage")
    print(f"wrote {folder / f'{stem}_table.md'}\n\n{text}")
    if args.publish:
        for p in publish(folder, Path(args.publish), out["grid"], stem):
            print(f"published {p}")


if __name__ == "__main__":
    main()
