"""Time breakdown: stacked t_compute / t_compr / t_commu (and the rest of the iteration:
update, flattening, checks, data) per model and reducer, the paper's gTop-k breakdown at 32 nodes
(breakdown.csv) beside it.

    python -m analysis.figures.breakdown runs/fig6_reproduce [--nodes 8] [--network PROFILE --model-nodes 32]

Measured bars are the jobs at ``--nodes`` workers (default: the largest P measured per
model). With ``--network``, a modelled bar per reducer at ``--model-nodes`` (default 32,
the paper's) adds the calibrated t_commu to that reducer's local times (see
``analysis.scaling``). Writes breakdown.{png,pdf,csv} into ``<first root>/analysis/``.

Communication is the time a step spent waiting for it: a reducer that overlaps its all-reduce with
backward (DDP) records as t_commu only the part backward could not hide (timed by its
communication hook, see ``baselines.ddp``), so its measured bar stacks compute, that
exposed communication and the rest to its t_iter; ``t_commu_backward`` in the CSV is its
whole all-reduce window, hidden or not. Modelled bars do the same: an overlapping
reducer's bar shows as communication what its model leaves exposed (``predict_body``: the
buckets still communicating when backward ends), and ``t_commu_total`` the predicted
all-reduce time.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from analysis.common import model_rank, out_dir, panels, parser, save
from analysis.figures.fig6 import labelled_jobs
from analysis.reducers import ordered
from analysis.scaling import SETUP, modelled, rest_of_iteration
from gtopk import paper
from gtopk.perf.netprofile import NetworkProfile

PARTS = ("t_compute", "t_compr", "t_commu", "t_other")
COLOURS = {"t_compute": "#4c72b0", "t_compr": "#dd8452", "t_commu": "#c44e52", "t_other": "#bbbbbb"}
LABELS = {
    "t_compute": "compute",
    "t_compr": "compression (top-k)",
    "t_commu": "communication (not hidden by compute)",
    "t_other": "rest (update, flatten, checks, data)",
}


def measured_bars(jobs: pd.DataFrame, nodes: int | None) -> pd.DataFrame:
    """Median times per (setup, reducer) at ``nodes`` (or each model's largest P)."""
    rows = []
    for key, g in jobs.groupby(SETUP, dropna=False, sort=True):
        P = nodes if nodes is not None else int(g["nodes"].max())
        for red, r in g[g["nodes"] == P].groupby("reducer"):
            row = dict(zip(SETUP, key))
            row.update(
                reducer=red,
                nodes=P,
                kind="measured",
                **{k: float(r[k].median()) for k in ("t_compute", "t_compr", "t_commu", "t_iter")},
            )
            if "t_commu_backward" in r:  # jobs that summarised it (DDP's all-reduce window)
                row["t_commu_backward"] = float(r["t_commu_backward"].median())
            row["t_other"] = rest_of_iteration(r) + float(r["t_data"].median())
            rows.append(row)
    return pd.DataFrame(rows)


def modelled_bars(jobs: pd.DataFrame, net: NetworkProfile, nodes: int, local_from: int) -> pd.DataFrame:
    """Predicted bars; communication shown is the part of t_iter the other parts leave
    (all of t_commu, or for a reducer that overlaps it with backward what sticks out)."""
    m = modelled(jobs, net, nodes=[nodes], local_from=local_from)
    m["t_other"] = m["t_update"] + m["t_data"]
    m["t_commu_total"] = m["t_commu"]
    m["t_commu"] = (m["t_iter"] - m[["t_compute", "t_compr", "t_other"]].sum(axis=1)).clip(lower=0.0)
    cols = ["t_compute", "t_compr", "t_commu", "t_other", "t_iter", "t_commu_total"]
    return m[SETUP + ["reducer", "nodes", "kind", *cols]]


def paper_bars(models) -> pd.DataFrame:
    df = pd.DataFrame(paper.rows(paper.BREAKDOWN))
    df = df[df["model"].isin(list(models))].rename(columns={f"{k}_s": k for k in ("t_compute", "t_compr", "t_commu")})
    df["t_other"] = 0.0
    df["t_iter"] = df["t_compute"] + df["t_compr"] + df["t_commu"]
    df["kind"] = "paper"
    return df


def plot(bars: pd.DataFrame) -> plt.Figure:
    models = sorted(bars["model"].unique(), key=model_rank)
    fig, axes = panels(len(models), max(4.0, 1.0 + 1.0 * bars.groupby("model").size().max()), 4.2)
    for ax, model in zip(axes, models):
        g = bars[bars["model"] == model]
        order = []
        for kind in ("measured", "modelled", "paper"):
            k = g[g["kind"] == kind]
            order += [k[k["reducer"] == r].iloc[0] for r in ordered(k["reducer"])]
        # a label's settings on lines of their own (gtopk / selection=sampled): the bars are narrow
        labels = [f"{r['reducer'].replace(' ', chr(10))}\nP={int(r['nodes'])}\n{r['kind']}" for r in order]
        bottom = [0.0] * len(order)
        for part in PARTS:
            vals = [float(r[part]) for r in order]
            ax.bar(range(len(order)), vals, bottom=bottom, color=COLOURS[part], label=LABELS[part])
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_xticks(range(len(order)), labels, fontsize=7)
        ax.set_ylabel("seconds per iteration")
        ax.set_title(model)
        ax.grid(axis="y", alpha=0.3)
    axes[min(1, len(axes) - 1)].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, help="P of the measured bars (default: largest per model)")
    ap.add_argument(
        "--network", help="network profile (gtopk.perf.netbench's profile.json, or `paper`) for modelled bars"
    )
    ap.add_argument("--model-nodes", type=int, default=32, help="P of the modelled bars (default 32)")
    ap.add_argument("--local-from", type=int, default=1, help="P of the jobs whose local times feed the model")
    args = ap.parse_args(argv)
    jobs = labelled_jobs(args)  # a bar per reducer label (gtopk selection=sampled: its own)
    parts = [measured_bars(jobs, args.nodes)]
    if args.network:
        parts.append(modelled_bars(jobs, NetworkProfile.load(args.network), args.model_nodes, args.local_from))
    parts.append(paper_bars(jobs["model"].unique()))
    bars = pd.concat(parts, ignore_index=True)
    save(plot(bars), bars, out_dir(args.roots, args.out), "breakdown")


if __name__ == "__main__":
    main()
