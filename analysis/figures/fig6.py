"""Fig. 6: scaling efficiency e(P) = v_P / v_1 against P, one panel per model (and setup),
one line per reducer label (a reducer at other settings than its yaml's, e.g. the sampled
threshold ``gtopk selection=sampled``, is a line of its own): measured solid, modelled dashed (calibrated alpha-beta model, see
``analysis.scaling``), the paper's values in grey.

    python -m analysis.figures.fig6 runs/fig6_reproduce --network runs/fig6_reproduce/net/emulated/profile.json

Writes fig6.png, fig6.pdf and fig6.csv (every point drawn, with ``kind`` = measured |
modelled | paper) into ``<first root>/analysis/`` (or --out). A modelled point that no
measured point of its line matches says why in ``why_modelled``: why ``make reproduce-fig6
FULL=1`` left that model's P ranks out (``analysis.memfit``: too little memory, or no job to
measure it by; the panel says it too), that they fit but no job finished, else ``not run``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from analysis import memfit
from analysis.common import MARKERS, jobs_or_exit, model_rank, out_dir, panels, parser, save
from analysis.reducers import ordered, palette
from analysis.scaling import SETUP, efficiencies, paper_efficiency
from analysis.training import reducer_label
from gtopk.perf.netprofile import NetworkProfile

PAPER_STYLE = {"color": "0.6", "linewidth": 1.0, "linestyle": ":", "markersize": 4}


def add_model_args(ap) -> None:
    """Options of the scripts that use measured and modelled efficiencies."""
    ap.add_argument(
        "--network",
        help="network profile for the modelled points: profile.json from "
        "gtopk.perf.netbench on the cluster the runs used, or `paper` (default: no model)",
    )
    ap.add_argument(
        "--baseline",
        help="reducers (comma-separated config names) whose P = 1 job gives v_1, the first found per setup "
        "(default: those whose update is the exact average, payoff baselines first: DDP, then dense)",
    )
    ap.add_argument(
        "--local-from", type=int, default=1, help="P of the jobs whose local times feed the model (default 1)"
    )
    ap.add_argument("--extend", default="16,32", help="P values modelled beyond the measured ones")


def labelled(jobs: pd.DataFrame) -> pd.DataFrame:
    """``jobs`` with each row's ``reducer`` its label (``analysis.training.reducer_label``:
    the config name and the settings that differ from its yaml, e.g. ``gtopk
    selection=sampled``), so that a reducer run at other settings is a line, row and bar of
    its own instead of joining the yaml's medians. A row without its reducer's config keeps
    its name."""
    jobs = jobs.copy()
    if "reducer_cfg" in jobs:
        jobs["reducer"] = [
            reducer_label(str(name), dict(cfg)) if isinstance(cfg, dict) and cfg else name
            for name, cfg in zip(jobs["reducer"], jobs["reducer_cfg"])
        ]
    return jobs


def labelled_jobs(args) -> pd.DataFrame:
    """The finished jobs the arguments name (``jobs_or_exit``), ``labelled``."""
    return labelled(jobs_or_exit(args))


def compute(args) -> pd.DataFrame:
    """Measured + modelled efficiencies for the arguments' runs, a line per reducer label."""
    net = NetworkProfile.load(args.network) if args.network else None
    extend = [int(p) for p in str(args.extend).split(",") if p]
    return efficiencies(labelled_jobs(args), net, args.baseline, args.local_from, extend)


def why_modelled(eff: pd.DataFrame, fit: pd.DataFrame) -> pd.DataFrame:
    """``eff`` with ``why_modelled`` (module docstring) from the memory decisions ``fit``
    (``memfit.read``); empty on every other row."""
    line = SETUP + ["reducer", "nodes"]
    seen = eff.loc[eff["kind"] == "measured", line].drop_duplicates().assign(_seen=True)
    measured = eff[line].merge(seen, on=line, how="left")["_seen"].eq(True).to_numpy()  # NaN keys match
    why = {
        (r["model"], int(r["nodes"])): "its ranks fit (memfit), but no job finished"
        if bool(r["fits"])
        else f"left modelled by memfit: {memfit.short(r)}"
        for r in fit.to_dict("records")
    }
    eff = eff.copy()
    eff["why_modelled"] = [
        why.get((m, int(n)), "not run") if k == "modelled" and not s else ""
        for m, n, k, s in zip(eff["model"], eff["nodes"], eff["kind"], measured)
    ]
    return eff


def panel_title(key: tuple) -> str:
    s = dict(zip(SETUP, key))
    return f"{s['model']} ({s['cluster']}, compute {s['compute']})"


def plot(eff: pd.DataFrame, ref: pd.DataFrame, fit: pd.DataFrame | None = None) -> plt.Figure:
    """The figure: panels per setup (models in the paper's order), lines per reducer; in a
    panel, the P whose ranks ``fit`` (``memfit.read``) says did not fit, and why."""
    fit = memfit.read([]) if fit is None else fit
    setups = sorted(
        eff.groupby(SETUP, dropna=False, sort=True), key=lambda kg: model_rank(dict(zip(SETUP, kg[0]))["model"])
    )
    colours = palette(eff["reducer"])
    fig, axes = panels(len(setups), 4.6, 3.8)
    for ax, (key, g) in zip(axes, setups):
        model = dict(zip(SETUP, key))["model"]
        for i, red in enumerate(ordered(ref[ref["model"] == model]["reducer"])):
            p = ref[(ref["model"] == model) & (ref["reducer"] == red)].sort_values("nodes")
            ax.plot(p["nodes"], p["efficiency"], marker=MARKERS[i % len(MARKERS)], label=f"paper {red}", **PAPER_STYLE)
        for i, red in enumerate(ordered(g["reducer"])):
            for kind, style in (
                ("modelled", {"linestyle": "--", "linewidth": 1.2}),
                ("measured", {"linestyle": "-", "linewidth": 2.0, "marker": MARKERS[i % len(MARKERS)]}),
            ):
                p = g[(g["reducer"] == red) & (g["kind"] == kind)].sort_values("nodes")
                if not p.empty:
                    ax.plot(p["nodes"], p["efficiency"], color=colours[red], label=f"{red} ({kind})", **style)
        ax.set_xscale("log", base=2)
        ticks = sorted(set(g["nodes"]) | set(ref[ref["model"] == model]["nodes"]))
        ax.set_xticks(ticks, [str(int(t)) for t in ticks])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("workers P")
        ax.set_ylabel("scaling efficiency v_P / v_1")
        ax.set_title(panel_title(key), fontsize=10)
        seen = set(g[g["kind"] == "measured"]["nodes"])  # a P measured after all (an earlier run) needs no note
        out = fit[(fit["model"] == model) & ~fit["fits"].astype(bool) & ~fit["nodes"].isin(seen)].sort_values("nodes")
        notes = [f"P = {int(r['nodes'])} modelled only: {memfit.short(r)}" for r in out.to_dict("records")]
        if notes:
            ax.text(0.02, 0.02, "\n".join(notes), transform=ax.transAxes, fontsize=6, va="bottom", color="0.3")
        ax.grid(alpha=0.3)
    axes[min(1, len(axes) - 1)].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__.split("\n\n")[0])
    add_model_args(ap)
    args = ap.parse_args(argv)
    fit = memfit.read(args.roots)
    eff = why_modelled(compute(args), fit)
    ref = paper_efficiency(eff["model"].unique())
    save(plot(eff, ref, fit), pd.concat([eff, ref], ignore_index=True), out_dir(args.roots, args.out), "fig6")


if __name__ == "__main__":
    main()
