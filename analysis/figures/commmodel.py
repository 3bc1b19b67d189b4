"""Communication model check: measured against predicted t_commu over P, per model and
reducer (``gtopk.perf.model.compare``: the reducer class's alpha-beta formula with a
calibrated network profile).

    python -m analysis.figures.commmodel runs/fig6_reproduce --network runs/fig6_reproduce/net/emulated/profile.json

Jobs at P = 1 (no communication) are left out. A reducer that hides its communication in
backward (DDP) measures no separate t_commu: its rows keep the prediction, and the
figure shows the prediction only. Writes commmodel.{png,pdf,csv} into
``<first root>/analysis/`` (or --out).
"""

from __future__ import annotations

import sys

import matplotlib.pyplot as plt
import pandas as pd

from analysis.common import MARKERS, model_rank, out_dir, panels, parser, save
from analysis.figures.fig6 import labelled_jobs
from analysis.reducers import ordered, palette
from gtopk.perf.model import UnknownConfig, compare
from gtopk.perf.netprofile import NetworkProfile


def comparisons(jobs: pd.DataFrame, net: NetworkProfile) -> pd.DataFrame:
    """One row per job with P > 1: measured and predicted t_commu and t_iter."""
    rows = []
    for _, job in jobs[jobs["nodes"] > 1].iterrows():
        try:
            row = compare(job.to_dict(), {"reducer": job["reducer_cfg"]}, net)
        except UnknownConfig as e:  # a record naming no config of ours: left out, never loaded
            print(f"warning: skipping {job['run_dir']}: {e}", file=sys.stderr)
            continue
        row.update(name=job["name"], run_dir=job["run_dir"], network=net.name)
        rows.append(row)
    return pd.DataFrame(rows)


def plot(cmp: pd.DataFrame) -> plt.Figure:
    models = sorted(cmp["model"].unique(), key=model_rank)
    colours = palette(cmp["reducer"])
    fig, axes = panels(len(models), 4.6, 3.8)
    for ax, model in zip(axes, models):
        g = cmp[cmp["model"] == model]
        for i, red in enumerate(ordered(g["reducer"])):
            r = (
                g[g["reducer"] == red]
                .groupby("nodes")[["t_commu_measured", "t_commu_predicted"]]
                .median()
                .reset_index()
            )
            ax.plot(r["nodes"], r["t_commu_predicted"], linestyle="--", color=colours[red], label=f"{red} predicted")
            meas = r[r["t_commu_measured"] > 0]
            if not meas.empty:
                ax.plot(
                    meas["nodes"],
                    meas["t_commu_measured"],
                    linestyle="-",
                    marker=MARKERS[i % len(MARKERS)],
                    color=colours[red],
                    label=f"{red} measured",
                )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = sorted(g["nodes"].unique())
        ax.set_xticks(ticks, [str(int(t)) for t in ticks])
        ax.set_xlabel("workers P")
        ax.set_ylabel("t_commu per iteration (s)")
        ax.set_title(model)
        ax.grid(alpha=0.3, which="both")
    axes[min(1, len(axes) - 1)].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__.split("\n\n")[0])
    ap.add_argument("--network", required=True, help="network profile (gtopk.perf.netbench's profile.json, or `paper`)")
    args = ap.parse_args(argv)
    cmp = comparisons(labelled_jobs(args), NetworkProfile.load(args.network))
    if cmp.empty:
        raise SystemExit("no jobs with P > 1: nothing communicated")
    save(plot(cmp), cmp, out_dir(args.roots, args.out), "commmodel")


if __name__ == "__main__":
    main()
