"""The gap to dense against coverage: where each sparse reducer catches up.

For every training run whose update is not the exact average (``analysis.reducers.exact_rows``:
"dense" below is a run whose update is) and whose coverage is known (``gtopk.records.regime``:
the sum over iterations of ``update_nnz / m``), the gap is the dense top-1 minus the run's,
at the same model, data, image size, batch per worker and P: dense's run of the same seed
where there is one, else the mean of the dense runs' over their seeds (the CSV's
``dense_from`` says which). One point per run at the end of training (its
final top-1 against dense's final top-1, at its final coverage), and where the epochs carry
the coverage so far (``epochs.jsonl``'s ``coverage``) a line through the run's epochs, each
against dense at the same epoch. A run without a dense run at its P has no gap and is left out.

Written by ``analysis.figures.fig5`` as ``<stem>_gap_coverage.{png,pdf,csv}`` (called from
``make reproduce-fig5`` through it). Nothing here is collective.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from analysis.reducers import exact_rows

KEYS = ["model", "data", "image_size", "nodes", "batch"]
MARKERS = "osD^vP*X"


def _curve(label: str) -> str:
    """The sparse reducer of a curve label: ``gtopk putback=exact rho=0.001 P=4`` ->
    ``gtopk putback=exact``."""
    return " ".join(w for w in label.split(" ") if not w.startswith(("rho=", "P=")))


def _dense_top1(dense: pd.DataFrame, seed) -> tuple[pd.Series, str]:
    """Dense's top-1 per epoch (index) and where it comes from: the run of ``seed``, else
    the mean over the dense runs' seeds."""
    same = dense[dense["seed"] == seed] if not pd.isna(seed) else dense.iloc[0:0]
    if not same.empty:
        return same.groupby("epoch")["test_top1"].mean(), f"seed {int(seed)}"
    per_run = dense.groupby("run_dir")
    n = per_run.ngroups
    return dense.groupby("epoch")["test_top1"].mean(), f"mean of {n} dense run{'s' if n > 1 else ''}"


def gap_coverage(curves: pd.DataFrame) -> pd.DataFrame:
    """One row per (sparse run, point): ``final`` (True: the end of training, dense's final
    top-1 against the run's final; False: one epoch, against dense at that epoch),
    ``coverage``, ``top1``, ``dense_top1``, ``gap`` (= dense_top1 - top1), ``dense_from``,
    and the run's identity (``curve``: the reducer with its settings; ``density``, ``nodes``,
    ``seed``, ``label``, ``epoch``, ``iterations``)."""
    rows = []
    for _, group in curves.groupby(KEYS, sort=True, dropna=False):
        exact = exact_rows(group)
        dense = group[exact]
        if dense.empty:
            continue
        dense_final = dense.sort_values("epoch").groupby("run_dir").tail(1)
        for _, run in group[~exact].groupby("run_dir", sort=True):
            run = run.sort_values("epoch")
            last = run.iloc[-1]
            if pd.isna(last["coverage"]):
                continue
            per_epoch, source = _dense_top1(dense, last["seed"])
            finals = dense_final[dense_final["seed"] == last["seed"]] if source.startswith("seed") else dense_final
            head = {k: last[k] for k in (*KEYS, "reducer", "density", "seed", "label", "run_dir")}
            head.update(curve=_curve(last["label"]), dense_from=source)
            dense_end = float(finals["test_top1"].mean())
            rows.append(
                {**head, "final": True, "epoch": int(last["epoch"]), "iterations": int(last["iterations"])}
                | {"coverage": float(last["coverage"]), "top1": float(last["test_top1"]), "dense_top1": dense_end}
            )
            for _, e in run.dropna(subset=["epoch_coverage"]).iterrows():
                if int(e["epoch"]) in per_epoch.index:
                    rows.append(
                        {**head, "final": False, "epoch": int(e["epoch"]), "iterations": int(e["iterations"])}
                        | {"coverage": float(e["epoch_coverage"]), "top1": float(e["test_top1"])}
                        | {"dense_top1": float(per_epoch[int(e["epoch"])])}
                    )
    out = pd.DataFrame(rows)
    if not out.empty:
        out["gap"] = out["dense_top1"] - out["top1"]
    return out


def plot_gap_coverage(points: pd.DataFrame) -> plt.Figure:
    """Gap to dense (top-1 points) against coverage (log x), one colour and marker per sparse
    reducer; the end-of-training points as markers labelled with rho and P (and the seed
    where a reducer has several), the epochs of each
    run as a thin line of the same colour."""
    import seaborn as sns

    curves = sorted(points["curve"].unique())
    colours = dict(zip(curves, sns.color_palette("colorblind", len(curves))))
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, curve in enumerate(curves):
        mine = points[points["curve"] == curve]
        for _, run in mine[~mine["final"]].groupby("run_dir"):
            run = run.sort_values("coverage")
            ax.plot(run["coverage"], 100 * run["gap"], lw=0.7, alpha=0.45, color=colours[curve])
        end = mine[mine["final"]]
        ax.scatter(
            end["coverage"],
            100 * end["gap"],
            marker=MARKERS[i % len(MARKERS)],
            color=colours[curve],
            label=curve,
            zorder=3,
        )
        several = end["seed"].nunique() > 1
        for _, r in end.iterrows():
            text = f"rho={r['density']:g} P={int(r['nodes'])}" if not pd.isna(r["density"]) else f"P={int(r['nodes'])}"
            text += f" s{int(r['seed'])}" if several and not pd.isna(r["seed"]) else ""
            ax.annotate(text, (r["coverage"], 100 * r["gap"]), fontsize=5.5, xytext=(3, 2), textcoords="offset points")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set(xlabel="coverage (sum over iterations of update_nnz / m)", ylabel="gap to dense: top-1 points")
    ax.set_title("gap to dense against coverage (markers: end of training; lines: per epoch)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
